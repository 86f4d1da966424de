"""Graphs run under the Khronos validation layer (synchronization validation on) report nothing;
a deliberately missing barrier raises ValidationError from the call that recorded it (so the check
can fail, and no message is left unseen in a list)."""
import os
import subprocess
import sys

import pytest

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
# the library path: device tensors copied in and out around recordings, sites, programs, threads
import threading
X = dev.tensor(rng.uniform(-1, 1, (3, 4, 16)))
site = dv.HcSite(rng.uniform(-0.1, 0.1, (24, 64)), rng.uniform(-0.5, 0.5, 3), rng.uniform(-0.2, 0.2, 24), device=dev)
def step():
    for _ in range(3):
        u, post, comb = site.pre(X)
        site.post(u, X, post, comb, out=dev.empty((3, 4, 16)))
        dv.hc_comb(dev.tensor(rng.uniform(-2, 2, (2, 24))), np.zeros(3), np.zeros(24))
step()
workers = [threading.Thread(target=step) for _ in range(2)]
for t in workers: t.start()
for t in workers: t.join()
pg = dv.Graph(); xi = pg.input("X", (3, 4, 16)); u, post, comb = site.pre_graph(pg, xi)
pg.output("X_new", site.post_graph(pg, u, xi, post, comb)); prog = pg.compile(dev)
for _ in range(2):
    prog.submit({"X": X}, out={"X_new": X}).wait()
extra = sys.argv[1:]
if "hazard" in extra:                              # the same two dispatches with no barrier
    pipe = dev.pipelines.get("unary", 2, {"OP_SCALE": 1}, (64,))
    a, b = dev.pool.alloc(1024), dev.pool.alloc(1024)
    push = np.array([1, 1, 1, 64, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1], np.uint32).tobytes() + bytes(8)
    r = Recorder(dev); r.dispatch(pipe, [a, b], push, (1, 1, 1)); r.dispatch(pipe, [b, a], push, (1, 1, 1))
    try:
        r.finish()
    except dv.ValidationError as e:
        print("raised by finish:", str(e)[:400])
        dev.validation_messages.clear()
for sev, msg in dev.validation_messages:
    print(sev, msg[:300])
print("messages", len(dev.validation_messages))
"""


def _worker(*args, staging=False):
    env = {**os.environ, "DSV4_VK_VALIDATION": "1", "DSV4_VK_FORCE_STAGING": "1" if staging else "0"}
    return subprocess.run([sys.executable, "-c", WORKER, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.mark.parametrize("staging", [False, True], ids=["direct", "staging"])
def test_graphs_are_clean_under_validation(staging):
    r = _worker(staging=staging)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("messages 0"), r.stdout


def test_missing_barrier_raises_at_the_call():
    r = _worker("hazard")
    assert r.returncode == 0, r.stderr
    assert "raised by finish:" in r.stdout and "SYNC-HAZARD-READ-AFTER-WRITE" in r.stdout, r.stdout
    assert r.stdout.strip().endswith("messages 0"), r.stdout

