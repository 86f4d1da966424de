#!/usr/bin/env python3
"""GPU time of the primitive kernels at DeepSeek-V4 shapes: MUL_MAT along each kernel (gemv,
gemm_regs, gemm_shared) and the row ops. Median over replays of one recorded command buffer
(per-dispatch timestamps), with GFLOP/s for MUL_MAT and GB/s (inputs + output moved once).

    python tools/bench_primitives.py [--replays 10] [--quick] [--json out.json]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.ops.mul_mat import pick_kernel

MATMULS = [   # (T, K, N): decode and prefill projections, the HC mixes (K = 4·4096, N = 24)
    (1, 4096, 4096), (1, 16384, 24), (4, 4096, 4096), (8, 4096, 4096), (64, 4096, 4096),
    (512, 4096, 4096), (512, 16384, 24)]
ROWS = [("RMS_NORM", (1, 16384), {"eps": 1e-6}), ("RMS_NORM", (512, 4096), {"eps": 1e-6}),
        ("SOFT_MAX", (512, 4, 4), {}), ("SOFT_MAX", (32, 512, 512), {"scale": 0.125}),
        ("SUM_ROWS", (512, 4, 4), {})]


def gpu_ms(ex, g, feeds, replays):
    ex.run(g, **feeds)                                   # compile, record, warm up
    times = []
    for _ in range(replays):
        ex.run(g, **feeds)
        times.append(float(np.sum(ex.last.stats.gpu_ns)) / 1e6)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="small shapes only (CPU devices)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)
    ex = Executor(timestamps=True)
    rng = np.random.default_rng(0)
    print(f"device: {ex.device.name} ({ex.device.caps.type}, subgroup {ex.device.subgroup_size})")
    results = []
    for T, K, N in MATMULS:
        if args.quick and T * K * N > 2**26:
            continue
        x = rng.standard_normal((T, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        line = [f"MUL_MAT T={T:4d} K={K:5d} N={N:5d} (auto: {pick_kernel(ex.device, T, N).kernel})"]
        for kernel in ("gemv", "gemm_regs", "gemm_shared"):
            if ex.device.caps.type == "cpu" and kernel == "gemm_shared" and T * N > 4096:
                continue                                   # barrier-bound on lavapipe: minutes
            g = Graph()
            g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(w), kernel=kernel))
            ms = gpu_ms(ex, g, {"x": x}, args.replays)
            gflops, gbs = 2 * T * K * N / ms / 1e6, 4 * (T * K + N * K + T * N) / ms / 1e6
            line.append(f"{kernel} {ms:8.3f} ms {gflops:7.1f} GF/s {gbs:6.1f} GB/s")
            results.append({"op": "MUL_MAT", "T": T, "K": K, "N": N, "kernel": kernel, "ms": ms,
                            "gflops": gflops, "gbs": gbs})
        print(" | ".join(line), flush=True)
    for op, shape, params in ROWS:
        a = rng.standard_normal(shape).astype(np.float32)
        g = Graph()
        y = g.op(op, g.input("x", shape), **params)
        g.output("y", y)
        ms = gpu_ms(ex, g, {"x": a}, args.replays)
        gbs = 4 * (a.size + int(np.prod(y.shape))) / ms / 1e6
        print(f"{op:8s} {str(shape):16s} {ms:8.3f} ms {gbs:6.1f} GB/s", flush=True)
        results.append({"op": op, "shape": shape, "ms": ms, "gbs": gbs})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": ex.device.name, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
