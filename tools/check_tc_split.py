#!/usr/bin/env python3
"""The tensor-core mixes kernel's fp16 split on a device: HC_MIX_PART with tc = 1 (cooperative
matrices, where the device has them) and tc = 2 (its FMA form), the partial dot products summed
over the D splits against float64, relative to Σ|x|·|fn|, on X and fn that are exact in fp16 (after
X's scale 2⁻⁸) or not. An error near 1e-7 in every row: hi and lo both reach the products. Near
3e-5 where inputs are inexact but 1e-7 where they are exact: the lo parts are lost (what the H200's
compiler did to f32(f16(a)) before the split rounded by integer arithmetic).

    . .vkdev/enter.sh; python3 tools/check_tc_split.py
"""
import numpy as np

from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.hc import HCUnsupported, mix_kernels
from dsv4_vk.vk import default_device


def fp16_exact(a, scale):
    """a with a·scale rounded to fp16 (so that a·scale splits into hi alone)."""
    return ((a * scale).astype(np.float16).astype(np.float32) / scale).astype(np.float32)


def main(T=64, D=256, m=24, seed=1):
    dev = default_device()
    ex = Executor(dev)
    rng = np.random.default_rng(seed)
    x0 = rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)
    f0 = (rng.uniform(-1, 1, (m, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32)
    for name, x, f in [("both exact", fp16_exact(x0, 2**-8), fp16_exact(f0, 1)),
                       ("x exact", fp16_exact(x0, 2**-8), f0), ("f exact", x0, fp16_exact(f0, 1)),
                       ("neither", x0, f0)]:
        xf = x.reshape(T, -1).astype(np.float64)
        ref, mag = xf @ f.astype(np.float64).T, np.abs(xf) @ np.abs(f.astype(np.float64)).T
        for tc in (1, 2):
            lay = {**mix_kernels.mix_layout(dev, T, D // 4, kernel="tc"), "tc": tc}
            g = Graph()
            g.output("p", g.op("HC_MIX_PART", g.input("X", x.shape), g.input("fn", f.shape), **lay))
            try:
                p = ex.run(g, X=x, fn=f)["p"]
            except HCUnsupported as e:                   # tc = 1 without cooperative matrices
                print(f"{name:10s} tc={tc} {e}")
                continue
            dot, ssq = p[:, :, :m].sum(1), p[:, :, m].sum(1)
            print(f"{name:10s} tc={tc} max error {np.max(np.abs(dot - ref) / mag):.3g} of Σ|x|·|fn|, "
                  f"Σx² {np.max(np.abs(ssq / (xf ** 2).sum(1) - 1)):.3g} relative")


if __name__ == "__main__":
    main()
