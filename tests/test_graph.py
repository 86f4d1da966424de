"""The graph layer: view semantics against numpy, compile-once replay, hazard barriers, errors, the
SPIR-V disk cache and executor params shared by graphs."""
import hashlib
import json
import re

import numpy as np
import pytest

import dsv4_vk.core.recording as recording_module
from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.vk import ShaderCompileError, compile_shader
from dsv4_vk.vk import shader as shader_module

# --- views --------------------------------------------------------------------------------------

VIEWS = {   # name: (Tensor view, the same view in numpy); applied to x of shape (3, 4, 5, 6)
    "reshape": (lambda t: t.reshape(12, 30), lambda a: a.reshape(12, 30)),
    "reshape_infer": (lambda t: t.reshape((3, -1, 6)), lambda a: a.reshape((3, -1, 6))),
    "permute": (lambda t: t.permute(2, 0, 3, 1), lambda a: a.transpose(2, 0, 3, 1)),
    "transpose_last": (lambda t: t.transpose(), lambda a: a.swapaxes(-2, -1)),
    "transpose_0_2": (lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2)),
    "slices_steps_int": (lambda t: t[1:, ::2, 3, -2:], lambda a: a[1:, ::2, 3, -2:]),
    "ellipsis": (lambda t: t[..., 1], lambda a: a[..., 1]),
    "negative_index": (lambda t: t[-1, :, -3], lambda a: a[-1, :, -3]),
    "steps_after_permute": (lambda t: t.permute(3, 1, 0, 2)[1:5:3, :, ::2],
                            lambda a: a.transpose(3, 1, 0, 2)[1:5:3, :, ::2]),
    "broadcast_of_slice": (lambda t: t[0, :, 2:3, 0].broadcast_to((2, 4, 7)),
                           lambda a: np.broadcast_to(a[0, :, 2:3, 0], (2, 4, 7))),
    "broadcast_new_dims": (lambda t: t[1, 2, :, 4].broadcast_to((3, 2, 5)),
                           lambda a: np.broadcast_to(a[1, 2, :, 4], (3, 2, 5))),
    "reshape_of_contiguous_slice": (lambda t: t[1].reshape(20, 6), lambda a: a[1].reshape(20, 6)),
}


def test_views_match_numpy(rng):
    x = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    g = Graph()
    t = g.input("x", x.shape)
    for name, (tv, nv) in VIEWS.items():
        v, a = tv(t), nv(x)
        assert v.shape == a.shape, name
        # same element strides and offset as numpy's view of the same buffer (size-1 dims aside)
        assert all(s == st // 4 for n, s, st in zip(v.shape, v.strides, a.strides) if n > 1), name
        if a.base is not None:
            offset = (a.__array_interface__["data"][0] - x.__array_interface__["data"][0]) // 4
            assert v.offset == offset, name
        assert v.is_contiguous == a.flags.c_contiguous, name
        g.output(name, g.op("CONT", v))
    ex = Executor()
    out = ex.run(g, x=x)
    for name, (_, nv) in VIEWS.items():
        assert np.array_equal(out[name], nv(x)), name
    assert ex.last.check_guards() == []


def test_view_extent_bounds_what_a_kernel_may_touch():
    g = Graph()
    t = g.input("x", (3, 4, 5))
    assert t.extent() == (0, 60)
    assert t[1:, 2, ::2].extent() == (20 + 10, 40 + 10 + 4 + 1)
    assert t[:, 1:1].numel == 0 and t[:, 1:1].extent() == (t[:, 1:1].offset,) * 2


@pytest.mark.parametrize("view, error, message", [
    (lambda t: t.transpose().reshape(60), ValueError, "non-contiguous"),
    (lambda t: t.reshape(7, 9), ValueError, "cannot reshape"),
    (lambda t: t.permute(0, 0, 1), ValueError, "not a permutation"),
    (lambda t: t.broadcast_to((3, 5, 5)), ValueError, "cannot broadcast"),
    (lambda t: t.broadcast_to((4, 5)), ValueError, "fewer dimensions"),
    (lambda t: t[3], IndexError, "out of range"),
    (lambda t: t[::-1], IndexError, "positive slice steps"),
    (lambda t: t[0, 0, 0, 0], IndexError, "too many indices"),
    (lambda t: t.reshape(1, 1, 1, 3, 20), ValueError, "at most 4 dimensions"),
])
def test_bad_views_raise(view, error, message):
    t = Graph().input("x", (3, 4, 5))
    with pytest.raises(error, match=message):
        view(t)


# --- compile once, replay ----------------------------------------------------------------------------

def small_graph(w):
    g = Graph()
    x = g.input("x", (5, 7))
    h = g.op("ADD", x, g.const(w))
    g.output("y", g.op("SOFT_MAX", g.op("SCALE", h, a=2.0, b=0.5)))
    return g


def small_reference(x, w):
    z = 2.0 * (x.astype(np.float64) + w) + 0.5
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_replay_gives_new_results_without_recording(rng, monkeypatch):
    w = rng.standard_normal(7).astype(np.float32)
    ex = Executor()
    g = small_graph(w)
    x1 = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(ex.run(g, x=x1)["y"], small_reference(x1, w), rtol=1e-5, atol=1e-7)
    cg, rec = ex.last, ex.last.recording
    assert rec.n_submits == 1
    # any recording from now on is an error
    monkeypatch.setattr(recording_module, "Recorder", lambda *a, **k: pytest.fail("graph was re-recorded"))
    for _ in range(2):
        x2 = rng.standard_normal((5, 7)).astype(np.float32)
        np.testing.assert_allclose(ex.run(g, x=x2)["y"], small_reference(x2, w), rtol=1e-5, atol=1e-7)
    # an equal graph built again has the same signature: same compiled graph
    np.testing.assert_allclose(ex.run(small_graph(w), x=x1)["y"], small_reference(x1, w), rtol=1e-5, atol=1e-7)
    assert ex.last is cg and cg.recording is rec and rec.n_submits == 4
    assert small_graph(w + 1).signature() != g.signature()      # constants are part of the signature


# --- barriers ---------------------------------------------------------------------------------------

def stats_of(build):
    g = Graph()
    x = g.input("x", (64,))
    build(g, x)
    ex = Executor()
    ex.run(g, x=np.ones(64, np.float32))
    return ex.last.stats


def chain(g, x):
    for _ in range(5):
        x = g.op("SCALE", x, a=2.0)
    g.output("y", x)


def independent(g, x):
    for i in range(5):
        g.output(f"y{i}", g.op("SCALE", x, a=float(i)))


def two_interleaved_chains(g, x):
    a = b = x
    for _ in range(3):
        a = g.op("SCALE", a, a=2.0)
        b = g.op("EXP", b)
    g.output("a", a)
    g.output("b", b)


def disjoint_halves_then_whole(g, x):
    buf = g.empty((64,))
    g.op("SCALE", x[:32], a=2.0, out=buf[:32])         # two writes to disjoint byte ranges:
    g.op("SCALE", x[32:], a=3.0, out=buf[32:])         # no barrier between them
    g.output("y", g.op("SUM_ROWS", buf))               # reads both: one barrier


def write_after_read(g, x):
    buf = g.op("SCALE", x, a=1.0)
    y = g.op("EXP", buf)                               # RAW
    g.op("FILL", out=buf, shape=(64,), value=0.0)      # WAR on buf (y's dispatch read it)
    g.output("y", y)


@pytest.mark.parametrize("build, dispatches, barriers", [
    (chain, 5, 4), (independent, 5, 0), (two_interleaved_chains, 6, 2),
    (disjoint_halves_then_whole, 3, 1), (write_after_read, 3, 2)])
def test_barriers_only_between_dependent_dispatches(build, dispatches, barriers):
    s = stats_of(build)
    assert (s.dispatches, s.barriers) == (dispatches, barriers)


# --- errors -------------------------------------------------------------------------------------------

BAD_GRAPH_CALLS = [   # (message, build(g, x)) where x = g.input("x", (3, 4))
    ("shapes (3, 4) and (5,) do not broadcast", lambda g, x: g.op("ADD", x, g.input("y", (5,)))),
    ("SIGMOID: input 0 has dtype i32; expected f32", lambda g, x: g.op("SIGMOID", g.input("i", (3,), "i32"))),
    ("SCALE: input 0 is empty", lambda g, x: g.op("SCALE", g.input("e", (0, 4)))),
    ("ADD: input 1 is empty", lambda g, x: g.op("ADD", x, x[:, 2:2])),
    ("FILL: shape (2, 0) must have at least one element", lambda g, x: g.op("FILL", shape=(2, 0))),
    ("SCALE parameter a must be a finite number", lambda g, x: g.op("SCALE", x, a=float("nan"))),
    ("FILL value must be a finite number", lambda g, x: g.op("FILL", shape=(2,), value=float("inf"))),
    ("SOFT_MAX scale must be a finite number", lambda g, x: g.op("SOFT_MAX", x, scale=-np.inf)),
    ("RMS_NORM eps must be a finite number", lambda g, x: g.op("RMS_NORM", x, eps=np.nan)),
    ("unknown op 'NOPE'; known ops: ", lambda g, x: g.op("NOPE", x)),
    ("SCALE: input 0 belongs to another graph", lambda g, x: Graph().op("SCALE", x)),
    ("output 'y' belongs to another graph", lambda g, x: Graph().output("y", x)),
    ("ADD takes 2 input tensor(s), got 1", lambda g, x: g.op("ADD", x)),
    ("SCALE: input 0 must be a GraphTensor, got ndarray", lambda g, x: g.op("SCALE", np.ones(3))),
    ("SCALE: out has shape (4, 3) f32, expected (3, 4) f32", lambda g, x: g.op("SCALE", x, out=g.empty((4, 3)))),
    ("graph input 'x' declared twice", lambda g, x: g.input("x", (2,))),
    ("dtype 'f64' not supported", lambda g, x: g.input("h", (2,), "f64")),
]


@pytest.mark.parametrize("message, build", BAD_GRAPH_CALLS, ids=[m[:30] for m, _ in BAD_GRAPH_CALLS])
def test_graph_building_errors(message, build):
    g = Graph()
    with pytest.raises(ValueError) as e:
        build(g, g.input("x", (3, 4)))
    assert message in str(e.value)
    if "unknown op" in message:
        assert "ADD" in str(e.value) and "MUL_MAT" in str(e.value)


@pytest.mark.parametrize("feeds, message", [
    ({"x": np.zeros((3, 5), np.float32)}, "input 'x' has shape (3, 5), expected (3, 4)"),
    ({"x": np.zeros((3, 4), np.int32)}, "input 'x' has dtype int32, expected float32"),
    ({"x": np.zeros((3, 4), np.float32), "z": np.zeros(3)}, "graph has no input 'z'; inputs are ['ids', 'x']"),
    ({"x": np.zeros((3, 4), np.float32), "ids": np.zeros(2, np.float32)},
     "input 'ids' has dtype float32, expected int32"),
])
def test_run_time_input_errors(feeds, message):
    g = Graph()
    x = g.input("x", (3, 4))
    ids = g.input("ids", (2,), "i32")
    g.output("y", g.op("GET_ROWS", x, ids))
    with pytest.raises(ValueError) as e:
        Executor().run(g, **feeds)
    assert message in str(e.value)


def test_missing_param_is_an_error():
    g = Graph()
    g.output("y", g.op("SCALE", g.param("weights", (4,))))
    with pytest.raises(ValueError, match="param 'weights' but the executor has none: call Executor.set_param"):
        Executor().run(g)


# --- shader compilation and its disk cache --------------------------------------------------------

def test_shader_compile_error_names_the_shader(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_VK_CACHE_DIR", str(tmp_path))
    with pytest.raises(ShaderCompileError) as e:
        compile_shader("unary", {"OP_NOT_A_VARIANT": 1})      # not among the header's declared variants
    assert "unary.comp declares no variant with defines {'OP_NOT_A_VARIANT': '1'}" in str(e.value)
    assert "{OP_SCALE=1}" in str(e.value)
    with pytest.raises(ShaderCompileError, match="no_such_shader.comp does not exist"):
        compile_shader("no_such_shader")
    assert not list(tmp_path.glob("unary-*.spv"))              # nothing cached for a failure


def _entries(directory, name):
    return sorted(directory.glob(f"{name}-*" + shader_module.ENTRY_SUFFIX))


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "header_garbage", "checksum", "empty", "swapped",
                                    "other_spirv_with_its_checksum", "not_spirv"])
def test_corrupted_spirv_cache_entry_is_evicted_and_rebuilt(tmp_path, monkeypatch, damage):
    """An entry is used only when it is the one filed under its key and its SPIR-V is sound; else it is
    removed with a warning naming it, and compiled again. Two entries swapped (even with their checksums
    rewritten to match) would run the wrong kernel: the key in each entry's header says so."""
    monkeypatch.setenv("DSV4_VK_CACHE_DIR", str(tmp_path))
    good, other = compile_shader("binary", {"OP_ADD": 1}), compile_shader("binary", {"OP_MUL": 1})
    assert good != other
    (entry,) = [p for p in _entries(tmp_path, "binary") if p.read_bytes().endswith(good)]
    (entry2,) = [p for p in _entries(tmp_path, "binary") if p != entry]
    head, _, body = entry.read_bytes().partition(b"\n")
    meta = json.loads(head)
    assert body == good and meta["defines"] == {"OP_ADD": "1"} and meta["key"] in entry.name
    # a sound entry is served without running the compiler
    monkeypatch.setattr(shader_module.subprocess, "Popen", lambda *a, **k: pytest.fail("recompiled a good entry"))
    assert compile_shader("binary", {"OP_ADD": 1}) == good
    monkeypatch.undo()
    monkeypatch.setenv("DSV4_VK_CACHE_DIR", str(tmp_path))
    raw, raw2 = entry.read_bytes(), entry2.read_bytes()
    if damage == "truncate":
        entry.write_bytes(raw[: len(raw) - 8])
    elif damage == "flip_byte":
        bad = bytearray(raw)
        bad[-len(good) // 2] ^= 0xFF
        entry.write_bytes(bytes(bad))
    elif damage == "header_garbage":
        entry.write_bytes(b"\xff\xfe\x00 not json\n" + good)
    elif damage == "checksum":
        entry.write_bytes(json.dumps(dict(meta, sha256="0" * 64)).encode() + b"\n" + good)
    elif damage == "empty":
        entry.write_bytes(b"")
    elif damage == "not_spirv":               # a consistent header over bytes that are not SPIR-V
        junk = bytes(len(good))
        entry.write_bytes(json.dumps(dict(meta, sha256=shader_module._entry_sum(meta["key"], junk))).encode()
                          + b"\n" + junk)
    elif damage == "swapped":                 # each file under the other's name
        entry.write_bytes(raw2)
        entry2.write_bytes(raw)
    else:                                     # the other's SPIR-V, its sha256 written in (the key kept)
        body2 = raw2.partition(b"\n")[2]
        entry.write_bytes(json.dumps(dict(meta, sha256=hashlib.sha256(body2).hexdigest(), bytes=len(body2))).encode()
                          + b"\n" + body2)
    with pytest.warns(RuntimeWarning, match=f"shader cache entry {re.escape(str(entry))} was not used and is "
                                            "compiled again: "):
        assert compile_shader("binary", {"OP_ADD": 1}) == good
    assert entry.read_bytes() == raw                             # written again as it was
    if damage == "swapped":                                       # the other one is found out in its turn
        with pytest.warns(RuntimeWarning, match=re.escape(str(entry2))):
            assert compile_shader("binary", {"OP_MUL": 1}) == other
    assert entry2.read_bytes() == raw2 and compile_shader("binary", {"OP_MUL": 1}) == other


def test_an_unusable_cache_entry_is_named_in_a_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_VK_CACHE_DIR", str(tmp_path))
    compile_shader("binary", {"OP_DIV": 1})
    (entry,) = _entries(tmp_path, "binary")
    entry.write_bytes(b"garbage")

    def broken(name, path, key):
        raise ShaderCompileError("the compiler broke")
    monkeypatch.setattr(shader_module, "_glslang", broken)
    with pytest.warns(RuntimeWarning), pytest.raises(ShaderCompileError) as e:
        compile_shader("binary", {"OP_DIV": 1})
    assert str(e.value).startswith("the compiler broke\n")
    assert f"the shader cache entry {entry} was not usable: no header line" in str(e.value)
    assert not entry.exists()


def test_spirv_problem_checks_the_module():
    good = compile_shader("unary", {"OP_EXP": 1})
    assert shader_module.spirv_problem(good) is None
    bad = bytearray(good)
    bad[22:24] = (0xFFFF).to_bytes(2, "little")      # the first instruction's word count
    assert "past the end" in shader_module.spirv_problem(bytes(bad))
    assert "magic" in shader_module.spirv_problem(b"\0" * len(good))
    assert "whole header" in shader_module.spirv_problem(good[:6])
    assert "no GLCompute entry point" in shader_module.spirv_problem(good[:20])


@pytest.mark.parametrize("directory", ["/proc/self", "/sys/kernel"])
def test_unwritable_cache_dir_compiles_in_memory(monkeypatch, directory):
    """/proc/self is not writable; /sys/kernel passes os.access for root but refuses new files."""
    monkeypatch.setenv("DSV4_VK_CACHE_DIR", directory)
    monkeypatch.setattr(shader_module, "_memory", {})
    with pytest.warns(RuntimeWarning, match="compiling in memory|kept in memory only"):
        first = compile_shader("binary", {"OP_MUL": 1})
    assert first[:4] == (0x07230203).to_bytes(4, "little")
    monkeypatch.setattr(shader_module.subprocess, "Popen", lambda *a, **k: pytest.fail("compiled twice"))
    assert compile_shader("binary", {"OP_MUL": 1}) == first          # served from memory


def test_unusable_cache_dir_is_named(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for value in (str(not_a_dir), str(not_a_dir / "sub"), "  "):
        monkeypatch.setenv("DSV4_VK_CACHE_DIR", value)
        with pytest.raises(ShaderCompileError, match="DSV4_VK_CACHE_DIR"):
            compile_shader("binary", {"OP_DIV": 1})


def test_prebuilt_spirv_is_used_only_while_the_source_matches(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_VK_CACHE_DIR", str(tmp_path / "cache"))
    good = compile_shader("binary", {"OP_ADD": 1})
    pre = tmp_path / "spirv"
    pre.mkdir()
    fake = good + (1 << 16).to_bytes(4, "little")   # sound SPIR-V (an OpNop more): only where it came from matters
    (pre / "b.spv").write_bytes(fake)
    vid = "binary|OP_ADD=1"
    entry = {"file": "b.spv", "source": shader_module.source_hash("binary"), "sha256": hashlib.sha256(fake).hexdigest()}
    (pre / "manifest.json").write_text(json.dumps({"glslang": "test", "variants": {vid: entry}}))
    monkeypatch.setattr(shader_module, "PREBUILT_DIR", pre)
    shader_module._manifest.cache_clear()
    try:
        monkeypatch.setattr(shader_module, "compiler", lambda: pytest.fail("needed glslang for a prebuilt variant"))
        assert compile_shader("binary", {"OP_ADD": 1}) == fake
        monkeypatch.undo()
        monkeypatch.setenv("DSV4_VK_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setattr(shader_module, "PREBUILT_DIR", pre)
        entry["source"] = "0" * 64                     # the shader changed since the wheel was built
        (pre / "manifest.json").write_text(json.dumps({"glslang": "test", "variants": {vid: entry}}))
        shader_module._manifest.cache_clear()
        assert compile_shader("binary", {"OP_ADD": 1}) == good
    finally:
        shader_module._manifest.cache_clear()


def test_variant_declarations_parse():
    text = "//! variants: A | B=1,2 ; - | C\n//! variants: D\n"
    got = shader_module.parse_variants(text)
    assert set(got) == {(("A", "1"),), (("A", "1"), ("C", "1")), (("B", "1"),), (("B", "1"), ("C", "1")),
                        (("B", "2"),), (("B", "2"), ("C", "1")), (("D", "1"),)}
    assert shader_module.parse_variants("void main() {}") == [()]
    with pytest.raises(ShaderCompileError, match="bad define"):
        shader_module.parse_variants("//! variants: 9X")



# The wheel prebuilds every declared variant: shape knobs are specialization constants (one SPIR-V
# for all their values), so the count follows types and features only. A bound, so it cannot creep:
# raised from 900 when the prefill kernels came (grouped experts and their matrix-unit GEMM, the
# matrix units over FP8/FP4, the prefill attention and its matrix-unit form), each a handful of type
# and feature variants; then to 1150 for the decode folds (MQA_ATTENTION merging its splits, with and
# without the inverse RoPE, over each lane, mode and q-norm variant: 120; V4_GATE: 36); then to 1200 for the
# staged expert sum's route groups (-D ROUTE_GROUPS over its lane, addend and weight variants: 18).
VARIANT_BUDGET = 1200


def test_declared_variants_stay_within_the_budget():
    counts = {p.stem: len(shader_module.declared_variants(p.stem)) for p in shader_module.shader_dir().glob("*.comp")}
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    assert sum(counts.values()) <= VARIANT_BUDGET, f"{sum(counts.values())} variants, the most in {top}"


def test_no_variant_passes_a_specialization_constant_as_a_define():
    for p in shader_module.shader_dir().glob("*.comp"):
        named = set(shader_module.spec_constants(p.stem))
        for key in shader_module.declared_variants(p.stem):
            assert not named & set(dict(key)), f"{p.name} declares a variant defining {named & set(dict(key))}"


def test_named_specialization_constants_are_split_from_the_defines(tmp_path, monkeypatch):
    assert shader_module.spec_constants("softmax")["LANES"] == 15
    defines, spec = shader_module.specialize("softmax", {"LANES": np.int64(8), "LANES_SHUFFLE": 1})
    assert defines == {"LANES_SHUFFLE": 1} and spec == {15: 8}
    for bad in ("8", 2.0, -1, 1 << 32, True):
        with pytest.raises(ShaderCompileError, match=r"softmax.comp: LANES=.* is a specialization constant"):
            shader_module.specialize("softmax", {"LANES": bad, "LANES_SHUFFLE": 1})
    monkeypatch.setenv("DSV4_VK_CACHE_DIR", str(tmp_path))
    with pytest.raises(ShaderCompileError, match="LANES name specialization constants, not compile-time defines"):
        compile_shader("softmax", {"LANES": 8, "LANES_SHUFFLE": 1})


def test_pipeline_cache_keys_on_named_specialization_constants(device):
    from dsv4_vk.vk.errors import VulkanError
    four = device.pipelines.get("softmax", 2, {"LANES": 4, "LANES_SHUFFLE": 1}, (256,))
    eight = device.pipelines.get("softmax", 2, {"LANES": 8, "LANES_SHUFFLE": 1}, (256,))
    assert four is not eight and four.handle != eight.handle
    assert device.pipelines.get("softmax", 2, {"LANES_SHUFFLE": 1, "LANES": 4}, (256,)) is four
    with pytest.raises(VulkanError, match=r"constants \[15\] are given both by position"):
        device.pipelines.get("softmax", 2, {"LANES": 4, "LANES_SHUFFLE": 1}, (256,) + (1,) * 15)


def test_workgroup_bytes_count_every_shared_array_with_its_specialization():
    """dsv4_vk.vk.spirv.workgroup_bytes: the staged sum's x rows (vec4 xs[XS · XRG]: a spec-constant
    product) and its split sums (256 floats), at the defaults and as specialised."""
    from dsv4_vk.vk.spirv import workgroup_bytes
    defines = {"MODE_SUM": 1, "VEC4": 1, "W_FP4": 1, "ROUTES": 1, "X_SHARED": 1}
    code = compile_shader("mul_mat_id", shader_module.specialize("mul_mat_id", dict(defines, LANES=1))[0])
    assert workgroup_bytes(code, {}) == 16 + 4 * 256
    assert workgroup_bytes(code, {5: 512, 6: 3}) == 16 * 512 * 3 + 4 * 256
    assert workgroup_bytes(code[:20], {}) == 0                  # (the header only: no variables)


def test_a_pipeline_past_the_shared_memory_is_refused(device):
    """A pipeline whose shared arrays, as specialised, exceed maxComputeSharedMemorySize raises
    VulkanError naming both (a driver may make it and lose the device running it); one at the limit
    is made."""
    from dsv4_vk.vk.errors import VulkanError
    have = device.caps.limits.max_shared_memory
    defines = {"LANES": 1, "MODE_SUM": 1, "VEC4": 1, "W_FP4": 1, "ROUTES": 1, "X_SHARED": 1}
    xs = (have - 4 * 256) // 16
    device.pipelines.get("mul_mat_id", 5, defines, (256, 1, 1, 0, 1, xs, 1, 1, 1))
    with pytest.raises(VulkanError, match=rf"pipeline mul_mat_id .* declares {have + 16} B of shared memory; "
                                          rf".* has {have} B \(maxComputeSharedMemorySize\)"):
        device.pipelines.get("mul_mat_id", 5, defines, (256, 1, 1, 0, 1, xs + 1, 1, 1, 1))

# --- executor params shared by graphs ----------------------------------------------------------------

def test_params_are_shared_by_graphs_and_persist_across_replays(rng):
    T, N, K = 3, 6, 8
    w1, w2 = (rng.standard_normal((N, K)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((T, K)).astype(np.float32)
    ex = Executor()
    ex.set_param("w", w1)

    g_mm = Graph()
    g_mm.output("y", g_mm.op("MUL_MAT", g_mm.input("x", (T, K)), g_mm.param("w", (N, K))))
    g_add = Graph()
    g_add.output("y", g_add.op("SCALE", g_add.param("w", (N, K)), a=1.0, b=1.0))

    def check(w):
        np.testing.assert_allclose(ex.run(g_mm, x=x)["y"], x @ w.T, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ex.run(g_add)["y"], w + 1, rtol=1e-6)
    check(w1)
    compiled = [ex.compile(g_mm), ex.compile(g_add)]
    ex.set_param("w", w2)                    # same shape: overwritten in place, graphs kept
    check(w2)
    assert [ex.compile(g_mm), ex.compile(g_add)] == compiled

    # a graph that updates a param in place (a KV cache): the update persists across replays
    g_inc = Graph()
    p = g_inc.param("w", (N, K))
    g_inc.op("SCALE", p, a=2.0, out=p)
    for _ in range(2):
        ex.run(g_inc)
    np.testing.assert_array_equal(ex.params["w"].read(), 4 * w2)
    check(4 * w2)                            # the other graphs see it too

    ex.set_param("w", np.zeros((N + 1, K), np.float32))   # new size: dependent graphs dropped
    assert all(cg.recording.cmd is None for cg in compiled)
    with pytest.raises(ValueError, match="param 'w' holds 56 f32, graph wants 48 f32"):
        ex.run(g_mm, x=x)


# --- tuning knobs ---------------------------------------------------------------------------------

def _hc_pre_graph(T, D):
    g = Graph()
    g.output("u", g.op("HC_PRE", g.input("x", (T, 4, D)), g.input("w", (T, 4))))
    return g


def test_a_changed_tuning_knob_gives_a_new_program(rng, device):
    """A knob is part of every cache key that depends on it: the graph signature (Executor), the HC
    functions' program cache. Under another value the op lowers to another grid, and the program
    compiled under the old value is not reused; back at the old value, the old program is."""
    import dsv4_vk as dv
    from dsv4_vk.core.tuning import current, tuned
    T, D = 3, 256                                   # 64 chunks: one workgroup a token by default
    x, w = rng.standard_normal((T, 4, D)).astype(np.float32), rng.standard_normal((T, 4)).astype(np.float32)
    ref = np.einsum("ts,tsd->td", w.astype(np.float64), x.astype(np.float64))
    ex = Executor(device)
    default = ex.compile(_hc_pre_graph(T, D))
    with tuned({"slice.wg": 32}) as t:
        assert current() is t and current()["slice.wg"] == 32 and t.overrides() == {"slice.wg": 32}
        g = _hc_pre_graph(T, D)
        assert g.tuning == t
        small = ex.compile(g)
        np.testing.assert_allclose(small.run(x=x, w=w)["u"], ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dv.hc_pre(x, w, device=device), ref, rtol=1e-5, atol=1e-5)
        api_grid = dv.last_run().details[0]
    assert small is not default and small.graph.signature() != default.graph.signature()
    assert [d.split(" grid ")[1].split()[0] for d in (default.dispatch_details[0], small.dispatch_details[0])] == \
        [str(T), str(2 * T)]                        # 32-invocation workgroups: two a token
    assert current()["slice.wg"] is None and ex.compile(_hc_pre_graph(T, D)) is default
    dv.hc_pre(x, w, device=device)
    assert " grid 3 " in dv.last_run().details[0] and " grid 6 " in api_grid   # the api's cache: a program each


def test_tuning_refuses_unknown_knobs_and_writes():
    """An unknown knob is refused naming the close one and every known one; tables are read-only."""
    from dsv4_vk.core.tuning import Tuning, knobs, tuned
    from dsv4_vk.ops import mul_mat
    with pytest.raises(KeyError, match=r"unknown tuning knob 'gemv.unrol' \(did you mean 'gemv.unroll'\?\); "
                                       r"known knobs: .*gemv.spread, gemv.unroll, .*slice.wg"):
        Tuning({"gemv.unrol": 2})
    with pytest.raises(KeyError, match="known knobs"), tuned(bogus=1):
        pass
    with pytest.raises(TypeError):
        mul_mat.GEMV_UNROLL["unroll"] = 2          # type: ignore[index]
    assert Tuning({"gemv.unroll": None}) == Tuning() and hash(Tuning({"gemv.unroll": 2})) == hash(Tuning(**{"gemv.unroll": 2}))
    assert all(k.doc for k in knobs().values())


def test_scratch_pools_zeroed_or_not_are_asked_for_one_way(monkeypatch):
    """OpDef.scratch's (elements, dtype, "zeroed"): a pool is zero when a program is built and after
    each run (V4_GATE's ticket counter, which resets itself), one pool is asked for one way only, and
    a third field other than "zeroed" is refused naming the forms."""
    from dsv4_vk.ops.base import REGISTRY, OpDef
    from dsv4_vk.ops.v4_gate import COUNTERS

    class AsksForScratch(OpDef):
        name = "TEST_ASKS_FOR_SCRATCH"

        def infer(self, inputs, params):
            return (1,), "f32"

        def scratch(self, inputs, params):
            return {params["pool"]: params["how"]}
    monkeypatch.setitem(REGISTRY, AsksForScratch.name, AsksForScratch())      # for this test only
    g = Graph()
    x = g.input("x", (1, 8))
    g.op("TEST_ASKS_FOR_SCRATCH", x, pool="p", how=(4, "i32", "zeroed"))
    g.op("TEST_ASKS_FOR_SCRATCH", x, pool="p", how=(9, "i32", "zeroed"))
    assert g.scratch("p").storage.zeroed and g.scratch("p").shape == (9,)
    with pytest.raises(ValueError, match=r"scratch pool 'p' asked for as i32, it is i32 zeroed"):
        g.op("TEST_ASKS_FOR_SCRATCH", x, pool="p", how=(4, "i32"))
    with pytest.raises(ValueError, match=r"scratch pool 'q': expected \(elements, dtype\) or \(elements, dtype, "
                                         r"'zeroed'\), got the extra \('zero',\)"):
        g.op("TEST_ASKS_FOR_SCRATCH", x, pool="q", how=(4, "i32", "zero"))
    g = Graph()
    x = g.input("x", (1, 8))
    routes = g.op("V4_GATE", x, g.const(np.ones((4, 8), np.float32)), g.const(np.zeros(4, np.float32)), top_k=2)
    g.output("routes", routes)
    g.output("counters", g.scratch(COUNTERS))
    cg = Executor().compile(g)
    res = cg.run(x=np.ones((1, 8), np.float32))
    assert not res["counters"].any() and res["routes"][0, :, 0].tolist() == [0, 1, 4]
