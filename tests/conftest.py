import contextlib

import numpy as np
import pytest

from dsv4_vk.core.tuning import tuned
from dsv4_vk.vk import default_device


@pytest.fixture(scope="session")
def device():
    return default_device()


@pytest.fixture
def rng(request):
    # fresh inputs every run, but reproducible from the printed seed when a test fails
    seed = np.random.SeedSequence().entropy % (2**32)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def tune():
    """tune({"gemv.unroll": 2, ...}): set tuning knobs (dsv4_vk.core.tuning) for the rest of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda overrides=None, **kw: stack.enter_context(tuned(overrides, **kw))


@pytest.fixture(scope="session")
def text_ckpt(tmp_path_factory):
    """A Hugging Face-style checkpoint directory for the text tests (tests/text_checkpoint.py)."""
    from text_checkpoint import write_text_checkpoint
    return write_text_checkpoint(str(tmp_path_factory.mktemp("dsv4_text")))


@pytest.fixture(scope="session")
def text_tok(text_ckpt):
    from dsv4_vk.model import Tokenizer
    return Tokenizer.from_dir(text_ckpt)


@pytest.fixture(scope="session")
def chat_ckpt(text_ckpt, tmp_path_factory):
    """text_ckpt's tokenizer and encoder with a model whose replies encode back to their own ids."""
    from text_checkpoint import write_chat_checkpoint
    return write_chat_checkpoint(str(tmp_path_factory.mktemp("dsv4_chat") / "ck"), text_ckpt)
