"""A device's end of life: close() while other threads are inside calls on it, and the Vulkan
objects of a compile that fails.

Each check runs in a subprocess with a timeout: a deadlock fails the test (with every thread's stack,
from faulthandler) instead of hanging the suite, and a crash (a destroyed handle used) fails it too."""
import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, timeout, *args, **env_vars):
    e = {**os.environ, **env_vars}
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                              text=True, env=e, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired as t:
        raise AssertionError(f"timed out after {timeout} s (a deadlock?):\n{t.stdout}\n{t.stderr}") from None


# --- close() racing with calls in other threads -------------------------------------------------------

CLOSE_RACE = r"""
import faulthandler, os, random, sys, threading, time, traceback
import numpy as np, dsv4_vk as dv

ATTEMPTS, HANG_S = int(sys.argv[1]), 10
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (2, 4, 16)).astype(np.float32)
fn = rng.uniform(-0.1, 0.1, (24, 64)).astype(np.float32)
scale, base = np.ones(3, np.float32), np.zeros(24, np.float32)
x = rng.uniform(-1, 1, (2, 24)).astype(np.float32)

def scale_graph():
    g = dv.Graph(); g.output("y", g.op("SCALE", g.input("x", (2, 24)), a=2.0))
    return g

with dv.Device() as ref_dev:
    want_pre = dv.hc_site_pre(X, fn, scale, base, device=ref_dev)

def same(got, want):
    if not all(np.array_equal(g, w) for g, w in zip(got, want)):
        raise AssertionError("a call that completed returned a wrong result")

def attempt(seed):
    dev = dv.Device()
    assert dev.validation == (os.environ.get("DSV4_VK_VALIDATION") == "1")
    site, Xt, prog = dv.HcSite(fn, scale, base, device=dev), dev.tensor(X), scale_graph().compile(dev)
    Xw = dev.tensor(X)
    # every worker loops one kind of call: the numpy API (execute, read), a resident site on device
    # tensors (execute_into), a program run (execute, read), a new program compiled and submitted,
    # a new tensor (a buffer and its upload), a tensor's own write and read (its mapped memory)
    calls = [lambda: same(dv.hc_site_pre(X, fn, scale, base, device=dev), want_pre),
             lambda: site.pre(Xt),
             lambda: same([prog.run(x=x)["y"]], [2 * x]),
             lambda: scale_graph().compile(dev).submit(x=x).wait(),
             lambda: dev.tensor(x),
             lambda: (Xw.write(X), same([Xw.numpy(), Xw.read_at(5, 3)], [X, X.reshape(-1)[5:8]]))]
    for call in calls:      # warm: the pipelines exist, so that the race is mostly with steady-state calls
        call()
    outcome = [None] * len(calls)
    start = threading.Barrier(len(calls) + 1)

    def worker(i):
        start.wait()
        try:
            for _ in range(10**6):
                calls[i]()
            outcome[i] = "finished"
        except dv.DeviceClosed:
            outcome[i] = "DeviceClosed"
        except BaseException as e:
            outcome[i] = repr(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(random.Random(seed).uniform(0, 0.03))
    dev.close()
    deadline = time.monotonic() + HANG_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t for t in threads if t.is_alive()]
    if alive:
        frames = sys._current_frames()
        stacks = "".join("".join(traceback.format_stack(frames[t.ident])) for t in alive if t.ident in frames)
        raise AssertionError(f"attempt {seed}: {len(alive)} worker(s) still inside a call {HANG_S} s after "
                             f"close():\n{stacks}")
    return outcome

outcomes = {}
for seed in range(ATTEMPTS):
    faulthandler.dump_traceback_later(3 * HANG_S, exit=True)    # close() stuck: every stack, exit status 1
    for o in attempt(seed):
        outcomes[o] = outcomes.get(o, 0) + 1
    faulthandler.cancel_dump_traceback_later()
print("outcomes", sorted(outcomes.items()))
"""


# Devices one process opens in turn (each attempt opens one): the H200's driver refused the 31st
# vkCreateInstance of a process (results/h200/device_reopen_h200.txt), so the attempts
# run in processes of at most this many.
ATTEMPTS_PER_PROCESS = 20


@pytest.mark.parametrize("validation, attempts", [("0", 100), ("1", 40)], ids=["plain", "validation"])
def test_close_while_threads_are_inside_calls(validation, attempts):
    """close() while six threads loop calls on the device, many times: no deadlock, no crash, and
    every call either completes (with the right result) or raises DeviceClosed. Under the validation
    layer close() also raises if anything was left (a compile cut short by close(), say)."""
    outcomes = {}
    for _ in range(0, attempts, ATTEMPTS_PER_PROCESS):
        r = _run(CLOSE_RACE, 150, ATTEMPTS_PER_PROCESS, DSV4_VK_VALIDATION=validation)
        assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-6000:])
        for k, n in ast.literal_eval(r.stdout.strip().split("outcomes ", 1)[1]):
            outcomes[k] = outcomes.get(k, 0) + n
    assert set(outcomes) <= {"finished", "DeviceClosed"}, outcomes
    assert outcomes.get("DeviceClosed"), outcomes


# --- a compile that fails ---------------------------------------------------------------------------

FAILED_COMPILE = """
import numpy as np, dsv4_vk as dv
from dsv4_vk.vk import recorder

dev = dv.Device()
assert dev.validation
m, s, b = np.zeros((2, 24), np.float32), np.ones(3, np.float32), np.zeros(24, np.float32)
failed = []

def fails(what, call, expected=Exception):
    try:
        call()
    except expected as e:
        failed.append(f"{what}: {type(e).__name__}")
    else:
        raise AssertionError(f"{what} did not fail")

def injected(*args, **kw):
    raise RuntimeError("injected")

fails("n_iter past 32 bits", lambda: dv.hc_comb(m, s, b, n_iter=2**33, device=dev))
# failures injected at each step of a recording: a dispatch, the recording's fence, its command buffer
for owner, name in [(recorder.Recorder, "dispatch"), (dev, "create_fence"), (dev, "allocate_command_buffer")]:
    real = getattr(owner, name)
    setattr(owner, name, injected)
    try:
        for T in (3, 4):                 # new shapes: each call compiles
            fails(f"{name} raising", lambda: dv.hc_comb(np.zeros((T, 24), np.float32), s, b, device=dev),
                  RuntimeError)
    finally:
        setattr(owner, name, real)
assert dv.hc_comb(m, s, b, device=dev).shape == (2, 4, 4)      # the device still works
dev.close()                             # ValidationError if a command pool, buffer or fence was left
assert not dev.validation_messages, dev.validation_messages
print("ok", failed)
"""


def test_failed_compile_releases_what_it_created():
    """Compiles that fail part way (arguments that cannot be packed, failures injected while
    recording) leave no Vulkan object behind: under the validation layer close() reports none."""
    r = _run(FAILED_COMPILE, 120, DSV4_VK_VALIDATION="1")
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-6000:])
    assert r.stdout.strip().startswith("ok"), r.stdout


# --- buffers and memory left at close() ---------------------------------------------------------------

# Each case on a fresh device with no mapped device memory (DSV4_VK_FORCE_STAGING=1: the memory layout
# of a discrete GPU, where programs make a mapped upload/download buffer pair and mapped tensors have
# buffers of their own outside the pool), under the validation layer: close() raises ValidationError
# if a VkBuffer or VkDeviceMemory is still alive at vkDestroyDevice. Deterministic forms of what the
# close race above left on an H200 (two VkBuffers and their VkDeviceMemory), which lavapipe's timing
# never showed.
LEFT_AT_CLOSE = r"""
import gc, sys, threading, time
import numpy as np, dsv4_vk as dv
from dsv4_vk.vk import memory
from dsv4_vk.vk.memory import Buffer
from dsv4_vk.vk.tensor import Tensor

x = np.ones((2, 24), np.float32)

def program(dev):
    g = dv.Graph(); g.output("y", g.op("SCALE", g.input("x", (2, 24)), a=2.0))
    prog = g.compile(dev)
    prog.submit(x=x).wait()         # (no mapped device memory: this makes its mapped upload/download pair)
    return prog

def closing(dev, action):
    # close() in a thread while this thread is inside a counted call: `action` runs once close() has
    # begun (calls are refused) and before it destroys anything
    errors = []
    def close():
        try:
            dev.close()
        except BaseException as e:
            errors.append(e)
    dev.begin_use()
    t = threading.Thread(target=close)
    t.start()
    while not dev._closing:
        time.sleep(0.001)
    try:
        action()
    finally:
        dev.end_use()
    t.join(60)
    assert not t.is_alive(), "close() hangs"
    if errors:
        raise errors[0]

def dropped_before_close(dev):      # its finalizer queues the pair for the pool (free_later) ...
    prog = program(dev)
    del prog
    gc.collect()
    dev.close()                     # ... and close() dropped the pool's queue

def host_visible_tensor_dropped(dev):       # a mapped tensor's own buffer, queued the same way
    t = Tensor(dev, (4, 24), host_visible=True)
    t.write(np.ones((4, 24), np.float32))
    del t
    dev.close()

def finalized_while_closing(dev):   # its finalizer leaves everything to close() (calls are refused)
    prog = program(dev)
    def drop():
        nonlocal prog
        prog = None
        gc.collect()
    closing(dev, drop)

def released_while_closing(dev):    # release() likewise drops its pair without destroying it
    prog = program(dev)
    closing(dev, prog.release)

def made_as_close_begins(dev):      # a buffer made by an uncounted caller: close() does not wait for it
    real = dev._find_memory
    started = []
    def find_memory(*a, **kw):      # (called between vkCreateBuffer and the placement in a block)
        if not started:
            started.append(threading.Thread(target=dev.close))
            started[0].start()
            while not dev._closing:
                time.sleep(0.001)
            time.sleep(0.1)         # (close() goes on as far as it can)
        return real(*a, **kw)
    dev._find_memory = find_memory
    try:
        buf = Buffer(dev, 1024, host_visible=True)
    except dv.DeviceClosed:
        buf = None
    started[0].join(60)
    assert dev.closed
    if buf is not None:             # made before close() destroyed everything: destroyed with it
        try:
            buf.write(np.zeros(4, np.float32))
        except dv.DeviceClosed:
            pass
        else:
            raise AssertionError("a buffer made as close() ran can still be written")

def floor_measured_as_close_begins(dev):     # the floor tool's recorder: its command pool made as close() runs
    from dsv4_vk.cli import floor
    real = dev.create_command_pool
    started = []
    def create_command_pool():
        if not started:
            started.append(threading.Thread(target=dev.close))
            started[0].start()
            while not dev._closing:
                time.sleep(0.001)
            time.sleep(0.1)         # (close() goes on as far as it can: not past a counted call)
        return real()
    dev.create_command_pool = create_command_pool
    try:
        floor.submit_roundtrip_us(dev, replays=2)
    except dv.DeviceClosed:
        pass
    else:
        raise AssertionError("a measurement overtaken by close() completed")
    started[0].join(60)
    assert dev.closed

def kept_block(dev):                # KEEP_BLOCKS: an emptied shared block stays allocated until close()
    memory.KEEP_BLOCKS = True
    try:
        Buffer(dev, 1024).destroy()
        assert dev.memory_stats()["allocations"] == 1
        dev.close()
    finally:
        memory.KEEP_BLOCKS = False

for case in sys.argv[1:]:
    dev = dv.Device()
    assert dev.validation and not dev.is_host_visible
    globals()[case](dev)            # ValidationError from close(): a VkBuffer or VkDeviceMemory was left
    assert dev.closed and not dev.validation_messages, dev.validation_messages
    print("ok", case)
"""


@pytest.mark.parametrize("case", ["dropped_before_close", "host_visible_tensor_dropped", "finalized_while_closing",
                                  "released_while_closing", "made_as_close_begins", "floor_measured_as_close_begins",
                                  "kept_block"])
def test_close_destroys_every_buffer_and_memory(case):
    """close() destroys every VkBuffer and VkDeviceMemory, also those of buffers whose owners dropped
    them without destroying them (a program finalized or released just before or while close() runs:
    its mapped pair), of a buffer made by an uncounted caller as close() begins, and emptied blocks
    kept for reuse; a floor measurement whose recorder starts as close() begins ends in DeviceClosed
    with nothing left behind (close() waits for it: no command pool made on a destroyed device)."""
    r = _run(LEFT_AT_CLOSE, 120, case, DSV4_VK_VALIDATION="1", DSV4_VK_FORCE_STAGING="1")
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-6000:])
    assert r.stdout.strip() == f"ok {case}", r.stdout


DROPPED = """
import gc, json, weakref
import numpy as np, dsv4_vk as dv

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2 ** 20

def dropped_device():
    dev = dv.Device()                        # used, then dropped without close()
    x = dev.tensor(np.ones((8, 64), np.float32))
    dv.hc_comb(dev.tensor(np.ones((2, 24), np.float32)), dev.tensor(np.ones(3, np.float32)),
               dev.tensor(np.zeros(24, np.float32)), device=dev).numpy()
    site = dv.HcSite(np.ones((24, 256), np.float32), np.ones(3, np.float32), np.zeros(24, np.float32), device=dev)
    site.pre(dev.tensor(np.ones((1, 4, 64), np.float32)))
    return weakref.ref(dev)

for _ in range(3):                           # the driver's and the caches' one-time memory
    dropped_device()
    gc.collect()
before = rss_mib()
refs = []
for _ in range(20):
    refs.append(dropped_device())
    gc.collect()                             # (the cycles a device is part of wait for the collector)
print(json.dumps({"growth_mib": rss_mib() - before, "alive": sum(r() is not None for r in refs)}))
"""


def test_a_device_dropped_without_close_is_freed_when_collected():
    """Each device holds ~5.6 MiB of the process (its Vulkan instance and device): 20 dropped without
    close() grew it by over 100 MiB. Collected, each now frees what close() would."""
    r = _run(DROPPED, 300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["alive"] == 0 and got["growth_mib"] < 20, got
