"""Graphs run under the Khronos validation layer (synchronization validation on) report nothing;
a deliberately missing barrier is reported (so the check can fail)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import sys, numpy as np, dsv4_vk as dv
from dsv4_vk.vk import Recorder, default_device
dev = default_device()
assert dev.validation
rng = np.random.default_rng()
ex = dv.Executor(timestamps=True)
g = dv.Graph()
x = g.input("x", (37, 5)); w = g.const(rng.standard_normal(37).astype(np.float32))
y = g.op("SCALE", x, a=2.0, b=0.5)
z = g.op("MUL", y.transpose(), w)                  # broadcast + transposed view
s = g.op("SIGMOID", g.op("DIV", z, g.op("EXP", z)))
g.op("ADD", s, s, out=z)                           # write into an existing tensor (WAR/WAW)
g.output("z", z)
for _ in range(2):
    ex.run(g, x=rng.standard_normal((37, 5)))
extra = sys.argv[1:]
if "hazard" in extra:                              # the same two dispatches with no barrier
    pipe = dev.pipelines.get("unary", 2, {"OP_SCALE": 1}, (64,))
    a, b = dev.pool.alloc(1024), dev.pool.alloc(1024)
    push = np.array([1, 1, 1, 64, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1], np.uint32).tobytes() + bytes(8)
    r = Recorder(dev); r.dispatch(pipe, [a, b], push, (1, 1, 1)); r.dispatch(pipe, [b, a], push, (1, 1, 1))
    r.finish().submit()
for sev, msg in dev.validation_messages:
    print(sev, msg[:300])
print("messages", len(dev.validation_messages))
"""


def _worker(*args):
    env = {**os.environ, "DSV4_VK_VALIDATION": "1"}
    return subprocess.run([sys.executable, "-c", WORKER, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_graphs_are_clean_under_validation():
    r = _worker()
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("messages 0"), r.stdout


def test_missing_barrier_is_reported():
    r = _worker("hazard")
    assert r.returncode == 0, r.stderr
    assert "SYNC-HAZARD-READ-AFTER-WRITE" in r.stdout

