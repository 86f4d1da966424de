"""Text in, text out for a Hugging Face DeepSeek-V4 download: its tokenizer (tokenizer.json through
the Hugging Face `tokenizers` library, the optional extra `dsv4_vk[text]`), streamed decoding, and
chat prompts from the checkpoint's own prompt encoder (encoding/encoding_dsv4.py).

    from dsv4_vk.model import Model, Tokenizer, chat_prompt
    tok = Tokenizer.from_dir(path)
    ids = tok.encode(chat_prompt(path, [{"role": "user", "content": "Hi"}], trust_checkpoint_code=True),
                     bos=False)                     # the prompt encoder writes the bos text itself
    stream = tok.stream()
    for t in Model.load(path).generate(ids, 64, stop=tok.eos_ids):
        if t not in tok.eos_ids:
            print(stream.push(t), end="", flush=True)
    print(stream.flush())
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from ..vk.errors import path_problem
from .config import V4Config
from .tensor_files import CheckpointError

if TYPE_CHECKING:
    import tokenizers

INSTALL_HINT = "pip install 'dsv4_vk[text]'"
ENCODER_FILE = os.path.join("encoding", "encoding_dsv4.py")
REPLACEMENT = "\ufffd"          # what a decoder writes for bytes that are not (yet) whole UTF-8


def _tokenizers() -> Any:
    """The `tokenizers` module, imported on first use so that the package runs without it."""
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError(f"the text API (Tokenizer, `dsv4_vk generate`) needs the Hugging Face `tokenizers` "
                          f"library: {INSTALL_HINT}") from e
    return tokenizers


def _read_json(path: str, required: bool) -> Any:
    """A JSON file's value; None for an optional file that is not there."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        if required:
            raise CheckpointError(f"{path}: not found (a Hugging Face model directory has it)") from None
        return None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({path_problem(path, e)})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def _token_name(value: Any, file: str, key: str) -> str | None:
    # Hugging Face writes a special token either as its string or as an AddedToken dict
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    if isinstance(value, str):
        return value
    raise CheckpointError(f"{file}: {key} must be a token string or a {{\"content\": ...}} object, got {value!r}")


class Tokenizer:
    """A checkpoint's tokenizer: tokenizer.json's byte-level BPE and added tokens, the bos and eos
    tokens named in tokenizer_config.json, and generation_config.json's eos ids (stop ids too)."""

    def __init__(self, hf: "tokenizers.Tokenizer", bos_id: int | None, eos_ids: Iterable[int]):
        self.hf = hf
        self.bos_id = bos_id
        self.eos_ids = frozenset(eos_ids)
        # the largest id it can produce + 1 (added tokens may sit past the model's own vocabulary)
        self.vocab_size = max(hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "Tokenizer":
        path = os.fspath(path)
        lib = _tokenizers()
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise CheckpointError(f"{file}: not found; the text API needs the checkpoint's tokenizer.json "
                                  f"(a Hugging Face DeepSeek-V4 download has it)")
        try:
            hf = lib.Tokenizer.from_file(file)
        except Exception as e:                      # the library raises a bare Exception
            _read_json(file, True)                  # JSON that does not parse: say where
            raise CheckpointError(f"{file}: not a tokenizer the `tokenizers` library reads ({e})") from None

        cfg_file = os.path.join(path, "tokenizer_config.json")
        tc = _read_json(cfg_file, True)
        if not isinstance(tc, dict):
            raise CheckpointError(f"{cfg_file}: must hold a JSON object, got {type(tc).__name__}")

        def lookup(key: str) -> int | None:
            name = _token_name(tc.get(key), cfg_file, key)
            if name is None:
                return None
            tid = hf.token_to_id(name)
            if tid is None:
                raise CheckpointError(f"{cfg_file}: {key} {name!r} is not a token of {file}")
            return tid

        bos, eos = lookup("bos_token"), lookup("eos_token")
        eos_ids = set() if eos is None else {eos}
        gen_file = os.path.join(path, "generation_config.json")
        gen = _read_json(gen_file, False)
        if gen is not None:
            if not isinstance(gen, dict):
                raise CheckpointError(f"{gen_file}: must hold a JSON object, got {type(gen).__name__}")
            ids = gen.get("eos_token_id")
            ids = [] if ids is None else ids if isinstance(ids, list) else [ids]
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise CheckpointError(f"{gen_file}: eos_token_id must be a token id or a list of them, "
                                      f"got {gen.get('eos_token_id')!r}")
            eos_ids.update(ids)
        return cls(hf, bos, eos_ids)

    def check(self, cfg: V4Config) -> None:
        """Refuse a tokenizer whose ids the model has no rows for (another model's tokenizer)."""
        if self.vocab_size > cfg.vocab_size:
            raise CheckpointError(f"the tokenizer's ids reach {self.vocab_size - 1} (vocabulary of "
                                  f"{self.vocab_size}) but the model's vocab_size is {cfg.vocab_size}: "
                                  f"the tokenizer does not belong to this model")
        bad = sorted(i for i in self.eos_ids if i >= cfg.vocab_size)
        if bad:
            raise CheckpointError(f"eos ids {bad} are not below the model's vocab_size {cfg.vocab_size}")

    def encode(self, text: str, bos: bool = True) -> list[int]:
        """Token ids of `text`; special-token strings in it (as DeepSeek's prompts write them) become
        their single ids. The library's own post-processing is off and our bos is added only when
        asked: a chat prompt from chat_prompt already starts with the bos text."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if not bos:
            return list(ids)
        if self.bos_id is None:
            raise ValueError("this tokenizer has no bos token (tokenizer_config.json names none): encode(text, bos=False)")
        return [self.bos_id, *ids]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens written out; bytes that are not whole UTF-8 read as U+FFFD."""
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def stream(self) -> "TextStream":
        return TextStream(self.decode)


class TextStream:
    """Decodes tokens as they arrive. Byte-level BPE splits a multi-byte character across tokens,
    so the text of one token alone may be half a character: push holds it back until the tokens
    that complete it arrive. It decodes a window of ids (the standard prefix-offset technique):
    the text from `prefix` on, of which the part up to `read` was already returned; a window whose
    text ends in U+FFFD is incomplete and waits. The pushes and the flush add up to decode(all ids)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0        # the window starts here: a boundary where the text was whole
        self._read = 0          # ids before this have had their text returned

    def push(self, token_id: int) -> str:
        """The text that token_id completes ("" while a character is still incomplete)."""
        self._ids.append(int(token_id))
        done = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if len(text) > len(done) and not text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(done):]
        return ""

    def flush(self) -> str:
        """What is still held back (U+FFFD for bytes no token completed), as decode would write it."""
        done = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(done):]


_encoders: dict[tuple[str, int], Any] = {}


def _load_encoder(file: str) -> Any:
    """The encoder module, loaded by path under a name of its own (not through sys.path, where it
    could shadow or be shadowed by another module), once per version of the file."""
    key = (os.path.realpath(file), os.stat(file).st_mtime_ns)
    if key not in _encoders:
        name = f"dsv4_vk._checkpoint_encoder_{len(_encoders)}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise CheckpointError(f"{file}: cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module              # as `import` does: dataclasses and pickle look it up
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[name]
            raise CheckpointError(f"{file}: loading it failed: {type(e).__name__}: {e}") from e
        _encoders[key] = module
    return _encoders[key]


def checkpoint_encoder(path: str | os.PathLike, trust_checkpoint_code: bool = False) -> Any:
    """The checkpoint's prompt encoder, encoding/encoding_dsv4.py, as a module. That file is code
    from the download, so it is loaded only with trust_checkpoint_code=True."""
    file = os.path.join(os.fspath(path), ENCODER_FILE)
    if not os.path.isfile(file):
        raise CheckpointError(f"{file}: not found; chat prompts come from the checkpoint's own prompt encoder "
                              f"(DeepSeek-V4 downloads have it), which this package does not copy")
    if not trust_checkpoint_code:
        raise CheckpointError(f"{file} is Python code from the checkpoint, and chat prompts run it: pass "
                              f"trust_checkpoint_code=True (CLI: --trust-checkpoint-code) if you trust where "
                              f"the checkpoint came from")
    module = _load_encoder(file)
    if not callable(getattr(module, "encode_messages", None)):
        raise CheckpointError(f"{file}: has no encode_messages function")
    return module


def chat_prompt(path: str | os.PathLike, messages: Sequence[Mapping[str, Any]], thinking: bool = False,
                trust_checkpoint_code: bool = False) -> str:
    """The prompt text for `messages` ([{"role": "system" | "user" | "assistant", "content": ...}])
    as DeepSeek's own encoder in the checkpoint writes it: encoding/encoding_dsv4.py's
    encode_messages(messages, thinking_mode="thinking" if thinking else "chat"). That file is code
    from the download, so it runs only with trust_checkpoint_code=True. The text starts with the
    bos token's text: encode it with bos=False."""
    encoder = checkpoint_encoder(path, trust_checkpoint_code)
    # copies: the encoder may edit the messages it is given, the caller's stay as they are
    prompt = encoder.encode_messages([dict(m) for m in messages], thinking_mode=_mode(thinking))
    if not isinstance(prompt, str):
        raise CheckpointError(f"{encoder.__file__}: encode_messages returned {type(prompt).__name__}, not the "
                              f"prompt text")
    return prompt


def chat_reply(path: str | os.PathLike, text: str, thinking: bool = False,
               trust_checkpoint_code: bool = False) -> dict[str, Any]:
    """The assistant message of a reply's text (its eos not included), for the next chat_prompt: as
    the checkpoint's encoder parses a completion (parse_message_from_completion_text(text + its
    eos_token, thinking_mode): in thinking mode the reasoning goes to "reasoning_content"), or
    {"role": "assistant", "content": text} where the encoder has no parser or cannot parse the
    text (a reply cut off by the token limit inside its reasoning, say)."""
    encoder = checkpoint_encoder(path, trust_checkpoint_code)
    plain = {"role": "assistant", "content": text}
    parse, eos = getattr(encoder, "parse_message_from_completion_text", None), getattr(encoder, "eos_token", None)
    if not callable(parse) or not isinstance(eos, str):
        return plain
    try:
        message = parse(text + eos, thinking_mode=_mode(thinking))
    except Exception:               # the parser's own asserts and ValueErrors: text it does not read
        return plain
    if not isinstance(message, dict):
        raise CheckpointError(f"{encoder.__file__}: parse_message_from_completion_text returned "
                              f"{type(message).__name__}, not a message dict")
    return {**message, "role": "assistant"}


def _mode(thinking: bool) -> str:
    return "thinking" if thinking else "chat"
