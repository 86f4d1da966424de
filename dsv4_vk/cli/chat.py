"""`python -m dsv4_vk chat`: a conversation with a Hugging Face DeepSeek-V4 model directory on stdin.
Each line is a user turn and the reply streams to stdout; an empty line or the end of the input
ends the conversation, `/reset` starts it over. Each turn's prompt is the whole conversation as the
checkpoint's own encoder writes it (encoding/encoding_dsv4.py, run only with
--trust-checkpoint-code), of which the model prefills only what its decode cache does not hold yet
(dsv4_vk.model.Chat). After each reply stderr gets the tokens reused from the cache, the tokens
prefilled and their tokens/s, the tokens generated and the decode's tokens/s. Needs the
`tokenizers` library: pip install 'dsv4_vk[text]'.

    python -m dsv4_vk chat --checkpoint DIR --trust-checkpoint-code [--system TEXT] [--thinking]
        [--max-new-tokens 512] [--temperature 0] [--top-k 1] [--seed 0] [--max-ctx N]
"""
from __future__ import annotations

import sys

from ..model import Chat, Model
from ..model.text import checkpoint_encoder
from . import parser
from .generate import (check_text_options, decode_rate, load_tokenizer, prefill_progress, rate, sampling,
                       text_options)

RESET = "/reset"
STOPS = {"eos": "stopped at eos", "max_new_tokens": "token limit", "context": "the context is full"}


def parse(argv):
    ap = parser("chat", description=__doc__.split("\n\n")[0])
    text_options(ap, max_new_tokens=512)
    ap.add_argument("--system", metavar="TEXT", help="a system message before the conversation")
    ap.add_argument("--thinking", action="store_true", help="thinking mode (default: chat mode)")
    a = ap.parse_args(argv)
    check_text_options(ap, a)
    return a


def main(argv=None):
    args = parse(argv or [])
    tok = load_tokenizer(args)
    checkpoint_encoder(args.checkpoint, args.trust_checkpoint_code)     # refused before the weights load
    model = Model.load(args.checkpoint, max_ctx=args.max_ctx)
    chat = Chat(model, tok, args.checkpoint, system=args.system, thinking=args.thinking,
                trust_checkpoint_code=args.trust_checkpoint_code, sampling=sampling(args))
    out, err, interactive = sys.stdout, sys.stderr, sys.stdin.isatty()
    progress = prefill_progress(model.prefill_chunk)
    while True:
        if interactive:
            print("> ", end="", file=err, flush=True)
        line = sys.stdin.readline()
        text = line.rstrip("\r\n")
        if not text.strip():                    # an empty line, or the end of the input ("")
            return 0
        if text.strip() == RESET:
            chat.reset()
            print("(the conversation starts over)", file=err)
            continue
        for piece in chat.send(text, args.max_new_tokens, progress=progress):
            out.write(piece)
            out.flush()
        out.write("\n")
        out.flush()
        t = chat.last_turn
        assert t is not None
        print(f"reused {t.reused} tokens from the cache, prefilled {t.prefilled} tokens "
              f"({rate(t.prefilled, t.prefill_s)}); generated {t.generated} tokens ({STOPS.get(t.stop, t.stop)}), "
              f"decode {decode_rate(t.generated, t.decode_s)}", file=err)
