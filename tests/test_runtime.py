"""The Vulkan layer itself: device choice and its errors, buffers and the staging path, the pool,
recording, barriers, timestamps and replay."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dsv4_vk.vk import Buffer, Device, Recorder, VulkanUnavailable, pack_push

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, **env):
    e = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=ROOT,
                          timeout=300)


@pytest.mark.parametrize("selector, message", [("7", "only 1 device"), ("no-such-gpu", "matches no device")])
def test_device_selector_errors_name_the_choices(selector, message):
    with pytest.raises(VulkanUnavailable, match=message) as e:
        Device(selector=selector)
    assert "llvmpipe" in str(e.value)


def test_device_selector_by_index_and_name():
    for sel in ("0", "llvm"):
        d = Device(selector=sel)
        assert d.caps.type == "cpu"
        d.close()


def test_missing_glslang_is_a_clear_error():
    r = _run("from dsv4_vk.vk import compile_shader; compile_shader('unary', {'OP_EXP': 1})",
             PATH="/nonexistent", DSV4_VK_CACHE_DIR="/tmp/dsv4_vk_empty_cache_test")
    assert r.returncode != 0
    assert "glslangValidator was not found" in r.stderr and "glslang-tools" in r.stderr


def test_missing_driver_is_a_clear_error():
    r = _run("import dsv4_vk.vk as v; v.Device()", VK_DRIVER_FILES="/nonexistent.json",
             VK_ICD_FILENAMES="/nonexistent.json")
    assert r.returncode != 0
    assert "mesa-vulkan-drivers" in r.stderr


def test_staging_path_round_trips_and_runs_graphs():
    # discrete GPUs have no host-visible device memory: force that path on lavapipe
    code = """
import numpy as np, dsv4_vk as dv
ex = dv.Executor()
assert not ex.device.is_host_visible
rng = np.random.default_rng()
x = rng.standard_normal((3000, 7)).astype(np.float32)
g = dv.Graph(); t = g.input("x", x.shape); g.output("y", g.op("SCALE", t.transpose(), a=3.0, b=-1.0))
y = ex.run(g, x=x)["y"]
assert np.abs(y - (3.0 * x.T - 1.0)).max() < 1e-5, "wrong result through staging"
assert ex.last.check_guards() == []
print("ok")
"""
    r = _run(code, DSV4_VK_FORCE_STAGING="1")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_buffer_bounds_and_pool_reuse(device):
    b = device.pool.alloc(1000)
    with pytest.raises(ValueError, match="exceeds buffer"):
        b.write(np.zeros(2000, np.float32))
    with pytest.raises(ValueError, match="exceeds buffer"):
        b.read(b.nbytes - 4, 8)
    device.pool.free(b)
    assert device.pool.alloc(900) is b  # same bucket comes back


def test_recorder_barriers_only_on_hazards_and_replay(device):
    pipe = device.pipelines.get("unary", 2, {"OP_SCALE": 1}, (64,))
    a, b, c = (device.pool.alloc(4 * 64 + 512) for _ in range(3))
    n = 64

    def push(src_off=64, dst_off=64):
        ints = [1, 1, 1, n, src_off, 0, 0, 0, 1, dst_off, 0, 0, 0, 1]
        return np.array(ints, np.uint32).tobytes() + np.array([2.0, 1.0], np.float32).tobytes()
    rng = (256, 256 + 4 * n)
    rec = Recorder(device, timestamps=True)
    rec.dispatch(pipe, [a, b], push(), (1, 1, 1), reads=[(a, *rng)], writes=[(b, *rng)])
    rec.dispatch(pipe, [a, c], push(), (1, 1, 1), reads=[(a, *rng)], writes=[(c, *rng)])  # independent
    assert rec.n_barriers == 0
    rec.dispatch(pipe, [b, c], push(), (1, 1, 1), reads=[(b, *rng)], writes=[(c, *rng)])  # RAW on b, WAW on c
    assert rec.n_barriers == 1
    r = rec.finish()
    x = np.random.default_rng().standard_normal(n).astype(np.float32)
    for scale in (1.0, -2.0):
        a.write(x * scale, 256)
        r.submit()
        out = c.read(256, 4 * n).view(np.float32)
        np.testing.assert_allclose(out, 2 * (2 * x * scale + 1) + 1, rtol=1e-6, atol=1e-6)
    assert r.n_submits == 2
    t = r.timings()
    assert t.shape == (3,) and (t >= 0).all() and r.total_gpu_ns() > 0
    for buf in (a, b, c):
        device.pool.free(buf)


def test_push_constants_too_large():
    with pytest.raises(ValueError, match="exceed 128"):
        pack_push(*range(33))


def test_every_declared_variant_has_a_push_block_that_parses():
    """Each shader's push_constant block reads as uint/int/float members under every variant its
    header declares (what pack_fields packs against), at most 128 bytes."""
    from dsv4_vk.vk.push import push_block
    from dsv4_vk.vk.shader import SHADER_DIR, declared_variants
    for path in sorted(SHADER_DIR.glob("*.comp")):
        for key in declared_variants(path.stem):
            fields = push_block(path.stem, dict(key))
            assert fields and sum(f.length for f in fields) * 4 <= 128, (path.stem, key)


def test_push_blocks_are_packed_by_field_name_and_checked():
    """A launch's push fields are laid out in the order of the shader's own push_constant block (the
    members its defines select), and a misnamed, missing or extra field, an array of the wrong
    length or a value of the wrong type is refused naming the shader and the field."""
    import struct
    from dsv4_vk.core.opdef import Launch
    from dsv4_vk.vk.push import pack_fields, push_block
    names = [f.name for f in push_block("hc_pre", {"GATE": 1})]
    assert names[:3] == ["T", "n_chunks", "groups_per_token"] and names[-4:] == ["s_off", "b_off", "b_s", "eps"]
    assert [f.name for f in push_block("hc_pre", {})] == names[:-4]         # #if defined(GATE) left out
    fields = {n: i for i, n in enumerate(names[:-1])} | {"eps": 0.5}
    packed = pack_fields("hc_pre", {"GATE": 1}, dict(reversed(fields.items())))    # any order given
    assert struct.unpack(f"<{len(names) - 1}If", packed) == (*range(len(names) - 1), 0.5)
    for bad, match in [({**fields, "x_stt": 1}, r"hc_pre.comp: unknown field\(s\) x_stt"),
                       ({k: v for k, v in fields.items() if k != "u_st"}, r"hc_pre.comp: missing field\(s\) u_st"),
                       ({**fields, "T": 1.5}, r"push field T of hc_pre.comp is a uint: expected an integer"),
                       ({**fields, "T": -1}, r"push field T of hc_pre.comp is a uint: -1 is out of its range"),
                       ({**fields, "eps": "x"}, r"push field eps of hc_pre.comp is a float: expected a number")]:
        with pytest.raises(ValueError, match=match):
            Launch("hc_pre", [], (), bad, (1, 1, 1), defines={"GATE": 1})
    with pytest.raises(ValueError, match=r"missing field\(s\) s_off, b_off, b_s, eps"):
        pack_fields("hc_pre", {"GATE": 1}, {n: 0 for n in names[:-4]})           # the GATE members
    block = {f.name: 0 for f in push_block("concat", {})}
    assert len(pack_fields("concat", {}, {**block, "src": [0] * 20})) == 4 * (12 + 20)
    with pytest.raises(ValueError, match=r"push field src of concat.comp is uint\[20\]: expected 20 values"):
        pack_fields("concat", {}, {**block, "src": [0] * 19})


def test_info_cli_json():
    r = _run("from dsv4_vk.__main__ import main; import sys; sys.exit(main(['info', '--json']))")
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads(r.stdout)
    assert rep["subgroup"]["size"] in (4, 8, 16) and rep["timestamps"]["valid_bits"] > 0
    # the float modes a shader may ask for, as widths (lavapipe rounds to nearest even at every width)
    fc = rep["float_controls"]
    assert set(fc) == {"denorm_preserve", "denorm_flush_to_zero", "rounding_rte", "rounding_rtz",
                       "signed_zero_inf_nan_preserve"}
    assert all(set(v) <= {"f16", "f32", "f64"} for v in fc.values()) and "f32" in fc["rounding_rte"]


def test_info_names_both_cooperative_matrix_extensions_and_the_float_modes(device):
    """info reports VK_NV_cooperative_matrix's shapes (the ones the kernels use), VK_KHR_cooperative_matrix's
    (reported only) and the float-controls modes, each "none" where the device has none."""
    from dsv4_vk.cli.info import _human, report
    rep = report(device)
    assert isinstance(rep["coopmat_khr"], (list, tuple)) and isinstance(rep["coopmat"], (list, tuple))
    shape = {"m": 16, "n": 16, "k": 16, "a": "f16", "b": "f16", "c": "f32", "d": "f32"}
    text = _human({**rep, "coopmat": [shape], "coopmat_khr": [dict(shape, a="bf16", b="bf16"), shape],
                   "float_controls": {"denorm_preserve": ["f16", "f32"], "denorm_flush_to_zero": []}})
    assert "coop. matrix  16x16x16 f16·f16+f32\n" in text
    assert "coop. KHR     16x16x16 bf16·bf16+f32, 16x16x16 f16·f16+f32 (VK_KHR_cooperative_matrix: reported" in text
    assert "float modes   denorm preserve: f16 f32; denorm flush to zero: none (what a shader may ask for)" in text
    bare = _human({**rep, "coopmat": [], "coopmat_khr": [], "float_controls": {}})
    assert "coop. KHR     none (" in bare and "float modes   unknown (Vulkan < 1.2)" in bare


@pytest.mark.parametrize("width, size", [(128, 4), (256, 8), (512, 16)])
def test_lavapipe_subgroup_sizes(width, size):
    r = _run("from dsv4_vk.vk import Device; print(Device().subgroup_size)", LP_NATIVE_VECTOR_WIDTH=str(width))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) == size


def test_descriptor_pools_grow_when_exhausted(monkeypatch):
    # more distinct descriptor sets than one pool holds: more pools are created, not an error
    monkeypatch.setattr(Device, "DESCRIPTOR_POOL_SETS", 64)
    d = Device()
    pipe = d.pipelines.get("unary", 2, {"OP_SCALE": 1}, (64,))
    bufs = [d.pool.alloc(256 * (i + 1)) for i in range(40)]
    sets = {d.pipelines.descriptor_set(pipe, [a, b]) for a in bufs for b in bufs}
    assert len(sets) == 1600 and len(d._desc_pools) == 25
    d.close()


def test_buffers_share_memory_blocks():
    # drivers cap live allocations (NVIDIA: 4096): small buffers are sub-allocated from blocks
    d = Device()
    small = [Buffer(d, 4096 + 4 * i) for i in range(300)]
    assert len(d.arena.blocks) == 1
    big = Buffer(d, 40 << 20)                 # over half a block: an allocation of its own
    assert len(d.arena.blocks) == 2 and big.offset == 0
    offsets = sorted((b.offset, b.offset + b.nbytes) for b in small)
    assert all(hi <= lo for (_, hi), (lo, _) in zip(offsets, offsets[1:]))   # no overlap
    for i, b in enumerate(small):
        b.write(np.full(b.nbytes // 4, i, np.float32))
    assert all((b.read().view(np.float32) == i).all() for i, b in enumerate(small))
    for b in small + [big]:
        b.destroy()
    assert not d.arena.blocks                  # every block freed with its last buffer
    d.close()


def test_cli_version_usage_and_device_option():
    import dsv4_vk
    r = _run("from dsv4_vk.cli import main; import sys; sys.exit(main(['--version']))")
    assert r.returncode == 0 and r.stdout.strip() == f"dsv4_vk {dsv4_vk.__version__}"
    r = subprocess.run([sys.executable, "-m", "dsv4_vk"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout.startswith("usage: python -m dsv4_vk ")
    script = os.path.join(os.path.dirname(sys.executable), "dsv4_vk")
    r = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: dsv4_vk ")
    for argv in (["info", "--device", "0"], ["--device", "llvm", "info"]):
        r = subprocess.run([sys.executable, "-m", "dsv4_vk", *argv], capture_output=True, text=True)
        assert r.returncode == 0 and "llvmpipe" in r.stdout, (argv, r.stderr)
    r = subprocess.run([sys.executable, "-m", "dsv4_vk", "info", "--device", "no-such-gpu"], capture_output=True,
                       text=True)
    assert r.returncode == 1 and "'no-such-gpu' matches no device name" in r.stdout + r.stderr
    for cmd in ("eval", "bench", "demo", "generate", "chat", "floor"):
        r = subprocess.run([sys.executable, "-m", "dsv4_vk", cmd, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "--device INDEX|NAME" in r.stdout, cmd


ENV_CHILD = """
import json, warnings
import dsv4_vk
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        dsv4_vk.Device().close()
        dsv4_vk.Device().close()          # a second device reports nothing again
        got = {"type": None}
    except Exception as e:
        got = {"type": type(e).__name__, "message": str(e)}
got["warnings"] = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
print(json.dumps(got))
"""
ENV_CASES = [  # (variable, value, exception type or None, what its message says)
    ("DSV4_VK_DEVICE", "²", "VulkanUnavailable", "DSV4_VK_DEVICE='²' matches no device name"),
    ("DSV4_VK_DEVICE", "9" * 5000, "VulkanUnavailable", "DSV4_VK_DEVICE=9999"),
    ("DSV4_VK_SPIN_US", "1" * 5000, "ValueError", "environment variable DSV4_VK_SPIN_US='111"),
    ("DSV4_VK_SPIN_US", "٣", "ValueError", "environment variable DSV4_VK_SPIN_US='٣' is not understood"),
    ("DSV4_VK_CACHE_BYTES", "7" * 5000 + "M", "ValueError", "environment variable DSV4_VK_CACHE_BYTES='777"),
    ("DSV4_VK_CACHE_BYTES", "²G", "ValueError", "DSV4_VK_CACHE_BYTES='²G' is not understood"),
]


ENV_CASES_CHILD = """
import json, os, sys
import dsv4_vk
out = []
for name, value in json.loads(sys.argv[1]):
    os.environ[name] = value                  # read when a device opens
    try:
        dsv4_vk.Device().close()
        out.append({"type": None})
    except Exception as e:
        out.append({"type": type(e).__name__, "message": str(e)})
    del os.environ[name]
print(json.dumps(out))
"""


def test_env_values_of_odd_digits_name_the_variable():
    """Non-ASCII digits and thousands of digits: an error naming the variable (with the value cut
    short), not int()'s own ValueError. One child process tries them in turn."""
    r = subprocess.run([sys.executable, "-c", ENV_CASES_CHILD, json.dumps([c[:2] for c in ENV_CASES])],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for (name, value, kind, message), got in zip(ENV_CASES, json.loads(r.stdout.strip().splitlines()[-1])):
        assert got.get("type") == kind and message in got["message"], (name, value[:8], got)
        assert len(got["message"]) < 600, (name, got)


def test_unknown_dsv4_vk_variable_is_reported_once():
    r = _run(ENV_CHILD, DSV4_VK_DEVCE="1", DSV4_VK_FROBNICATE="on")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["type"] is None and len(got["warnings"]) == 2, got
    typo, other = sorted(got["warnings"])
    assert typo.startswith("environment variable DSV4_VK_DEVCE is not a dsv4_vk switch (did you mean "
                           "DSV4_VK_DEVICE?), so it changes nothing; the switches are DSV4_VK_DEVICE, ")
    assert other.startswith("environment variable DSV4_VK_FROBNICATE is not a dsv4_vk switch, so")
    for name in ("DSV4_VK_DISABLE_HC_POST", "DSV4_VK_SPIN_US", "DSV4_VK_GLSLANG", "DSV4_VK_HC_COMB_VARIANT"):
        assert name in typo


_UPLOAD = """
import numpy as np, dsv4_vk as dv
from dsv4_vk.vk import Upload
dev = dv.Device()
assert dev.is_host_visible == (STAGED == 0)
rng = np.random.default_rng()
src = rng.integers(0, 256, 1_000_003, dtype=np.uint8)
buf = dev.pool.alloc(src.size + 100)
calls = []
def fill(view, start):
    calls.append((start, view.size))
    view[:] = src[start:start + view.size]
with Upload(dev, workers=3, chunk=1 << 16) as up:
    up.write(buf, 8, src.size, fill)
    assert sorted(calls) == [(s, min(1 << 16, src.size - s)) for s in range(0, src.size, 1 << 16)]
    def bad(view, start):
        if start >= 5 << 16:
            raise ValueError(f"bad at {start}")
        view[:] = 0
    try:
        up.write(buf, 8, src.size, bad)
    except ValueError as e:
        assert str(e) == f"bad at {5 << 16}", e          # the first chunk's error in byte order
    else:
        raise AssertionError("a failing fill was not raised")
    up.write(buf, 8, src.size, fill)                   # usable after
    try:
        up.write(buf, buf.nbytes - 4, 8, fill)
    except ValueError as e:
        assert "exceeds buffer" in str(e)
    else:
        raise AssertionError("an overrun was not refused")
assert np.array_equal(buf.read(8, src.size), src), "wrong bytes"
try:
    up.write(buf, 0, 4, fill)
except RuntimeError as e:
    assert "outside" in str(e)
else:
    raise AssertionError("a write after the Upload ended was taken")
dev.close()
print("ok")
"""


@pytest.mark.parametrize("staged", [0, 1])
def test_upload_streams_chunks_from_threads_in_place_or_through_staging(staged):
    """vk.Upload: every chunk filled once (in the mapped buffer, or in staging slots copied by their
    own submits), the first failing fill's error raised after the others ended, bounds refused."""
    r = _run(f"STAGED = {staged}\n" + _UPLOAD, DSV4_VK_FORCE_STAGING=str(staged))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_staged_uploads_fill_one_slot_while_the_other_copies():
    """A staged upload of several chunks submits the copy of one slot and fills the other before
    waiting for it (double buffering; each copy used to wait before the next chunk was filled), and
    read-backs wait for each copy."""
    code = """
import numpy as np, dsv4_vk as dv
from dsv4_vk.vk import memory
memory.STAGING_CHUNK = 1 << 20
events = []
copy, wait = memory.StagingRing.copy, memory.StagingRing.wait
def copied(self, slot, *a):
    events.append(("copy", self.slots.index(slot)))
    copy(self, slot, *a)
def waited(self, slot):
    if slot.busy:
        events.append(("wait", self.slots.index(slot)))
    wait(self, slot)
memory.StagingRing.copy, memory.StagingRing.wait = copied, waited
dev = dv.Device()
x = np.random.default_rng().integers(0, 256, (5 << 20) + 12, dtype=np.uint8)
b = dev.pool.alloc(x.size)
b.write(x)
assert events[:5] == [("copy", 0), ("copy", 1), ("wait", 0), ("copy", 0), ("wait", 1)], events
assert [e[0] for e in events].count("copy") == 6 and len(events) == 12, events       # 6 copies, all waited for
assert np.array_equal(b.read(0, x.size), x)
dev.close()
print("ok")
"""
    r = _run(code, DSV4_VK_FORCE_STAGING="1")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("staged", [0, 1])
def test_close_waits_for_an_upload_and_a_closed_device_refuses_one(staged):
    """An Upload is a counted call: close() from another thread returns only after it ended (its writes
    completed or raised DeviceClosed, nothing used after its handles went); on a closed device an
    Upload raises DeviceClosed."""
    code = """
import threading, time
import numpy as np, dsv4_vk as dv
from dsv4_vk.vk import Upload
dev = dv.Device()
buf = dev.pool.alloc(1 << 20)
closed = threading.Event()
def fill(view, start):
    time.sleep(0.05)
    view[:] = 1
def closer():
    dev.close()
    closed.set()
with Upload(dev, workers=2, chunk=1 << 16) as up:
    up.write(buf, 0, 1 << 17, fill)
    threading.Thread(target=closer).start()
    time.sleep(0.1)
    try:
        up.write(buf, 0, 1 << 18, fill)
    except dv.DeviceClosed:
        pass
    assert not closed.is_set(), "close() returned while an Upload was running"
assert closed.wait(10), "close() did not return after the Upload ended"
try:
    with Upload(dev) as up:
        pass
except dv.DeviceClosed:
    print("ok")
"""
    r = _run(code, DSV4_VK_FORCE_STAGING=str(staged))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
