"""tc = 3 (HC_MIX_PART from registers) against float64 on this device."""
import sys, numpy as np
sys.path.insert(0, "."); sys.path.insert(0, "tests")
from dsv4_vk.vk.device import Device
from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk import hc
from dsv4_vk.hc import mix_kernels, kernels as K
dev = Device()
ex = Executor(dev)
print("tcr layout:", mix_kernels.tcr_layout(dev), flush=True)
rng = np.random.default_rng(1)
for tt in (1, 2):
  for tc in (0,):
      for T, D, m, split in ((4096, 4096, 24, 64) if "cpu" not in dev.caps.type else (130, 512, 24, 32), (100, 256, 24, 16), (1, 4096, 24, 64), (77, 1024, 4, 32), (300, 7168, 24, 64) if "cpu" not in dev.caps.type else (20, 448, 8, 16)):
          X = rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)
          X[:, :, ::7] *= 1e-4
          fn = rng.uniform(-1, 1, (m, 4 * D)).astype(np.float32)
          mix_kernels.MIX_TUNING.update(kernel="tcr", tt=tt, split=split)
          try:
              g = Graph(); x = g.input("X", X.shape); f = g.input("fn", fn.shape)
              g.output("m", hc.mixes(g, x, f))
              out = ex.run(g, X=X, fn=fn)["m"]
              bad = ex.last.check_guards()
          except Exception as e:
              print(f"tc={tc} tt={tt} T={T}: {type(e).__name__}: {e}"); continue
          finally:
              mix_kernels.MIX_TUNING.update(kernel=None, tt=None, split=None)
          ref = K.reference_mixes(X, fn)
          nmse = float(((out - ref) ** 2).sum() / (ref ** 2).sum())
          print(f"tc={tc} tt={tt} T={T} D={D} m={m} split={split}: nmse {nmse:.3g} maxabs {np.abs(out-ref).max():.3g} guards {bad} nodes {[n.op.name for n in g.nodes]}", flush=True)
