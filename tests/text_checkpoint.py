"""A checkpoint directory laid out as a Hugging Face DeepSeek-V4 download, for the text tests
(test_text.py, test_chat.py; conftest.py's `text_ckpt` and `text_tok` fixtures): a random tiny
model, a real byte-level BPE tokenizer trained here with the `tokenizers` library on text with
multi-byte characters and DeepSeek's special-token names, tokenizer_config.json,
generation_config.json, and a stand-in prompt encoder."""
import json
import os
import shutil

import numpy as np

from dsv4_vk.model import Tokenizer, random_weights, save_hf, write_random
from dsv4_vk.model.config import preset

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
CORPUS = ["Hello world, the quick brown fox jumps over the lazy dog.", "ε, 漢字, emoji 🙂 and ß",
          "Grüße aus Köln 🙂🙂, καλημέρα κόσμε", "数据 and 模型: 漢字 again, τ = 2π"] * 8

# A test fixture standing in for DeepSeek's encoding/encoding_dsv4.py (not its format, only shaped
# like it): a conversation whose replies end in the eos text, the latest user turn opening a think
# tag in thinking mode while earlier turns' tags are closed (their reasoning dropped: the history
# is rewritten), a parser of completions, and each encode call's arguments recorded in calls.jsonl
# beside it.
FAKE_ENCODER = '''
import json, os

eos_token = "<｜end▁of▁sentence｜>"


def encode_messages(messages, thinking_mode, context=None, drop_thinking=True, add_default_bos_token=True,
                    reasoning_effort=None):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as f:
        f.write(json.dumps({"messages": messages, "thinking_mode": thinking_mode}) + "\\n")
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    text = "<｜begin▁of▁sentence｜>"
    for i, m in enumerate(messages):
        if m["role"] == "user":
            think = "<think>" if thinking_mode == "thinking" and i == last_user else "</think>"
            text += "<｜User｜>" + m["content"] + "<｜Assistant｜>" + think
        elif m["role"] == "assistant":
            text += m["content"] + eos_token
        else:
            text += m["content"]
    return text


def parse_message_from_completion_text(text, thinking_mode):
    assert text.endswith(eos_token), "missing eos"
    text = text[:-len(eos_token)]
    if thinking_mode != "thinking":
        return {"role": "assistant", "content": text}
    assert "</think>" in text, "missing </think>"
    reasoning, content = text.split("</think>", 1)
    return {"role": "assistant", "reasoning_content": reasoning, "content": content}
'''


def write_tokenizer(path, generation_eos):
    """tokenizer.json (byte-level BPE with DeepSeek's special tokens), tokenizer_config.json (bos as
    an AddedToken dict, eos as a string: HF writes both) and generation_config.json."""
    from tokenizers import AddedToken, Tokenizer as HF, decoders, models, pre_tokenizers, trainers
    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, special_tokens=[BOS, EOS, USER, ASSISTANT],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    hf.add_tokens([AddedToken(THINK, normalized=False), AddedToken(END_THINK, normalized=False)])
    hf.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"add_bos_token": True, "bos_token": {"__type": "AddedToken", "content": BOS, "lstrip": False},
                   "eos_token": EOS, "tokenizer_class": "LlamaTokenizerFast"}, f, ensure_ascii=False)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": generation_eos}, f)
    return hf


def write_text_checkpoint(path):
    """The tokenizer files, then a tiny random model of its vocabulary size, then the encoder."""
    hf = write_tokenizer(path, [1, 3])              # the eos ids: eos and, from generation_config only, Assistant
    write_random(path, preset("tiny", vocab_size=hf.get_vocab_size()), seed=3)
    os.makedirs(os.path.join(path, "encoding"))
    with open(os.path.join(path, "encoding", "encoding_dsv4.py"), "w", encoding="utf-8") as f:
        f.write(FAKE_ENCODER)
    return path


def write_chat_checkpoint(path, text_ckpt):
    """text_ckpt's tokenizer and encoder beside a tiny random model whose head gives every token but
    a few a logit of 0: the special tokens and whole words after a space, tokens whose text encodes
    back to the same ids in any order. Its replies do so too, so a conversation's cache holds a
    prefix of the next prompt's ids (a random model's replies otherwise hold partial characters,
    whose text encodes to other ids). Half of those rows are the others negated: for any hidden
    state one of them scores ≥ 0, so greedy sampling picks one of them."""
    os.makedirs(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(text_ckpt, name), path)
    shutil.copytree(os.path.join(text_ckpt, "encoding"), os.path.join(path, "encoding"),
                    ignore=shutil.ignore_patterns("calls.jsonl"))
    tok = Tokenizer.from_dir(path)
    specials = [tok.hf.token_to_id(t) for t in (BOS, EOS, USER, ASSISTANT, THINK, END_THINK)]
    words = [tok.hf.token_to_id(w) for w in ("Ġa", "Ġand", "Ġthe")]
    keep = specials + words
    assert None not in keep and all(tok.encode(tok.decode([i]), bos=False) == [i] for i in keep)
    cfg = preset("tiny", vocab_size=tok.vocab_size)
    w = random_weights(cfg, seed=2)        # (its replies stop at eos and at the token limit)
    head = np.zeros_like(w["head.weight"])
    half = len(keep) // 2
    head[keep] = w["head.weight"][keep]
    head[keep[half:2 * half]] = -head[keep[:half]]
    w["head.weight"] = head
    save_hf(path, cfg, w)
    return path


def calls(path):
    """The stand-in encoder's calls so far: [{"messages": ..., "thinking_mode": ...}]."""
    file = os.path.join(path, "encoding", "calls.jsonl")
    if not os.path.exists(file):
        return []
    with open(file) as f:
        return [json.loads(line) for line in f]
