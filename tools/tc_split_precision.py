#!/usr/bin/env python3
"""Whether the mixes mat-mul could run on 16-bit tensor cores at fp32 accuracy: numpy emulation of
x @ fnᵀ (x [T, 4·D] in the spec's U[-1, 1], fn [24, 4·D] as the cases draw it) with each operand
split into fp16 hi + lo parts, the three products hi·hi + hi·lo + lo·hi formed exactly (an fp16
product fits fp32) and accumulated in fp32 per 16-deep k-step, as a cooperative-matrix kernel would.
fn is scaled by a power of two first (its lo parts would otherwise be fp16 subnormals). Prints NMSE
and max |error| against float64, beside fp32 FMA sums and plain fp16 — the numbers docs/hc_ops.md
quotes for the tensor-core route to HC_MIX at copy bandwidth.

    python tools/tc_split_precision.py [--t 256] [--d 4096]
"""
import argparse

import numpy as np


def split16(a, scale):
    a = (a * np.float32(scale)).astype(np.float32)
    hi = a.astype(np.float16)
    return hi.astype(np.float64), (a - hi.astype(np.float32)).astype(np.float16).astype(np.float64)


def tensor_core_product(x, fn, fn_scale, terms=3):
    xh, xl = split16(x, 1.0)
    fh, fl = split16(fn, fn_scale)
    out = np.zeros((x.shape[0], fn.shape[0]), np.float32)
    for k0 in range(0, x.shape[1], 16):
        s = slice(k0, k0 + 16)
        step = xh[:, s] @ fh[:, s].T + xh[:, s] @ fl[:, s].T
        if terms == 3:
            step += xl[:, s] @ fh[:, s].T
        out = (out + step.astype(np.float32)).astype(np.float32)
    return out.astype(np.float64) / fn_scale


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--t", type=int, default=256)
    ap.add_argument("--d", type=int, default=4096)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    K = 4 * a.d
    x = rng.uniform(-1, 1, (a.t, K)).astype(np.float32)
    fn = (rng.uniform(-1, 1, (24, K)) * 2 / np.sqrt(K)).astype(np.float32)
    ref = x.astype(np.float64) @ fn.astype(np.float64).T

    def row(label, r):
        err = r - ref
        print(f"{label:42s} NMSE {(err ** 2).sum() / (ref ** 2).sum():.2e}   max |error| {np.abs(err).max():.2e}")

    print(f"T = {a.t}, D = {a.d}: mixes x @ fnᵀ against float64")
    row("fp32 sums (the FMA kernels)", (x @ fn.T).astype(np.float64))
    row("fp16 hi/lo, 3 products, fn unscaled", tensor_core_product(x, fn, 1.0))
    row("fp16 hi/lo, 3 products, fn × 2^10", tensor_core_product(x, fn, 1024.0))
    row("fp16 hi/lo, 2 products (no lo·hi), fn × 2^10", tensor_core_product(x, fn, 1024.0, terms=2))
    row("plain fp16", x.astype(np.float16).astype(np.float64) @ fn.astype(np.float16).astype(np.float64).T)


if __name__ == "__main__":
    main()
