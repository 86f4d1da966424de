"""Write the DeepSeek-V4 test fixtures from Hugging Face transformers (the authority).

    /work/venv-tf/bin/python tools/make_dsv4_fixtures.py [--out tests/fixtures] [--only long,fp8,fp8_d256]

Needs torch (CPU) and transformers ≥ 5.23, which CI cannot install; the files this writes are
committed instead. For each tiny config below it writes `dsv4_<name>/`: the checkpoint exactly as
`save_pretrained` writes it (config.json + safetensors), `state_dict_shapes.json` (transformers'
in-memory tensor names and shapes, the third naming the loader maps), and `expected.npz` with the prompt, the
forced decode tokens and transformers' float32 logits after the cached prefill (every prompt
position) and after every cached decode step, plus the no-cache forward over the whole sequence.

Random weights: transformers initialises sinks, compressor position biases, HC bases, router
correction biases and tid2eid to 0 and norm weights / HC scales to 1, which would hide a missing
or misplaced term; every one of them is randomised here, and the linear weights are drawn at
1/sqrt(fan-in) so activations stay O(1) through the layers.

Quantised fixtures (`QUANT_CONFIGS`, `dsv4_fp8*`): the checkpoint in DeepSeek's published layout
(FP8 E4M3 linears with 128 × 128 E8M0 block scales, FP4 E2M1 routed experts with a scale per 32
inputs, the rest BF16/F32) is written by the project's `write_random(dtype="fp8")`, and the
expected logits come from transformers loading that directory with
`FineGrainedFP8Config(dequantize=True)` in float32 (the authority reads the files; every dim is
≤ 128 or a multiple of it, where transformers' block size, derived from the grid, is 128).

Index top-k ties: the indexer scores Σ_h w_h·ReLU(q_h·k) tie at exactly 0 when every head's dot
product is negative; with few index heads that happens often and two correct implementations may
keep different tied entries. The configs use 16 index heads (a tie then needs 16 negative
products) or an index_topk at least the number of entries (no selection at all).
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, FineGrainedFP8Config

from dsv4_vk.model.synthetic import write_random
from dsv4_vk.model.config import V4Config

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
BASE = dict(vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_attention_heads=4, head_dim=32,
            q_lora_rank=16, num_experts_per_tok=2, n_routed_experts=4, sliding_window=8, o_groups=2,
            o_lora_rank=8, index_n_heads=16, index_head_dim=16, partial_rotary_factor=0.25,
            max_position_embeddings=128, swiglu_limit=1.5, routed_scaling_factor=1.5,
            compress_rates={CSA: 4, HCA: 8})
CONFIGS = {
    # every layer type, both MoE types, YaRN on the compressed layers, a real top-k (4 of ≤ 13 entries)
    "mixed": dict(BASE, num_hidden_layers=3, layer_types=[CSA, HCA, SWA], mlp_layer_types=["hash_moe", "moe", "moe"],
                  index_topk=4, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 32,
                                                 "beta_fast": 32, "beta_slow": 1}),
    # BF16 linear weights in several shards; index_topk above the old 64 cap (≥ every entry count)
    "bf16": dict(BASE, num_hidden_layers=3, layer_types=[HCA, CSA, SWA], mlp_layer_types=["moe", "hash_moe", "moe"],
                 index_topk=80, scoring_func="sqrtsoftplus"),
    # long context past the indexer's top-k: a 128-token prompt is > 10 × index_topk × rate (120)
    # tokens, then 17 decode steps; two CSA layers each keep 3 of up to 36 entries
    "long": dict(BASE, num_hidden_layers=3, layer_types=[CSA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe"],
                 index_topk=3, max_position_embeddings=160,
                 rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 40,
                                  "beta_fast": 32, "beta_slow": 1}),
}
QBASE = dict(vocab_size=64, num_attention_heads=4, head_dim=32, num_experts_per_tok=2, n_routed_experts=4,
             sliding_window=8, o_groups=2, index_n_heads=16, index_head_dim=16, partial_rotary_factor=0.25,
             max_ctx=128, swiglu_limit=1.5, routed_scaling_factor=1.5, compress_rates={CSA: 4, HCA: 8})
QUANT_CONFIGS = {
    # every layer type, in 3 shards (a scale and its weight in different shards), DeepSeek's names, E8M0 scales
    "fp8": (dict(QBASE, hidden_size=32, moe_intermediate_size=32, q_lora_rank=16, o_lora_rank=8, num_hidden_layers=3,
                 layer_types=(CSA, HCA, SWA), mlp_layer_types=("hash_moe", "moe", "moe"), index_topk=4),
            dict(naming="deepseek", shards=3, scale_dtype="e8m0")),
    # hidden size 256 (two 128-blocks a row), save_pretrained's names with weight_scale_inv, U8 scales
    "fp8_d256": (dict(QBASE, hidden_size=256, moe_intermediate_size=64, q_lora_rank=64, o_lora_rank=32,
                      num_hidden_layers=2, layer_types=(CSA, HCA), mlp_layer_types=("hash_moe", "moe"), index_topk=4),
                 dict(naming="save_pretrained", shards=1, scale_dtype="u8")),
}
PROMPT, DECODE = 37, 17        # 37 tokens close 9 CSA and 4 HCA windows and pass the 8-token window
LENGTHS = {"long": (128, 17)}  # (prompt, decode) where not PROMPT, DECODE


def randomise(model, rng):
    """Every parameter and buffer drawn from rng (see the module docstring for why)."""
    g = torch.Generator().manual_seed(int(rng.integers(2 ** 31)))
    cfg = model.config
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if "inv_freq" in name:
            continue
        with torch.no_grad():
            if name.endswith("tid2eid"):
                # distinct experts per token (as DeepSeek's table has), random over the vocab
                ids = torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:cfg.num_experts_per_tok]
                                   for _ in range(cfg.vocab_size)])
                p.copy_(ids)
            elif "norm" in name or name.endswith(("hc.scale", "hc_scale")):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(("sinks", "position_bias", "e_score_correction_bias")):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(("hc.base", "hc_base")):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith(("hc.fn", "hc_fn")):
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:                                   # linear maps [.., out, in]
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


BF16_KEEP_F32 = ("norm", "hc", "sinks", "position_bias", "e_score_correction_bias", "tid2eid")


def to_bf16(model):
    """Round the linear/embedding weights to BF16 in place (in an f32 model: the logits below are
    then exactly what a BF16 checkpoint upcast to f32 gives) and return their names."""
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(k in name for k in BF16_KEEP_F32):
                p.copy_(p.bfloat16().float())
                names.append(name)
    return names


def run(model, prompt, decode):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(prompt[None]), use_cache=True)
        prefill = out.logits[0].float().numpy()
        cache, steps = out.cache, []
        for tok in decode:
            out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits[0, -1].float().numpy())
        full = model(input_ids=torch.tensor([list(prompt) + list(decode)]), use_cache=False).logits[0].float().numpy()
    return prefill, np.stack(steps), full


def make(name, kwargs, out_dir, seed):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    cfg = DeepseekV4Config(**kwargs)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomise(model, rng)
    bf16 = name == "bf16"
    if bf16:
        names = to_bf16(model)
    n_prompt, n_decode = LENGTHS.get(name, (PROMPT, DECODE))
    prompt = rng.integers(0, cfg.vocab_size, n_prompt)
    decode = rng.integers(0, cfg.vocab_size, n_decode)
    prefill, steps, full = run(model, prompt, decode)
    d = os.path.join(out_dir, f"dsv4_{name}")
    shutil.rmtree(d, ignore_errors=True)
    if bf16:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in names:
                    p.data = p.data.bfloat16()
        model.save_pretrained(d, max_shard_size="40KB")         # several shards + the index
    else:
        model.save_pretrained(d)
    with open(os.path.join(d, "state_dict_shapes.json"), "w") as f:
        json.dump({k: list(v.shape) for k, v in model.state_dict().items()}, f, indent=0, sort_keys=True)
    np.savez_compressed(os.path.join(d, "expected.npz"), prompt=prompt.astype(np.int64),
                        decode=decode.astype(np.int64), prefill=prefill, steps=steps, full=full)
    cached = np.concatenate([prefill, steps])
    gap = float(np.sum((cached - full) ** 2) / np.sum(full ** 2))
    print(f"{d}: {n_prompt} + {n_decode} tokens, cached vs no-cache NMSE {gap:.2e}, "
          f"logit RMS {float(np.sqrt(np.mean(full ** 2))):.3f}")


def make_quant(name, cfg_kw, write_kw, out_dir, seed):
    rng = np.random.default_rng(seed)
    cfg = V4Config(**cfg_kw)
    d = os.path.join(out_dir, f"dsv4_{name}")
    shutil.rmtree(d, ignore_errors=True)
    write_random(d, cfg, seed, dtype="fp8", **write_kw)
    model = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                  quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
    prompt = rng.integers(0, cfg.vocab_size, PROMPT)
    decode = rng.integers(0, cfg.vocab_size, DECODE)
    prefill, steps, full = run(model, prompt, decode)
    np.savez_compressed(os.path.join(d, "expected.npz"), prompt=prompt.astype(np.int64),
                        decode=decode.astype(np.int64), prefill=prefill, steps=steps, full=full)
    print(f"{d}: {PROMPT} + {DECODE} tokens, logit RMS {float(np.sqrt(np.mean(full ** 2))):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", help="comma-separated fixture names to write (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    known = set(CONFIGS) | set(QUANT_CONFIGS)
    only = set(args.only.split(",")) if args.only else known
    if only - known:
        ap.error(f"--only: unknown fixtures {sorted(only - known)}; known: {sorted(known)}")
    for i, (name, kw) in enumerate(CONFIGS.items()):
        if name in only:
            make(name, kw, args.out, args.seed + i)
    for i, (name, (cfg_kw, write_kw)) in enumerate(QUANT_CONFIGS.items()):
        if name in only:
            make_quant(name, cfg_kw, write_kw, args.out, args.seed + 100 + i)


if __name__ == "__main__":
    main()
