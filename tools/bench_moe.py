#!/usr/bin/env python3
"""GPU time of MUL_MAT_ID at one token (the decode step's experts) at DeepSeek-V4-Flash's widths,
bf16 experts, in GB/s of the expert weights read and as a share of the measured copy bandwidth,
with its load knobs side by side in one run (ops.moe.MUL_MAT_ID_UNROLL): the steps in flight per
lane (unroll) and, for the weighted sum, the routes whose rows are loaded together (routes) and
the lanes of a workgroup-wide cluster per output (wg; 0: subgroup-lane clusters). Each
row: median over replays of a recording that runs the op `--repeat` times back to back (a
timestamp before and after only), after the clock warm-up.

    . .vkdev/enter.sh; python3 tools/bench_moe.py --json $OUT/moe.json
"""
import argparse
import itertools
import json

import numpy as np

from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import median_gpu_us
from dsv4_vk.core.graph import Graph
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.ops import moe
from dsv4_vk.vk import default_device


def op_graph(mode, w, route, norm, rng):
    """(graph, inputs, weight bytes read): the SwiGLU (optionally with the FFN norm) or the sum."""
    E, N, K = w.shape
    R = route.shape[1]
    g = Graph()
    if mode == "swiglu":
        extra = ([g.const(rng.standard_normal(K).astype(np.float32))], {"rms_eps": 1e-6}) if norm else ([], {})
        g.output("y", g.op("MUL_MAT_ID", g.input("x", (1, 1, K)), g.const(w), g.const(route), *extra[0],
                           mode="swiglu", limit=10.0, **extra[1]))
        x = rng.standard_normal((1, 1, K)).astype(np.float32)
    else:
        g.output("y", g.op("MUL_MAT_ID", g.input("x", (1, R, K)), g.const(w), g.const(route), mode="sum"))
        x = rng.standard_normal((1, R, K)).astype(np.float32)
    return g, {"x": x}, R * N * K * 2


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
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each row (default 500 on GPUs)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    dev = default_device()
    rng = np.random.default_rng(0)
    E, R, D, Fd = a.experts, a.routes_per_token, a.d, a.f
    route = np.zeros((1, R, 2), np.float32)
    route[0, :, 0] = rng.permutation(E)[:R]
    route[0, :, 1] = rng.random(R)
    w13 = (rng.standard_normal((E, 2 * Fd, D), dtype=np.float32) / np.sqrt(D)).astype(BF16)
    w2 = (rng.standard_normal((E, D, Fd), dtype=np.float32) / np.sqrt(Fd)).astype(BF16)
    unrolls = [int(u) for u in a.unroll.split(",")]
    cases = [("swiglu", w13, norm, u, None, None) for norm in (False, True) for u in unrolls]
    cases += [("sum", w2, False, u, r, wg) for wg, r, u in itertools.product(
        (int(v) for v in a.wg.split(",")), [int(v) for v in a.routes.split(",")], unrolls)]
    rows = []
    with F.ClockWarmer(dev, F.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms) as warm:
        copy = F.copy_gbps(dev, warm=warm)
        print(f"{dev.name}: copy {copy:.0f} GB/s; {E} experts, {R} routes a token, D {D}, F {Fd}", flush=True)
        for mode, w, norm, unroll, routes, wg in cases:
            g, inputs, nbytes = op_graph(mode, w, route, norm, rng)
            moe.MUL_MAT_ID_UNROLL.update(unroll=unroll, routes=routes, wg=wg)
            try:
                us = median_gpu_us(dev, g, inputs, a.replays, warm, a.repeat)
            finally:
                moe.MUL_MAT_ID_UNROLL.update(unroll=None, routes=None, wg=None)
            gbps = nbytes / (us * 1e3)
            rows.append({"mode": mode, "norm": norm, "unroll": unroll, "routes": routes, "wg": wg, "us": us,
                         "gbps": gbps, "pct_copy": 100 * gbps / copy})
            print(f"{mode:6s}{' +norm' if norm else '      '} unroll={unroll} routes={routes or '-'} wg={wg or '-':3} "
                  f"{us:8.1f} µs {gbps:7.0f} GB/s {100 * gbps / copy:5.1f}% of copy", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev.name, "copy_gbps": copy, "experts": E, "routes_per_token": R, "d": D, "f": Fd,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
