#!/usr/bin/env python3
"""GPU time of MUL_MAT at one token (the decode GEMV) at DeepSeek-V4-Flash's projection shapes,
bf16 weights, in GB/s of the weights read and as a share of the measured copy bandwidth, with
its load knobs side by side in one run (ops.mul_mat.GEMV_UNROLL): a workgroup per output where
outputs are few (spread) against subgroup-lane clusters, and the steps in flight per lane (unroll);
plain and with the RMS norm folded in. Each row: median over replays of a recording that runs the
mat-mul `--repeat` times back to back (a timestamp before and after only), after the clock warm-up.

    . .vkdev/enter.sh; python3 tools/bench_gemv.py --json $OUT/gemv.json
"""
import argparse
import itertools
import json

import numpy as np

from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import median_gpu_us
from dsv4_vk.core.graph import Graph
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.ops import mul_mat
from dsv4_vk.vk import default_device

# (label, N outputs, K inputs): the head, q's up-projection, o's two, q's and kv's down-projections
SHAPES = [("head", 129280, 4096), ("wq_b", 32768, 1024), ("wo_b", 4096, 8192), ("wo_a", 8192, 4096),
          ("wq_a", 1024, 4096), ("wkv", 512, 4096)]


def time_gemv(device, weights, norm, replays, repeat, warm, rng):
    N, K = weights.shape
    g = Graph()
    norm_w = [g.const(rng.standard_normal(K).astype(np.float32))] if norm else []
    args = [g.input("x", (1, K)), g.const(weights)] + norm_w
    g.output("y", g.op("MUL_MAT", *args, **({"rms_eps": 1e-6} if norm else {})))
    return median_gpu_us(device, g, {"x": rng.standard_normal((1, K)).astype(np.float32)}, replays, warm, repeat)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=4, help="mat-muls back to back per recording")
    ap.add_argument("--unroll", default="1,4,8", help="steps in flight per lane to sweep")
    ap.add_argument("--spread", default="-1,0", help="lanes the GPU should have at work (-1: the default "
                    "GEMV_SPREAD; 0: subgroup-lane clusters only)")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="of " + ", ".join(s[0] for s in SHAPES))
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each row (default 500 on GPUs)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    dev = default_device()
    rng = np.random.default_rng(0)
    shapes = [s for s in SHAPES if s[0] in a.shapes.split(",")]
    rows = []
    with F.ClockWarmer(dev, F.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms) as warm:
        copy = F.copy_gbps(dev, warm=warm)
        print(f"{dev.name}: copy {copy:.0f} GB/s", flush=True)
        for (label, N, K), norm in itertools.product(shapes, (False, True)):
            if not norm:
                weights = (rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K)).astype(BF16)
            for spread, unroll in itertools.product(map(int, a.spread.split(",")), map(int, a.unroll.split(","))):
                spread = None if spread < 0 else spread
                mul_mat.GEMV_UNROLL.update(unroll=unroll, spread=spread)
                try:
                    wg = mul_mat.gemv_workgroup_lanes(dev, N, K)
                    us = time_gemv(dev, weights, norm, a.replays, a.repeat, warm, rng)
                finally:
                    mul_mat.GEMV_UNROLL.update(unroll=None, spread=None)
                gbps = N * K * 2 / (us * 1e3)
                rows.append({"shape": label, "N": N, "K": K, "norm": norm, "spread": spread, "wg_lanes": wg,
                             "unroll": unroll, "us": us, "gbps": gbps, "pct_copy": 100 * gbps / copy})
                print(f"{label:5s} ({N:6d}, {K:5d}){' +norm' if norm else '      '} wg lanes={wg or '-':3} "
                      f"unroll={unroll}  {us:8.1f} µs {gbps:7.0f} GB/s {100 * gbps / copy:5.1f}% of copy", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev.name, "copy_gbps": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
