import numpy as np
import pytest

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
