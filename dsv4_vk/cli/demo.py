"""`python -m dsv4_vk demo`: a small DeepSeek-V4 generates tokens on the default device, once with
the fused hyper-connection ops and once with the unfused chain of primitive kernels. The model is a
Hugging Face checkpoint directory: --checkpoint DIR, or by default one this command writes first
with the project's own writer (tools/make_checkpoint.py does the same), random weights, seeded.
Prints tokens/s, dispatches per token, the host's share of a decode step, device memory, GPU time
per op split into prefill and decode, and whether both paths produced the same tokens.

    python -m dsv4_vk demo [--checkpoint DIR | --preset demo --dtype f32 --seed 0 --out DIR]
                           [--tokens 16] [--prompt 8] [--temperature 0] [--top-k 1] [--no-profile]
"""
import os
import tempfile
import time

import numpy as np

from ..core import profile
from ..hc.policy import HCUnsupported
from ..model import Model, Sampling, load_hf
from ..model.synthetic import write_random
from ..model.config import CSA, HCA, PRESETS, SWA, preset

SHORT = {CSA: "CSA", HCA: "HCA", SWA: "sliding"}
from ..vk import default_device
from . import apply_device, check_sampling, parser


def parse(argv):
    ap = parser("demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="a Hugging Face DeepSeek-V4 model directory (default: write one)")
    ap.add_argument("--preset", default="demo", choices=sorted(PRESETS), help="config to write (default demo)")
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16", "f16"), help="linear weights written (default f32)")
    ap.add_argument("--out", help="where to write the checkpoint (default: a temporary directory)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens to generate (default 16)")
    ap.add_argument("--prompt", type=int, default=8, help="prompt length (default 8)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    ap.add_argument("--top-k", type=int, default=1, help="sampling candidates (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="weights, prompt and sampler seed (default 0)")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-op GPU time tables")
    a = ap.parse_args(argv)
    apply_device(a)
    if a.tokens < 1 or a.prompt < 1:
        ap.error("--tokens and --prompt must be ≥ 1")
    check_sampling(ap, a)
    return a


def run_path(cfg, weights, prompt, args, fused):
    """Generate with one HC path: (tokens, row of numbers, profile or None)."""
    model = Model(cfg, weights, fused=fused, prefill_chunk=min(16, len(prompt)))
    mem = model.memory()
    sampling = Sampling(args.temperature, args.top_k, args.seed)
    list(model.generate(prompt, 2, sampling))          # record both graphs, compile the pipelines
    model.timing.update(steps=0, step_s=0.0, submit_s=0.0)
    t0 = time.perf_counter()
    stamps, tokens = [], []
    for tok in model.generate(prompt, args.tokens, sampling):
        stamps.append(time.perf_counter())
        tokens.append(tok)
    decode_s = stamps[-1] - stamps[0]
    tm = model.timing
    row = {"prefill_ms": 1e3 * (stamps[0] - t0),
           "tokens_per_s": (len(tokens) - 1) / decode_s if len(tokens) > 1 else float("nan"),
           "dispatches": model.compiled("decode").recording.n_dispatches,
           "host_us": 1e6 * (tm["step_s"] - tm["submit_s"]) / max(tm["steps"], 1),
           "paths": sorted({f"{p.op}:{p.path}" for p in model.paths()}),
           "memory": mem}
    prof = None
    if not args.no_profile:
        with profile.profile() as prof:
            list(model.generate(prompt, args.tokens, sampling))
    return tokens, row, prof


def main(argv=None):
    args = parse(argv or [])
    dev = default_device()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint
        if path is None:
            path = args.out or os.path.join(tmp, "dsv4-demo")
            write_random(path, preset(args.preset), args.seed, args.dtype)
            print(f"wrote a random {args.preset} checkpoint ({args.dtype} linears, seed {args.seed}) to {path}")
        cfg, weights = load_hf(path, max_ctx=args.prompt + args.tokens + 2)
    prompt = np.random.default_rng(args.seed).integers(0, cfg.vocab_size, args.prompt)
    print(f"device: {dev.name}, subgroup size {dev.subgroup_size}")
    print(f"model: DeepSeek-V4, vocab {cfg.vocab_size}, D {cfg.hidden_size}, {cfg.num_hidden_layers} layers "
          f"({', '.join(SHORT[t] for t in cfg.layer_types)}) × 2 HC sites, {cfg.num_attention_heads} "
          f"query heads × {cfg.head_dim} on one shared K=V head, {cfg.n_routed_experts} experts top-"
          f"{cfg.num_experts_per_tok} + 1 shared ({cfg.scoring_func}; {', '.join(cfg.mlp_layer_types)})")
    print(f"prompt {args.prompt} tokens, generating {args.tokens}, "
          f"{'greedy' if args.temperature <= 0 or args.top_k == 1 else f'temperature {args.temperature} top-{args.top_k}'}\n")
    results = {}
    for name, fused in (("fused", True), ("unfused", False)):
        try:
            results[name] = run_path(cfg, weights, prompt, args, fused)
        except HCUnsupported as e:
            print(f"{name}: not available on this device: {e}")
    print(f"{'path':8s} {'tokens/s':>9s} {'ms/token':>9s} {'dispatches/token':>17s} {'host µs/step':>13s} "
          f"{'prefill ms':>11s}  HC kernels")
    for name, (_, r, _) in results.items():
        print(f"{name:8s} {r['tokens_per_s']:9.1f} {1e3 / r['tokens_per_s']:9.2f} {r['dispatches']:17d} "
              f"{r['host_us']:13.1f} {r['prefill_ms']:11.1f}  {', '.join(r['paths'])}")
    for name, (_, r, _) in list(results.items())[:1]:
        mem = r["memory"]
        print("device memory: weights " + ", ".join(f"{v / 2**20:.2f} MiB {k}" for k, v in mem["weights"].items())
              + f"; decode cache and tables {mem['cache'] / 2**20:.2f} MiB")
    for name, (_, _, prof) in results.items():
        if prof is not None:
            print(f"\nGPU time per op, {name} path (a profiled rerun: a timestamp after every dispatch):")
            print(prof.table())
    if len(results) == 2:
        (ta, _, _), (tb, _, _) = results["fused"], results["unfused"]
        same = ta == tb
        print(f"\ntokens (fused):   {ta}")
        if not same:
            print(f"tokens (unfused): {tb}")
        print(f"same tokens on both paths: {'yes' if same else 'NO'}")
        if results["unfused"][1]["tokens_per_s"] > 0:
            print(f"decode speed-up of the fused HC ops: "
                  f"{results['fused'][1]['tokens_per_s'] / results['unfused'][1]['tokens_per_s']:.2f}×")
        return 0 if same else 1
    return 0
