"""Text in, text out (dsv4_vk.model.text, `dsv4_vk generate`) on a checkpoint directory laid out as a
Hugging Face DeepSeek-V4 download (tests/text_checkpoint.py): a random tiny model, a real byte-level
BPE tokenizer trained here with DeepSeek's special-token names, and a stand-in prompt encoder."""
import json
import os
import shutil
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from text_checkpoint import ASSISTANT, BOS, CORPUS, END_THINK, EOS, THINK, USER, calls

from dsv4_vk.cli import main as cli_main
from dsv4_vk.cli import generate
from dsv4_vk.model import CheckpointError, Model, Tokenizer, chat_prompt
from dsv4_vk.model.config import load_config_json

REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def ckpt(text_ckpt):
    return text_ckpt


@pytest.fixture(scope="module")
def tok(text_tok):
    return text_tok


# --- the tokenizer -----------------------------------------------------------------------------------------

def test_encode_decode_round_trip_and_bos(ckpt, tok):
    for text in CORPUS[:4] + ["", " leading space", "unseen: Ω≈ç √ 😀 ü"]:
        ids = tok.encode(text, bos=False)
        assert tok.decode(ids) == text
        assert tok.encode(text) == [tok.bos_id] + ids and ids.count(tok.bos_id) == 0
    assert tok.bos_id == tok.hf.token_to_id(BOS) == 0
    assert tok.vocab_size == tok.hf.get_vocab_size() == load_config_json(os.path.join(ckpt, "config.json")).vocab_size


def test_special_token_text_in_a_string_maps_to_its_single_id(tok):
    text = f"{BOS}{USER}漢字 hi{ASSISTANT}{THINK}ok{END_THINK}{EOS}"
    ids = tok.encode(text, bos=False)
    named = [tok.hf.token_to_id(t) for t in (BOS, USER, ASSISTANT, THINK, END_THINK, EOS)]
    assert all(i is not None and ids.count(i) == 1 for i in named)
    assert ids[:2] == named[:2] and ids[-1] == named[-1]
    assert tok.decode(ids) == text
    assert tok.encode(text, bos=True).count(tok.bos_id) == 2      # bos=True adds one in front of the text's own


def test_eos_ids_come_from_tokenizer_config_and_generation_config(ckpt, tok, tmp_path):
    assert tok.eos_ids == frozenset({tok.hf.token_to_id(EOS), tok.hf.token_to_id(ASSISTANT)}) == {1, 3}
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ckpt, name), tmp_path)
    assert Tokenizer.from_dir(tmp_path).eos_ids == {1}               # no generation_config.json: eos only
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": 2}, f)                             # an int, not a list
    assert Tokenizer.from_dir(tmp_path).eos_ids == {1, 2}


def test_tokenizer_file_errors_name_the_file_and_key(ckpt, tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer.json: not found"):
        Tokenizer.from_dir(tmp_path)
    shutil.copy(os.path.join(ckpt, "tokenizer.json"), tmp_path)
    with pytest.raises(CheckpointError, match="tokenizer_config.json: not found"):
        Tokenizer.from_dir(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text('{"bos_token": "<s>",', encoding="utf-8")
    with pytest.raises(CheckpointError, match="tokenizer_config.json: not valid JSON"):
        Tokenizer.from_dir(tmp_path)
    config.write_text(json.dumps({"bos_token": {"content": "<s>"}, "eos_token": EOS}), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer_config.json: bos_token '<s>' is not a token of .*tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    config.write_text(json.dumps({"bos_token": BOS, "eos_token": "</s>"}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="eos_token '</s>' is not a token"):
        Tokenizer.from_dir(tmp_path)
    config.write_text(json.dumps({"bos_token": BOS, "eos_token": 7}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="eos_token must be a token string"):
        Tokenizer.from_dir(tmp_path)
    config.write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}), encoding="utf-8")
    gen = tmp_path / "generation_config.json"
    gen.write_text("{eos", encoding="utf-8")
    with pytest.raises(CheckpointError, match="generation_config.json: not valid JSON"):
        Tokenizer.from_dir(tmp_path)
    gen.write_text('{"eos_token_id": "</s>"}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="generation_config.json: eos_token_id must be a token id"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": ', encoding="utf-8")
    with pytest.raises(CheckpointError, match="tokenizer.json: not valid JSON"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Nonsense"}}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="tokenizer.json: not a tokenizer the `tokenizers` library reads"):
        Tokenizer.from_dir(tmp_path)


def test_a_tokenizer_with_ids_past_the_model_vocabulary_is_refused(tok, ckpt):
    cfg = load_config_json(os.path.join(ckpt, "config.json"))
    tok.check(cfg)
    with pytest.raises(CheckpointError, match=f"ids reach {tok.vocab_size - 1} .* vocab_size is {tok.vocab_size - 5}"):
        tok.check(cfg.replace(vocab_size=tok.vocab_size - 5))


def test_without_the_tokenizers_library_the_error_says_what_to_install(ckpt, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tokenizers", None)             # `import tokenizers` now fails
    with pytest.raises(ImportError, match=r"pip install 'dsv4_vk\[text\]'"):
        Tokenizer.from_dir(ckpt)
    assert cli_main(["generate", "--checkpoint", ckpt, "--prompt", "hi"]) == 1
    assert "pip install 'dsv4_vk[text]'" in capsys.readouterr().err


# --- streaming -------------------------------------------------------------------------------------------

def stream_all(tok, ids):
    s = tok.stream()
    pieces = [s.push(i) for i in ids]
    return pieces, s.flush()


@settings(max_examples=150, deadline=None, database=None)
@given(st.data())
def test_stream_pushes_and_flush_add_up_to_decode_for_any_ids(tok, data):
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=24))
    pieces, rest = stream_all(tok, ids)
    assert "".join(pieces) + rest == tok.decode(ids)


@settings(max_examples=60, deadline=None, database=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters=REPLACEMENT), max_size=20))
def test_stream_of_valid_text_never_emits_half_a_character(tok, text):
    pieces, rest = stream_all(tok, tok.encode(text, bos=False))
    assert "".join(pieces) == text and rest == "" and not any(REPLACEMENT in p for p in pieces)


def test_a_character_split_across_tokens_waits_for_its_last_token(tok):
    text = "漢字🙂"
    ids = tok.encode(text, bos=False)
    halves = [i for i in ids if REPLACEMENT in tok.decode([i])]
    assert halves, f"the corpus should make BPE split a character across tokens: {ids}"
    s = tok.stream()
    out = []
    for i in ids:
        piece = s.push(i)
        assert REPLACEMENT not in piece
        if i == ids[0] and i in halves:
            assert piece == ""                                        # the first byte(s) alone: held back
        out.append(piece)
    assert "".join(out) == text and s.flush() == ""
    s = tok.stream()
    assert s.push(halves[0]) == "" and s.flush() == tok.decode([halves[0]])    # never completed: U+FFFD


# --- chat prompts -------------------------------------------------------------------------------------------

def test_chat_prompt_runs_the_checkpoints_encoder_only_when_trusted(ckpt, tmp_path):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "漢字?"}]
    before = len(calls(ckpt))
    with pytest.raises(CheckpointError, match=r"encoding_dsv4.py is Python code .* trust_checkpoint_code=True"):
        chat_prompt(ckpt, msgs)
    assert len(calls(ckpt)) == before                                  # refused before it ran
    assert chat_prompt(ckpt, msgs, trust_checkpoint_code=True) == f"{BOS}Be brief.{USER}漢字?{ASSISTANT}{END_THINK}"
    assert chat_prompt(ckpt, msgs, thinking=True, trust_checkpoint_code=True).endswith(f"{ASSISTANT}{THINK}")
    got = calls(ckpt)[before:]
    assert [c["thinking_mode"] for c in got] == ["chat", "thinking"] and got[0]["messages"] == msgs
    assert "encoding_dsv4" not in sys.modules and not any("encoding" in p for p in sys.path if p)
    with pytest.raises(CheckpointError, match=r"encoding_dsv4.py: not found"):
        chat_prompt(tmp_path, msgs, trust_checkpoint_code=True)
    (tmp_path / "encoding").mkdir()
    (tmp_path / "encoding" / "encoding_dsv4.py").write_text("def other(): pass\n")
    with pytest.raises(CheckpointError, match="has no encode_messages function"):
        chat_prompt(tmp_path, msgs, trust_checkpoint_code=True)


# --- the generate command -----------------------------------------------------------------------------------

def expected_text(ckpt, tok, ids, n):
    """What the command should print: Model.generate's greedy tokens up to an eos, decoded."""
    got = list(Model.load(ckpt).generate(ids, n, stop=tok.eos_ids))
    kept = got[:-1] if got and got[-1] in tok.eos_ids else got
    return tok.decode(kept), got


def run_generate(capsys, *argv):
    assert generate.main(list(argv)) == 0
    return capsys.readouterr()


def test_generate_prompt_streams_the_decoded_greedy_tokens(ckpt, tok, capsys):
    prompt = "Grüße aus Köln 🙂, the quick brown fox"                  # longer than a 16-token chunk
    ids = tok.encode(prompt)
    assert len(ids) > 16
    want, got = expected_text(ckpt, tok, ids, 6)
    out = run_generate(capsys, "--checkpoint", ckpt, "--prompt", prompt, "--max-new-tokens", "6")
    assert out.out == want + "\n"
    assert f"prefill: {len(ids)}/{len(ids)} tokens" in out.err
    assert f"prompt: {len(ids)} tokens" in out.err and f"generated: {len(got)} tokens" in out.err
    assert "tokens/s" in out.err


def test_generate_chat_uses_the_checkpoints_prompt_encoder(ckpt, tok, capsys):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "漢字?"}]
    ids = tok.encode(chat_prompt(ckpt, msgs, thinking=True, trust_checkpoint_code=True), bos=False)
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id
    want, _ = expected_text(ckpt, tok, ids, 4)
    n = len(calls(ckpt))
    out = run_generate(capsys, "--checkpoint", ckpt, "--chat", "漢字?", "--system", "Be brief.", "--thinking",
                       "--trust-checkpoint-code", "--max-new-tokens", "4")
    assert out.out == want + "\n" and f"prompt: {len(ids)} tokens" in out.err
    assert calls(ckpt)[n:] == [{"messages": msgs, "thinking_mode": "thinking"}]


def test_generate_stops_at_an_eos_id_from_generation_config(ckpt, tok, tmp_path, capsys):
    ids = tok.encode("Hello world")
    greedy = list(Model.load(ckpt).generate(ids, 6))
    path = tmp_path / "ck"
    shutil.copytree(ckpt, path)
    with open(path / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": greedy[2]}, f)                     # the model's third greedy token ends it
    stop = Tokenizer.from_dir(path).eos_ids
    end = next(i for i, t in enumerate(greedy) if t in stop)
    assert end <= 2
    out = run_generate(capsys, "--checkpoint", str(path), "--prompt", "Hello world", "--max-new-tokens", "6")
    assert out.out == tok.decode(greedy[:end]) + "\n"
    assert f"generated: {end + 1} tokens (stopped at eos)" in out.err


def test_generate_argument_and_prompt_errors(ckpt, capsys):
    for argv, msg in ((["--prompt", "a", "--thinking"], "--system and --thinking go with --chat"),
                      (["--prompt", "a", "--chat", "b"], "not allowed with argument"),
                      (["--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens must be ≥ 1"),
                      (["--prompt", "a", "--top-k", "0"], "--top-k must be from 1"),
                      ([], "one of the arguments --prompt --chat is required")):
        with pytest.raises(SystemExit) as e:
            generate.main(["--checkpoint", ckpt, *argv])
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert cli_main(["generate", "--checkpoint", ckpt, "--chat", "hi"]) == 1
    assert "--trust-checkpoint-code" in capsys.readouterr().err
    assert cli_main(["generate", "--checkpoint", ckpt, "--prompt", "hi", "--max-ctx", "4", "--max-new-tokens", "8"]) == 1
    assert "give a larger --max-ctx" in capsys.readouterr().err
