"""TCR (HC_MIX_FN_SPLIT + HC_MIX_TCR) against float64 on this device: the mixes of random X (a seventh of
its values scaled by 1e-4, where the fp16 split goes subnormal) at several T, D, m and split sizes, with
16-token tiles tt = 1 and 2. On a device without TCR's cooperative matrices this runs the emulation.

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; python3 tools/tcr_check.py
"""
import numpy as np

from dsv4_vk import hc
from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.hc import kernels as K, mix_kernels, tcr
from dsv4_vk.vk.device import Device

dev = Device()
ex = Executor(dev)
gpu = not dev.caps.is_cpu
print("tcr layout:", tcr.tcr_layout(dev), flush=True)
rng = np.random.default_rng(1)
cases = [(4096, 4096, 24, 64) if gpu else (130, 512, 24, 32), (100, 256, 24, 16), (1, 4096, 24, 64), (77, 1024, 4, 32),
         (300, 7168, 24, 64) if gpu else (20, 448, 8, 16)]
for tt in (1, 2):
    for T, D, m, split in cases:
        X = rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)
        X[:, :, ::7] *= 1e-4
        fn = rng.uniform(-1, 1, (m, 4 * D)).astype(np.float32)
        mix_kernels.MIX_TUNING.update(kernel="tcr", tt=tt, split=split)
        try:
            g = Graph()
            g.output("m", hc.mixes(g, g.input("X", X.shape), g.input("fn", fn.shape)))
            out = ex.run(g, X=X, fn=fn)["m"]
            bad = ex.last.check_guards()
        except Exception as e:          # e.g. HCUnsupported: tt = 2's shared memory on a small device
            print(f"tt={tt} T={T} D={D}: {type(e).__name__}: {e}")
            continue
        finally:
            mix_kernels.MIX_TUNING.update(kernel=None, tt=None, split=None)
        ref = K.reference_mixes(X, fn)
        nmse = float(((out - ref) ** 2).sum() / (ref ** 2).sum())
        print(f"tt={tt} T={T} D={D} m={m} split={split}: nmse {nmse:.3g} maxabs {np.abs(out - ref).max():.3g} "
              f"guards {bad} nodes {[n.op.name for n in g.nodes]}", flush=True)
