"""A conversation that feeds the model only what its decode cache has not seen (docs/model.md,
"Conversations").

    from dsv4_vk.model import Chat, Model, Tokenizer
    chat = Chat(Model.load(path), Tokenizer.from_dir(path), path, trust_checkpoint_code=True)
    for piece in chat.send("What is 2 + 2?"):
        print(piece, end="", flush=True)
    print(chat.last_turn)                           # tokens reused from the cache, prefilled, generated

Every turn renders the whole conversation with the checkpoint's own encoder (chat_prompt) and
encodes it. Where the ids the cache holds for this conversation (the prompts prefilled and every
sampled token fed back) are a prefix of the new prompt's ids, only the rest is prefilled, from the
current position; otherwise (the encoder rewrote earlier turns, the reply's text encodes to ids
other than those sampled, or the model ran something else since: Model.epoch moved) the model
starts over with the whole prompt.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator

from .runner import Model, Sampling
from .text import Tokenizer, chat_prompt, chat_reply, checkpoint_encoder


@dataclass(frozen=True)
class ChatTurn:
    """What one send() did: prompt tokens the cache already held (`reused`, 0: a full prefill) and
    those prefilled, tokens generated (a stop token included) and why the reply ended ("eos",
    "max_new_tokens", "context": the cache is full, "closed": the caller stopped taking text, ""
    while it streams), the prefill's and the decode's seconds."""
    reused: int
    prefilled: int
    generated: int = 0
    stop: str = ""
    prefill_s: float = 0.0
    decode_s: float = 0.0


class Chat:
    def __init__(self, model: Model, tokenizer: Tokenizer, path: str | os.PathLike, *, system: str | None = None,
                 thinking: bool = False, trust_checkpoint_code: bool = False, sampling: Sampling | None = None):
        """A conversation with `model` through the checkpoint at `path` (its tokenizer and its
        encoding/encoding_dsv4.py, which runs only with trust_checkpoint_code=True: refused here
        otherwise). system: a system message first; sampling: each reply's (None: greedy)."""
        if not isinstance(model, Model):
            raise ValueError(f"model must be a dsv4_vk.model.Model, got {type(model).__name__}")
        if not isinstance(tokenizer, Tokenizer):
            raise ValueError(f"tokenizer must be a dsv4_vk.model.Tokenizer, got {type(tokenizer).__name__}")
        if system is not None and not isinstance(system, str):
            raise ValueError(f"system must be a str or None, got {type(system).__name__}")
        if sampling is not None and not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling or None, got {type(sampling).__name__}")
        tokenizer.check(model.cfg)
        checkpoint_encoder(path, trust_checkpoint_code)        # refused now, not at the first send
        self.model, self.tokenizer, self.path = model, tokenizer, os.fspath(path)
        self.system, self.thinking, self.sampling = system, bool(thinking), sampling
        self.trust_checkpoint_code = trust_checkpoint_code
        self.last_turn: ChatTurn | None = None
        self._messages: list[dict[str, Any]] = []
        self._fed: list[int] | None = None      # the ids the cache holds for this conversation, if it does
        self._epoch = -1                        # model.epoch when _fed was last true
        self._sends = 0                         # advanced by send and reset: an older send's iterator is stale
        self.reset()

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far (the system message, then each finished turn's user and assistant
        messages), as copies."""
        return copy.deepcopy(self._messages)

    def reset(self) -> None:
        """Start the conversation over (the system message stays); the next send prefills it all."""
        self._messages = [] if self.system is None else [{"role": "system", "content": self.system}]
        self._fed = None
        self._sends += 1

    def send(self, user_text: str, max_new_tokens: int = 512,
             progress: Callable[[int, int], object] | None = None) -> Generator[str, None, None]:
        """Add the user message and stream the reply's text until an eos id or max_new_tokens (fewer
        where the cache fills up). The prompt is built and checked here, before the iterator is
        returned: a conversation past the model's max_ctx is a ValueError. The turn (the user
        message and the reply's text as an assistant message, chat_reply) joins `messages` when the
        iterator ends, or is closed: then with the text it gave so far. progress(done, total) is
        called as the prompt's new tokens run. The iterator belongs to the model's sequence as
        Model.generate's does: another use of the model while it streams makes it raise."""
        if not isinstance(user_text, str):
            raise ValueError(f"user_text must be a str, got {type(user_text).__name__}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer ≥ 1, got {max_new_tokens!r}")
        if progress is not None and not callable(progress):
            raise ValueError(f"progress must be a callable (done, total) or None, got {type(progress).__name__}")
        messages = self._messages + [{"role": "user", "content": user_text}]
        text = chat_prompt(self.path, messages, self.thinking, self.trust_checkpoint_code)
        ids = self.tokenizer.encode(text, bos=False)           # the encoder writes the bos text itself
        max_ctx = self.model.cfg.max_ctx
        if len(ids) > max_ctx:                                  # (its last position's logits give a token)
            raise ValueError(f"the conversation's prompt is {len(ids)} tokens ({len(messages)} messages), past "
                             f"the model's max_ctx of {max_ctx}: it leaves no room for a reply. reset() starts "
                             f"the conversation over; a model loaded with a larger max_ctx holds more")
        self._sends += 1
        # the last token sampled is not fed back, so a reply may reach one token past the cache
        return self._reply(self._sends, messages, ids, max_new_tokens, min(max_new_tokens, max_ctx - len(ids) + 1),
                           progress)

    def _reusable(self, ids: list[int]) -> int:
        """How many of `ids` the cache already holds for this conversation: all that was fed if it is
        a prefix of them, unchanged since (the model's epoch and position), else 0."""
        fed, model = self._fed, self.model
        if fed is None or model.epoch != self._epoch or model.position != len(fed) or len(fed) >= len(ids):
            return 0
        return len(fed) if ids[:len(fed)] == fed else 0

    def _reply(self, send: int, messages: list[dict[str, Any]], ids: list[int], asked: int, limit: int,
               progress: Callable[[int, int], object] | None) -> Generator[str, None, None]:
        if send != self._sends:
            raise RuntimeError("this send() iterator is stale: send() or reset() was called after it; call send() "
                               "again")
        reused = self._reusable(ids)
        self._fed = None                        # unknown until this turn ends where it should
        self.last_turn = ChatTurn(reused, len(ids) - reused)
        eos, stream = self.tokenizer.eos_ids, self.tokenizer.stream()
        tokens: list[int] = []
        t0 = time.perf_counter()
        t_first = t_last = t0
        gen = self.model.generate(ids[reused:], limit, self.sampling, stop=eos, progress=progress,
                                  continue_sequence=reused > 0)
        stop, held = "closed", -1
        try:
            while True:
                if tokens and self.model.epoch != held:       # (generate would raise too, naming itself)
                    raise RuntimeError("this send() iterator is stale: the model ran something else while the "
                                       "reply streamed (reset, generate, prefill, step, steps or set_sampling); "
                                       "its tokens would come from another sequence. Call send() again")
                t = next(gen, None)
                if t is None:
                    break
                held = self.model.epoch
                t_last = time.perf_counter()
                if not tokens:
                    t_first = t_last
                tokens.append(t)
                if t not in eos:
                    piece = stream.push(t)
                    if piece:
                        yield piece
            piece = stream.flush()
            if piece:
                yield piece
            stop = "eos" if tokens[-1] in eos else "max_new_tokens" if limit == asked else "context"
        except GeneratorExit:                   # the caller stopped taking text: the turn ends here
            pass
        except BaseException:                   # the turn is not recorded, the cache's content unknown
            gen.close()
            raise
        gen.close()                             # (a closed generate rewinds the steps it ran ahead)
        if send != self._sends:                 # reset() while it streamed: nothing to record
            return
        reply = tokens[:-1] if tokens and tokens[-1] in eos else tokens
        self._messages = messages + [chat_reply(self.path, self.tokenizer.decode(reply), self.thinking,
                                                self.trust_checkpoint_code)]
        self.last_turn = ChatTurn(reused, len(ids) - reused, len(tokens), stop, t_first - t0, t_last - t_first)
        fed = ids + tokens[:-1]                 # the last token sampled was not fed back
        if self.model.position == len(fed):
            self._fed, self._epoch = fed, self.model.epoch
