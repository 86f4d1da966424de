"""Conversations (dsv4_vk.model.Chat, `dsv4_vk chat`) on conftest.py's `chat_ckpt`: the text tests'
tokenizer and stand-in encoder beside a tiny random model whose replies encode back to the ids it
sampled (tests/text_checkpoint.py), so that a turn's cache is a prefix of the next prompt. Every
reply is checked against a fresh model that prefills the whole prompt at once."""
import io

import numpy as np
import pytest
from text_checkpoint import END_THINK, THINK

from dsv4_vk.cli import chat as chat_cli
from dsv4_vk.cli import main as cli_main
from dsv4_vk.hc.metrics import nmse
from dsv4_vk.model import Chat, CheckpointError, Model, chat_prompt, chat_reply

N = 6           # tokens a reply may have in these tests


def prompt_ids(path, tok, messages, thinking=False):
    return tok.encode(chat_prompt(path, messages, thinking, trust_checkpoint_code=True), bos=False)


def reply_text(tok, tokens):
    return tok.decode(tokens[:-1] if tokens and tokens[-1] in tok.eos_ids else tokens)


def turn(chat, fresh, user, n=N):
    """Send `user`; check the reply against `fresh` prefilled with the whole prompt at once, and the
    conversation's new messages. Returns (the prompt's ids, the reply's tokens)."""
    tok = chat.tokenizer
    before = chat.messages
    ids = prompt_ids(chat.path, tok, before + [{"role": "user", "content": user}], chat.thinking)
    text = "".join(chat.send(user, n))
    want = list(fresh.generate(ids, n, stop=tok.eos_ids))
    assert text == reply_text(tok, want)
    assert chat.last_turn.generated == len(want) and chat.last_turn.reused + chat.last_turn.prefilled == len(ids)
    assert chat.messages == before + [{"role": "user", "content": user},
                                      chat_reply(chat.path, text, chat.thinking, trust_checkpoint_code=True)]
    assert chat.model.position == fresh.position == len(ids) + len(want) - 1
    return ids, want


def test_each_turn_prefills_only_what_the_cache_has_not_seen(chat_ckpt, text_tok):
    model, fresh = Model.load(chat_ckpt), Model.load(chat_ckpt)
    chat = Chat(model, text_tok, chat_ckpt, system="Be brief.", trust_checkpoint_code=True)
    fed, stops = None, []
    for user in ("Hello world", "漢字?", "the quick brown fox"):
        ids, reply = turn(chat, fresh, user)
        if fed is None:
            assert chat.last_turn.reused == 0
        else:                   # the ids fed before (the last prompt, its reply but the last token) are kept
            assert ids[:len(fed)] == fed and chat.last_turn.reused == len(fed) and chat.last_turn.prefilled > 0
        fed = ids + reply[:-1]
        stops.append(chat.last_turn.stop)
    assert stops == ["eos", "eos", "max_new_tokens"]      # (both ends of a reply are covered)
    assert len(chat.messages) == 7 and chat.messages[0] == {"role": "system", "content": "Be brief."}
    # the caches hold the same: one more token gives the same logits on both (chunking changes rounding only)
    got, want = model.step(7, output="logits"), fresh.step(7, output="logits")
    assert np.abs(want).max() > 0.1 and nmse(got, want) <= 1e-6


def test_a_rewritten_history_prefills_the_whole_prompt(chat_ckpt, text_tok):
    """The stand-in encoder, as DeepSeek's in thinking mode, closes an earlier turn's think tag in
    the next prompt: the ids fed are no prefix of it, and the whole prompt runs again."""
    model, fresh = Model.load(chat_ckpt), Model.load(chat_ckpt)
    chat = Chat(model, text_tok, chat_ckpt, thinking=True, trust_checkpoint_code=True)
    ids, reply = turn(chat, fresh, "Hello world")
    think = len(ids) - 1
    assert text_tok.decode(ids[think:]) == THINK
    fed = ids + reply[:-1]
    ids, _ = turn(chat, fresh, "漢字?")
    assert ids[:think] == fed[:think] and text_tok.decode(ids[think:think + 1]) == END_THINK
    assert chat.last_turn.reused == 0 and chat.last_turn.prefilled == len(ids)


def test_a_reply_becomes_the_message_the_checkpoints_parser_makes(chat_ckpt):
    def reply(text, thinking):
        return chat_reply(chat_ckpt, text, thinking, trust_checkpoint_code=True)

    assert reply("r</think>a", True) == {"role": "assistant", "reasoning_content": "r", "content": "a"}
    assert reply("r</think>a", False) == {"role": "assistant", "content": "r</think>a"}
    assert reply("cut off in its reasoning", True) == {"role": "assistant", "content": "cut off in its reasoning"}
    with pytest.raises(CheckpointError, match="trust_checkpoint_code=True"):
        chat_reply(chat_ckpt, "a")


def test_another_use_of_the_model_between_turns_prefills_the_whole_prompt(chat_ckpt, text_tok):
    model, fresh = Model.load(chat_ckpt), Model.load(chat_ckpt)
    chat = Chat(model, text_tok, chat_ckpt, system="Be brief.", trust_checkpoint_code=True)
    ids, reply = turn(chat, fresh, "Hello world")
    fed = ids + reply[:-1]
    others = {"generate": lambda: list(model.generate([5, 6, 7], 4)),
              "reset": model.reset,
              # the same length as the conversation's ids: only the model's epoch tells them apart
              "prefill": lambda: (model.reset(), model.prefill([9] * len(fed)))}
    for name, use in others.items():
        use()
        ids, reply = turn(chat, fresh, f"after {name}")
        assert chat.last_turn.reused == 0, name
        fed = ids + reply[:-1]
    ids, reply = turn(chat, fresh, "and again")                       # nothing in between: reused
    assert chat.last_turn.reused == len(fed)


def test_a_reply_cut_short_is_the_turn_and_a_stale_one_is_none(chat_ckpt, text_tok):
    model, fresh = Model.load(chat_ckpt), Model.load(chat_ckpt)
    chat = Chat(model, text_tok, chat_ckpt, system="Be brief.", trust_checkpoint_code=True)
    turn(chat, fresh, "Hello world")
    before = chat.messages
    it = chat.send("the quick brown fox", N)
    first = next(it)
    it.close()                                  # the caller stopped: the turn is what it gave
    assert chat.messages == before + [{"role": "user", "content": "the quick brown fox"},
                                      {"role": "assistant", "content": first}]
    assert chat.last_turn.stop == "closed" and chat.last_turn.generated == 1
    fed = prompt_ids(chat_ckpt, text_tok, chat.messages[:-1])               # (its one token was not fed)
    assert model.position == len(fed)
    turn(chat, fresh, "漢字?")
    assert chat.last_turn.reused == len(fed)
    before = chat.messages
    it = chat.send("Hello world", N)
    next(it)
    model.reset()                               # someone else takes the model while the reply streams
    with pytest.raises(RuntimeError, match="send\\(\\) iterator is stale: the model ran something else"):
        next(it)
    assert chat.messages == before
    turn(chat, fresh, "Hello world")
    assert chat.last_turn.reused == 0
    old = chat.send("unused", N)
    chat.reset()
    with pytest.raises(RuntimeError, match="send\\(\\) iterator is stale"):
        next(old)
    assert chat.messages == [{"role": "system", "content": "Be brief."}]


def test_a_conversation_past_max_ctx_is_refused_with_the_numbers(chat_ckpt, text_tok):
    chat = Chat(Model.load(chat_ckpt, max_ctx=40), text_tok, chat_ckpt, system="Be brief.",
                trust_checkpoint_code=True)
    stops: list = []
    while True:
        messages = chat.messages + [{"role": "user", "content": "the quick brown fox"}]
        n = len(prompt_ids(chat_ckpt, text_tok, messages))
        if n > 40:
            break
        "".join(chat.send("the quick brown fox", 50))                 # more than the cache holds
        stops.append(chat.last_turn.stop)
        assert chat.model.position <= 40
    assert stops == ["context"] and chat.model.position == 40           # the reply ran to the cache's end
    before = chat.messages
    with pytest.raises(ValueError, match=rf"prompt is {n} tokens \({len(messages)} messages\), past the model's "
                                         rf"max_ctx of 40: it leaves no room for a reply"):
        chat.send("the quick brown fox", 50)
    assert chat.messages == before                                     # the refused turn left no trace


def test_bad_arguments_are_refused(chat_ckpt, text_tok):
    model = Model.load(chat_ckpt)
    with pytest.raises(CheckpointError, match="trust_checkpoint_code=True"):
        Chat(model, text_tok, chat_ckpt)
    chat = Chat(model, text_tok, chat_ckpt, trust_checkpoint_code=True)
    for args, msg in (((7,), "user_text must be a str"), (("hi", 0), "max_new_tokens must be an integer ≥ 1"),
                      (("hi", 4, "bar"), "progress must be a callable")):
        with pytest.raises(ValueError, match=msg):
            chat.send(*args)
    with pytest.raises(ValueError, match="sampling must be a Sampling"):
        Chat(model, text_tok, chat_ckpt, trust_checkpoint_code=True, sampling="greedy")


# --- the chat command ---------------------------------------------------------------------------------------

def test_chat_command_streams_each_reply_and_reports_the_reuse(chat_ckpt, text_tok, capsys, monkeypatch):
    users = ["Hello world", "漢字?", "/reset", "Hello world"]
    chat = Chat(Model.load(chat_ckpt), text_tok, chat_ckpt, system="Be brief.", trust_checkpoint_code=True)
    replies, turns = [], []
    for user in users:
        if user == "/reset":
            chat.reset()
            continue
        replies.append("".join(chat.send(user, N)))
        turns.append(chat.last_turn)
    assert turns[1].reused > 0
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(users) + "\n\nnot read\n"))
    assert chat_cli.main(["--checkpoint", chat_ckpt, "--system", "Be brief.", "--trust-checkpoint-code",
                          "--max-new-tokens", str(N)]) == 0
    out = capsys.readouterr()
    assert out.out == "".join(r + "\n" for r in replies)
    lines = [line for line in out.err.splitlines() if line.startswith("reused")]
    assert [line.split(";")[0].split(" (")[0] for line in lines] == [
        f"reused {t.reused} tokens from the cache, prefilled {t.prefilled} tokens" for t in turns]
    assert all(f"generated {t.generated} tokens" in line for t, line in zip(turns, lines))
    assert "the conversation starts over" in out.err and "not read" not in out.out + out.err


def test_chat_command_refuses_the_encoder_without_the_flag_as_generate_does(chat_ckpt, capsys):
    assert cli_main(["chat", "--checkpoint", chat_ckpt]) == 1
    err = capsys.readouterr().err
    assert "--trust-checkpoint-code" in err
    assert cli_main(["generate", "--checkpoint", chat_ckpt, "--chat", "hi"]) == 1
    assert capsys.readouterr().err == err
    with pytest.raises(SystemExit) as e:
        chat_cli.main(["--checkpoint", chat_ckpt, "--max-new-tokens", "0"])
    assert e.value.code == 2 and "--max-new-tokens must be ≥ 1" in capsys.readouterr().err
