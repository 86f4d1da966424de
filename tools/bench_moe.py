#!/usr/bin/env python3
"""GPU time of MUL_MAT_ID at one token (the decode step's experts) at DeepSeek-V4-Flash's widths,
bf16 experts or the published FP4 ones (--formats bf16,fp4: E2M1 codes and a scale per 32
inputs; fp8 too), in GB/s of the expert bytes read (codes and scales) and as a share of the
measured copy bandwidth,
with its load knobs side by side in one run (tuning knobs mul_mat_id.*): the steps in flight per
lane (unroll) and, for the weighted sum, the routes whose rows are loaded together (routes) and
the lanes of a workgroup-wide cluster per output (wg; 0: subgroup-lane clusters). Each
row: median over replays of a recording that runs the op `--repeat` times back to back (a
timestamp before and after only), after the clock warm-up.

    . .vkdev/enter.sh; python3 tools/bench_moe.py --json $OUT/moe.json
    . .vkdev/enter.sh; python3 tools/bench_moe.py --formats fp4 --experts 256 --routes-per-token 6 \
        --routes 1 --unroll 4,8,16 --rows 1,2,4 --json $OUT/moe_fp4.json
    . .vkdev/enter.sh; python3 tools/bench_moe.py --formats fp4 --experts 256 --routes-per-token 6 \
        --routes 1 --wg 0 --unroll 4 --load 4,16 --json $OUT/moe_fp4_load.json
(quantised experts load one route at a time: --routes 1)
"""
import argparse
import itertools
import json

import numpy as np

from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import median_gpu_us
from dsv4_vk.core.graph import Graph
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.core.tuning import tuned
from dsv4_vk.ops.mul_mat import QUANT, quant_arrays
from dsv4_vk.vk import default_device


def make_experts(fmt, E, N, K, rng):
    """(arrays: w[, scale bytes], op params, bytes of one expert) of E random N × K experts."""
    if fmt == "bf16":
        w = (rng.standard_normal((E, N, K), dtype=np.float32) / np.sqrt(K)).astype(BF16)
        return [w], {}, N * K * 2
    q = QUANT[fmt]
    codes = rng.integers(0, 256, (E, N, K * q.bits // 8), dtype=np.uint8)
    if fmt == "fp8":
        codes[(codes & 0x7F) == 0x7F] = 0x38
    sr, sc = q.grid(N, K)
    scale = rng.integers(100, 110, (E, sr, sc), dtype=np.uint8)
    words, sw = quant_arrays(codes, scale)
    return [words, sw], {"wq": fmt}, (codes.nbytes + scale.nbytes) // E


def op_graph(mode, w, params, per_expert, K, route, norm, rng):
    """(graph, inputs, weight bytes read): the SwiGLU (optionally with the FFN norm) or the sum,
    over experts of K inputs."""
    R = route.shape[1]
    g = Graph()
    scale = [g.const(a) for a in w[1:]]
    if mode == "swiglu":
        extra = ([g.const(rng.standard_normal(K).astype(np.float32))], {"rms_eps": 1e-6}) if norm else ([], {})
        g.output("y", g.op("MUL_MAT_ID", g.input("x", (1, 1, K)), g.const(w[0]), g.const(route), *extra[0], *scale,
                           mode="swiglu", limit=10.0, **extra[1], **params))
        x = rng.standard_normal((1, 1, K)).astype(np.float32)
    else:
        g.output("y", g.op("MUL_MAT_ID", g.input("x", (1, R, K)), g.const(w[0]), g.const(route), *scale, mode="sum",
                           **params))
        x = rng.standard_normal((1, R, K)).astype(np.float32)
    return g, {"x": x}, R * per_expert


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=4, help="ops back to back per recording")
    ap.add_argument("--experts", type=int, default=65, help="experts stacked in w (the model's 64 + shared)")
    ap.add_argument("--routes-per-token", type=int, default=7, help="R: top-k + the shared expert")
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--f", type=int, default=2048)
    ap.add_argument("--unroll", default="2,4,8")
    ap.add_argument("--routes", default="1,2,4,8", help="the sum's routes loaded together, to sweep")
    ap.add_argument("--wg", default="0,64,256", help="the sum's workgroup lanes per output (0: subgroup clusters)")
    ap.add_argument("--formats", default="bf16", help="expert formats to compare: bf16, fp4, fp8")
    ap.add_argument("--rows", default="1", help="quantised experts: the sum's output rows a cluster to sweep "
                    "(1, 2, 4)")
    ap.add_argument("--load", default="4", help="quantised experts: bytes of codes a lane loads a step to "
                    "compare (knob mul_mat_id.load: 4, 16)")
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each row (default 500 on GPUs)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    dev = default_device()
    rng = np.random.default_rng(0)
    E, R, D, Fd = a.experts, a.routes_per_token, a.d, a.f
    route = np.zeros((1, R, 2), np.float32)
    route[0, :, 0] = rng.permutation(E)[:R]
    route[0, :, 1] = rng.random(R)
    unrolls = [int(u) for u in a.unroll.split(",")]
    rows = []
    with F.ClockWarmer(dev, F.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms) as warm:
        copy = F.copy_gbps(dev, warm=warm)
        print(f"{dev.name}: copy {copy:.0f} GB/s; {E} experts, {R} routes a token, D {D}, F {Fd}", flush=True)
        for fmt in a.formats.split(","):
            w13 = make_experts(fmt, E, 2 * Fd, D, rng)
            w2 = make_experts(fmt, E, D, Fd, rng)
            nrs = [int(v) for v in a.rows.split(",")] if fmt != "bf16" else [1]
            loads = [int(v) for v in a.load.split(",")] if fmt != "bf16" else [4]
            cases = [("swiglu", w13, norm, u, None, None, 1, ld) for norm in (False, True) for u in unrolls
                     for ld in loads]
            cases += [("sum", w2, False, u, r, wg, nr, ld) for wg, r, u, nr, ld in itertools.product(
                (int(v) for v in a.wg.split(",")), [int(v) for v in a.routes.split(",")], unrolls, nrs, loads)]
            for mode, (w, params, per_expert), norm, unroll, routes, wg, nr, load in cases:
                K = D if mode == "swiglu" else Fd
                with tuned({"mul_mat_id.unroll": unroll, "mul_mat_id.routes": routes, "mul_mat_id.wg": wg,
                            "mul_mat_id.rows": nr, "mul_mat_id.load": load}):
                    g, inputs, nbytes = op_graph(mode, w, params, per_expert, K, route, norm, rng)
                    us = median_gpu_us(dev, g, inputs, a.replays, warm, a.repeat)
                gbps = nbytes / (us * 1e3)
                rows.append({"format": fmt, "mode": mode, "norm": norm, "unroll": unroll, "routes": routes, "wg": wg,
                             "rows_per_cluster": nr, "load_bytes": load, "bytes": nbytes, "us": us, "gbps": gbps,
                             "pct_copy": 100 * gbps / copy})
                print(f"{fmt:4s} {mode:6s}{' +norm' if norm else '      '} unroll={unroll:2d} routes={routes or '-'} "
                      f"wg={wg or '-':3} rows={nr} load={load:2d} {us:8.1f} µs {gbps:7.0f} GB/s {100 * gbps / copy:5.1f}% of copy",
                      flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev.name, "copy_gbps": copy, "experts": E, "routes_per_token": R, "d": D, "f": Fd,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
