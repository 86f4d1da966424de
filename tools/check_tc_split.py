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
from dsv4_vk.vk import default_device
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.executor import Executor
from dsv4_vk.hc import kernels as K

dev = default_device()
ex = Executor(dev)
T, D, m = 64, 256, 24
rng = np.random.default_rng(1)
x0 = rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)
f0 = (rng.uniform(-1, 1, (m, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32)
ex16 = lambda a, s: ((a * s).astype(np.float16).astype(np.float32) / s).astype(np.float32)
for name, x, f in [("both exact", ex16(x0, 2**-8), ex16(f0, 1)), ("x exact", ex16(x0, 2**-8), f0),
                   ("f exact", x0, ex16(f0, 1)), ("neither", x0, f0)]:
    ref = x.reshape(T, -1).astype(np.float64) @ f.astype(np.float64).T
    mag = np.abs(x.reshape(T, -1)).astype(np.float64) @ np.abs(f.astype(np.float64)).T
    for tc in (1, 2):
        lay = K.mix_layout(dev, T, D // 4, kernel="tc")
        lay["tc"] = tc
        g = Graph()
        tx, tf = g.input("X", x.shape), g.input("fn", f.shape)
        g.output("p", g.op("HC_MIX_PART", tx, tf, **lay))
        try:
            p = ex.run(g, X=x, fn=f)["p"]
        except Exception as e:
            print(name, tc, type(e).__name__, e); continue
        dot = p[:, :, :m].sum(1)
        print(f"{name:10s} tc={tc} max rel err {np.max(np.abs(dot - ref) / mag):.3g}  "
              f"ssq rel {np.max(np.abs(p[:, :, m].sum(1) / (x.reshape(T,-1).astype(np.float64)**2).sum(1) - 1)):.3g}")
