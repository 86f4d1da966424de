"""Decode speed of the DeepSeek-V4-shaped model with fused and with unfused hyper-connection ops,
and the Python host time of a decode step at two layer counts. JSON to --out.

    python tools/model_gpu_bench.py --out results/h200/model_bench.json      (H200: D 4096, 4 layers)
    python tools/model_gpu_bench.py --quick --out /tmp/model_bench.json      (a small dry run anywhere)

Defaults: D = 4096, 4 layers, 32 heads × 128, 8 routed experts top-2 + 1 shared. The vocabulary
(8192) and the expert width (1024) are smaller than DeepSeek-V4's: they size the LM head and the
expert products, not the hyper-connection work this bench is about. Random weights (seed 0).
Per path: decode tokens/s and ms/token (wall: write position, submit + wait, read token),
dispatches and barriers per token, GPU ms per token and per op from a profiled rerun (a timestamp
after every dispatch), and whether both paths produce the same greedy tokens. Host: the Python
time of a decode step outside submit + wait (median and p90 over the steps), and of the same steps
with submit + wait replaced by nothing, for `--host-layers` (default 2 and 8) at D = `--host-dim`
(default 1024): it must not grow with layers (target ≤ 100 µs). Before each timed series the GPU is
kept busy for `--warm-ms` (floor.ClockWarmer; default 500 on GPUs): an idle GPU runs at a low
shader clock (H200: 345 against 1980 MHz, docs/hc_ops.md), and the weights upload leaves it idle.
"""
import argparse
import json
import os
import sys
import time

import numpy as np


from dsv4_vk.cli import floor
from dsv4_vk.core import profile
from dsv4_vk.model import Config, Model, random_weights
from dsv4_vk.vk import default_device

HOST_TARGET_US = 100.0


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-dim", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps timed per path")
    ap.add_argument("--host-layers", default="2,8")
    ap.add_argument("--host-dim", type=int, default=1024)
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each timed series "
                    "(default 500 on GPUs, 0 on CPU devices)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a dry run on lavapipe)")
    a = ap.parse_args(argv)
    if a.quick:
        a.dim, a.layers, a.heads, a.experts, a.expert_dim, a.vocab = 64, 2, 4, 4, 64, 256
        a.prompt, a.tokens, a.host_dim = 4, 8, 32
    a.host_layers = [int(v) for v in a.host_layers.split(",")]
    return a


def config(a, dim, layers):
    heads = min(a.heads, dim // 2)
    return Config(vocab=a.vocab, dim=dim, n_layers=layers, n_heads=heads, head_dim=dim // heads,
                  n_experts=a.experts, top_k=a.top_k, expert_dim=a.expert_dim,
                  max_ctx=a.prompt + max(a.tokens, 8) + 8)


def timed_steps(model, prompt, n, warm=None):
    """Prefill, then n decode steps: (tokens, wall s per step, host s per step outside submit+wait).
    warm: called after the prefill, right before the timed steps (floor.ClockWarmer)."""
    model.reset()
    model.prefill(prompt)
    if warm is not None:
        warm()
    toks, wall, host = [model.next_token], [], []
    tm = model.timing
    for _ in range(n):
        s0, sub0 = tm["step_s"], tm["submit_s"]
        t0 = time.perf_counter()
        toks.append(model.step())
        wall.append(time.perf_counter() - t0)
        host.append((tm["step_s"] - s0) - (tm["submit_s"] - sub0))
    return toks, np.array(wall), np.array(host)


def decode_path(cfg, weights, prompt, a, fused, warm):
    model = Model(cfg, weights, fused=fused)
    timed_steps(model, prompt, 4)                          # record both graphs, warm the pipelines
    toks, wall, host = timed_steps(model, prompt, a.tokens, warm)
    rec = model.compiled("decode").recording
    with profile.profile() as prof:
        with profile.phase("decode"):
            timed_steps(model, prompt, min(a.tokens, 16))
    ph = prof.as_dict()["phases"]["decode"]
    runs = max(ph["runs"], 1)
    ops = sorted(ph["ops"].items(), key=lambda kv: -kv[1]["gpu_ms"])
    return toks, {
        "tokens_per_s": float(1.0 / np.median(wall)), "ms_per_token": float(1e3 * np.median(wall)),
        "dispatches_per_token": rec.n_dispatches, "barriers_per_token": rec.n_barriers,
        "host_us_per_step_median": float(1e6 * np.median(host)),
        "gpu_ms_per_token_profiled": ph["gpu_ms"] / runs,
        "gpu_ms_per_token_by_op": {k: v["gpu_ms"] / runs for k, v in ops},
        "dispatches_per_token_by_op": {k: v["dispatches"] / runs for k, v in ops},
        "hc_paths": sorted({f"{op}:{path}" for op, path, _ in model.paths()}),
    }


def host_time(a, layers, fused, warm):
    cfg = config(a, a.host_dim, layers)
    model = Model(cfg, random_weights(cfg, 0), fused=fused)
    prompt = np.arange(a.prompt) % cfg.vocab
    timed_steps(model, prompt, 4)
    _, wall, host = timed_steps(model, prompt, a.tokens, warm)
    # the step's Python alone: the same steps with submit + wait replaced by nothing
    model.reset()
    model.prefill(prompt)
    rec = model.compiled("decode").recording
    rec.submit = lambda: None
    t0 = time.perf_counter()
    for _ in range(a.tokens):
        model.step()
    python_us = 1e6 * (time.perf_counter() - t0) / a.tokens
    del rec.submit
    return {"host_us_median": float(1e6 * np.median(host)), "host_us_p90": float(1e6 * np.percentile(host, 90)),
            "python_us_per_step_without_gpu": python_us, "step_ms_median": float(1e3 * np.median(wall)),
            "dispatches_per_token": rec.n_dispatches}


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    dev = default_device()
    cfg = config(a, a.dim, a.layers)
    print(f"device {dev.name}, subgroup {dev.subgroup_size}; model {cfg.to_json()}", flush=True)
    t0 = time.perf_counter()
    weights = random_weights(cfg, 0)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab, a.prompt)
    print(f"random weights: {sum(w.size for w in weights.values()) / 1e6:.0f} M parameters in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    warm_ms = floor.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms
    warm = floor.ClockWarmer(dev, warm_ms)
    res = {"device": dev.name, "subgroup_size": dev.subgroup_size, "config": json.loads(cfg.to_json()),
           "warm_ms": warm_ms,
           "note": "vocab and expert width are smaller than DeepSeek-V4's (LM head and expert products only)",
           "decode_steps_timed": a.tokens, "decode": {}, "host": {}, "host_target_us": HOST_TARGET_US}
    tokens = {}
    for name, fused in (("fused", True), ("unfused", False)):
        tokens[name], res["decode"][name] = decode_path(cfg, weights, prompt, a, fused, warm)
        r = res["decode"][name]
        print(f"{name:8s} {r['tokens_per_s']:9.1f} tokens/s  {r['ms_per_token']:8.3f} ms/token  "
              f"{r['dispatches_per_token']:6d} dispatches/token  host {r['host_us_per_step_median']:.1f} µs/step",
              flush=True)
    res["same_greedy_tokens"] = tokens["fused"] == tokens["unfused"]
    res["decode_speedup_fused_over_unfused"] = (res["decode"]["fused"]["tokens_per_s"]
                                                / res["decode"]["unfused"]["tokens_per_s"])
    del weights
    for layers in a.host_layers:
        res["host"][str(layers)] = {name: host_time(a, layers, fused, warm) for name, fused in (("fused", True), ("unfused", False))}
        for name, r in res["host"][str(layers)].items():
            print(f"host, {layers} layers, D {a.host_dim}, {name:8s}: {r['host_us_median']:6.1f} µs median "
                  f"({r['host_us_p90']:.1f} p90) outside submit+wait, {r['python_us_per_step_without_gpu']:.1f} µs "
                  f"with no GPU work, {r['dispatches_per_token']} dispatches", flush=True)
    print(f"same greedy tokens: {res['same_greedy_tokens']}; fused/unfused decode speed-up "
          f"{res['decode_speedup_fused_over_unfused']:.2f}x")
    warm.close()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
