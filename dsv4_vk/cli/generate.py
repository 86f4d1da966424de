"""`python -m dsv4_vk generate`: text in, text out with a Hugging Face DeepSeek-V4 model directory.
The prompt is encoded with the checkpoint's tokenizer (a raw --prompt after the bos token, or a
--chat message through the checkpoint's own prompt encoder, which runs only with
--trust-checkpoint-code), the model prefills it (progress on stderr for a prompt longer than one
chunk) and the decoded text streams to stdout as the tokens arrive, until an eos token or
--max-new-tokens. Then stderr gets the prompt and generated token counts and their tokens/s.
Needs the `tokenizers` library: pip install 'dsv4_vk[text]'.

    python -m dsv4_vk generate --checkpoint DIR (--prompt TEXT | --chat TEXT [--system TEXT] [--thinking])
        [--trust-checkpoint-code] [--max-new-tokens 64] [--temperature 0] [--top-k 1] [--seed 0] [--max-ctx N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

from ..model import Model, Sampling, Tokenizer, chat_prompt
from ..model.config import load_config_json
from . import apply_device, check_sampling, parser


def text_options(ap: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """The options `generate` and `chat` share: the checkpoint, the encoder's trust, sampling, the cache."""
    ap.add_argument("--checkpoint", required=True, metavar="DIR",
                    help="a Hugging Face DeepSeek-V4 model directory (config.json, safetensors, tokenizer.json, "
                         "tokenizer_config.json)")
    ap.add_argument("--trust-checkpoint-code", action="store_true",
                    help="allow chat prompts to run the checkpoint's encoding/encoding_dsv4.py (Python code from "
                         "the download)")
    ap.add_argument("--max-new-tokens", type=int, default=max_new_tokens, metavar="N",
                    help=f"tokens to generate at most (default {max_new_tokens})")
    ap.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0: greedy (default)")
    ap.add_argument("--top-k", type=int, default=1, metavar="K", help="sampling candidates (default 1)")
    ap.add_argument("--seed", type=int, default=0, metavar="S", help="sampler seed (default 0)")
    ap.add_argument("--max-ctx", type=int, metavar="N", help="decode cache capacity in tokens (default: the model's, "
                                                "at most 4096)")


def check_text_options(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """text_options' values checked (a one-line error naming the option), and --device applied."""
    apply_device(a)
    if not os.path.isdir(a.checkpoint):
        ap.error(f"--checkpoint {a.checkpoint!r} is not a directory (a Hugging Face model directory)")
    if a.max_new_tokens < 1:
        ap.error(f"--max-new-tokens must be ≥ 1, got {a.max_new_tokens}")
    check_sampling(ap, a)
    if a.max_ctx is not None and a.max_ctx < 1:
        ap.error(f"--max-ctx must be ≥ 1, got {a.max_ctx}")


def load_tokenizer(args: argparse.Namespace) -> Tokenizer:
    """The checkpoint's tokenizer, checked against its config.json: read before the weights, so that
    its errors do not wait for a large load."""
    tok = Tokenizer.from_dir(args.checkpoint)
    tok.check(load_config_json(os.path.join(args.checkpoint, "config.json")))
    return tok


def sampling(args: argparse.Namespace) -> Sampling:
    return Sampling(args.temperature, args.top_k, args.seed)


def rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:.1f} tokens/s" if seconds > 0 else "n/a"


def decode_rate(generated: int, seconds: float) -> str:
    """The decode's tokens/s: of the tokens after the first, which the prefill's logits gave."""
    return rate(generated - 1, seconds) if generated > 1 else "n/a (one token)"


def prefill_progress(chunk: int) -> Callable[[int, int], None]:
    """A prefill's progress on stderr, for prompts longer than one chunk of `chunk` tokens."""
    def progress(done: int, total: int) -> None:
        if total > chunk:
            print(f"\rprefill: {done}/{total} tokens", end="\n" if done == total else "", file=sys.stderr,
                  flush=True)
    return progress


def parse(argv):
    ap = parser("generate", description=__doc__.split("\n\n")[0])
    text_options(ap, max_new_tokens=64)
    text = ap.add_mutually_exclusive_group(required=True)
    text.add_argument("--prompt", metavar="TEXT", help="raw text to continue (encoded after the bos token)")
    text.add_argument("--chat", metavar="TEXT", help="a user message, as a chat prompt from the checkpoint's "
                                                     "encoding/encoding_dsv4.py")
    ap.add_argument("--system", metavar="TEXT", help="a system message before --chat's")
    ap.add_argument("--thinking", action="store_true", help="--chat in thinking mode (default: chat mode)")
    a = ap.parse_args(argv)
    check_text_options(ap, a)
    if a.chat is None and (a.system is not None or a.thinking):
        ap.error("--system and --thinking go with --chat")
    return a


def prompt_ids(args, tok: Tokenizer) -> list[int]:
    if args.chat is None:
        return tok.encode(args.prompt, bos=True)
    messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
    messages.append({"role": "user", "content": args.chat})
    text = chat_prompt(args.checkpoint, messages, thinking=args.thinking,
                       trust_checkpoint_code=args.trust_checkpoint_code)
    return tok.encode(text, bos=False)              # the encoder's text starts with the bos token


def main(argv=None):
    args = parse(argv or [])
    tok = load_tokenizer(args)
    ids = prompt_ids(args, tok)                     # (also before the weights)
    model = Model.load(args.checkpoint, max_ctx=args.max_ctx)
    if len(ids) + args.max_new_tokens - 1 > model.cfg.max_ctx:
        raise ValueError(f"the prompt's {len(ids)} tokens and --max-new-tokens {args.max_new_tokens} need a "
                         f"context of {len(ids) + args.max_new_tokens - 1} tokens, past max_ctx "
                         f"{model.cfg.max_ctx}: give a larger --max-ctx or fewer --max-new-tokens")
    stream, out = tok.stream(), sys.stdout
    n, stopped, t0 = 0, False, time.perf_counter()
    t_first = t_last = t0
    for t in model.generate(ids, args.max_new_tokens, sampling(args), stop=tok.eos_ids,
                            progress=prefill_progress(model.prefill_chunk)):
        t_last = time.perf_counter()
        if n == 0:
            t_first = t_last
        n += 1
        if t in tok.eos_ids:
            stopped = True
            break
        out.write(stream.push(t))
        out.flush()
    out.write(stream.flush() + "\n")
    out.flush()
    print(f"prompt: {len(ids)} tokens, prefill {rate(len(ids), t_first - t0)}; generated: {n} tokens "
          f"({'stopped at eos' if stopped else 'token limit'}), decode {decode_rate(n, t_last - t_first)}",
          file=sys.stderr)
    return 0
