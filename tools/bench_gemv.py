#!/usr/bin/env python3
"""GPU time of MUL_MAT at one token (the decode GEMV) at DeepSeek-V4-Flash's projection shapes,
bf16 weights or the published FP8 ones (--formats bf16,fp8: E4M3 codes and a scale per 128 × 128
block; fp4 too), in GB/s of the weight bytes read (codes and scales) and as a share of the measured
copy bandwidth, with
its load knobs side by side in one run (tuning knobs gemv.unroll, gemv.spread): a workgroup per output where
outputs are few (spread) against subgroup-lane clusters, and the steps in flight per lane (unroll);
plain and with the RMS norm folded in. Each row: median over replays of a recording that runs the
mat-mul `--repeat` times back to back (a timestamp before and after only), after the clock warm-up.

    . .vkdev/enter.sh; python3 tools/bench_gemv.py --json $OUT/gemv.json
    . .vkdev/enter.sh; python3 tools/bench_gemv.py --formats fp8 --shapes wq_b,wo_b,wo_a,wq_a,wkv \
        --unroll 4,8,16 --rows 1,2,4 --json $OUT/gemv_fp8.json
    . .vkdev/enter.sh; python3 tools/bench_gemv.py --formats fp8,fp4 --load 4,16 --json $OUT/gemv_load.json
"""
import argparse
import itertools
import json

import numpy as np

from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import median_gpu_us
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.ops import mul_mat
from dsv4_vk.ops.mul_mat import QUANT, quant_arrays
from dsv4_vk.vk import default_device

# (label, N outputs, K inputs): the head, q's up-projection, o's two, q's and kv's down-projections
SHAPES = [("head", 129280, 4096), ("wq_b", 32768, 1024), ("wo_b", 4096, 8192), ("wo_a", 8192, 4096),
          ("wq_a", 1024, 4096), ("wkv", 512, 4096)]


def make_weights(fmt, N, K, rng):
    """(weight arrays: w[, scale bytes], op params, bytes read a token) of random N × K weights."""
    if fmt == "bf16":
        w = (rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K)).astype(BF16)
        return [w], {}, w.nbytes
    q = QUANT[fmt]
    codes = rng.integers(0, 256, (N, K * q.bits // 8), dtype=np.uint8)
    if fmt == "fp8":
        codes[(codes & 0x7F) == 0x7F] = 0x38                      # no NaN codes
    scale = rng.integers(100, 110, q.grid(N, K), dtype=np.uint8)
    words, sw = quant_arrays(codes, scale)
    return [words, sw], {"wq": fmt}, codes.nbytes + scale.nbytes


def time_gemv(device, weights, params, K, norm, replays, repeat, warm, rng):
    g = Graph()
    norm_w = [g.const(rng.standard_normal(K).astype(np.float32))] if norm else []
    args = [g.input("x", (1, K)), g.const(weights[0])] + norm_w + [g.const(a) for a in weights[1:]]
    g.output("y", g.op("MUL_MAT", *args, **params, **({"rms_eps": 1e-6} if norm else {})))
    return median_gpu_us(device, g, {"x": rng.standard_normal((1, K)).astype(np.float32)}, replays, warm, repeat)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=4, help="mat-muls back to back per recording")
    ap.add_argument("--unroll", default="1,4,8", help="steps in flight per lane to sweep")
    ap.add_argument("--spread", default="-1,0", help="lanes the GPU should have at work (-1: the default "
                    "GEMV_SPREAD; 0: subgroup-lane clusters only)")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="of " + ", ".join(s[0] for s in SHAPES))
    ap.add_argument("--formats", default="bf16", help="weight formats to compare: bf16, fp8, fp4")
    ap.add_argument("--rows", default="1", help="quantised weights: output rows a cluster to sweep "
                    "(knob gemv_quant.rows: 1, 2, 4)")
    ap.add_argument("--load", default="4", help="quantised weights: bytes of codes a lane loads a step to "
                    "compare (knob gemv_quant.load: 4, 16)")
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
        for fmt, (label, N, K), norm in itertools.product(a.formats.split(","), shapes, (False, True)):
            if not norm:
                weights, params, nbytes = make_weights(fmt, N, K, rng)
            knobs = itertools.product(map(int, a.spread.split(",")), map(int, a.unroll.split(",")),
                                      map(int, a.rows.split(",") if fmt != "bf16" else ["1"]),
                                      map(int, a.load.split(",") if fmt != "bf16" else ["4"]))
            for spread, unroll, nr, load in knobs:
                spread = None if spread < 0 else spread
                with tuned({"gemv.unroll": unroll, "gemv.spread": spread, "gemv_quant.rows": nr, "gemv_quant.load": load}):
                    wg = mul_mat.gemv_workgroup_lanes(dev, -(-N // nr), K)
                    us = time_gemv(dev, weights, params, K, norm, a.replays, a.repeat, warm, rng)
                gbps = nbytes / (us * 1e3)
                rows.append({"format": fmt, "shape": label, "N": N, "K": K, "norm": norm, "spread": spread,
                             "wg_lanes": wg, "unroll": unroll, "rows_per_cluster": nr, "load_bytes": load, "bytes": nbytes, "us": us,
                             "gbps": gbps, "pct_copy": 100 * gbps / copy})
                print(f"{fmt:4s} {label:5s} ({N:6d}, {K:5d}){' +norm' if norm else '      '} wg lanes={wg or '-':3} "
                      f"unroll={unroll:2d} rows={nr} load={load:2d} {us:8.1f} µs {gbps:7.0f} GB/s {100 * gbps / copy:5.1f}% of copy",
                      flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev.name, "copy_gbps": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
