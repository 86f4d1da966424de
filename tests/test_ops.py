"""Every primitive op against its declaration's float64 `reference()`, driven by one table.

Hypothesis draws shapes (1, primes, sizes around the 256-invocation workgroup), input layouts
(contiguous, transposed, sliced, broadcast), `out=` layouts (new, transposed, a strided slice of a
sentinel-filled buffer: nothing outside the view may change), params and a value seed, and whether
the grid is refolded to 3 groups in x (every kernel sees y-folded grids with spare groups), and
whether ops lower as for a GPU (so lavapipe also runs the kernel variants chosen for GPUs).
Every run checks NMSE, a max-abs bound, NaN/inf placement and the guard regions.
"""
import dataclasses
import os
import subprocess
import sys
import dataclasses
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4_vk.core import recording
from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.hc.metrics import max_abs, nmse, nonfinite_mismatch
from dsv4_vk.ops import base, get_op
from dsv4_vk.ops.mul_mat import F32_KERNELS

SIZES = [1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 33, 64, 127, 255, 256, 257, 1000]
BUDGET = 1 << 14          # elements per logical tensor
SENTINEL = 12345.0        # pre-filled around strided out= views
LAYOUTS = ("contig", "transposed", "sliced", "broadcast")
HERE = os.path.dirname(os.path.abspath(__file__))


# --- inputs: a stored array plus a view recipe applied alike to the graph Tensor and to numpy ----------

@dataclass
class Input:
    stored: np.ndarray
    recipe: list = field(default_factory=list)

    def view(self, obj):
        for kind, arg in self.recipe:
            if kind == "T":
                obj = obj.transpose(-1, -2) if not isinstance(obj, np.ndarray) else np.swapaxes(obj, -1, -2)
            elif kind == "slice":
                obj = obj[arg]
            else:
                obj = obj.broadcast_to(arg) if not isinstance(obj, np.ndarray) else np.broadcast_to(obj, arg)
        return obj


def make_input(shape, layout, values):
    """An Input whose view has logical `shape` and the given layout; values(shape) -> array."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        stored = values(shape[:-2] + (shape[-1], shape[-2]))
        return Input(stored, [("T", None)])
    if layout == "sliced":
        stored = values(tuple(2 * s + 1 for s in shape))
        return Input(stored, [("slice", tuple(slice(1, 2 * s + 1, 2) for s in shape))])
    if layout == "broadcast" and any(s > 1 for s in shape):
        k = next(i for i, s in enumerate(shape) if s > 1)
        return Input(values(shape[:k] + (1,) + shape[k + 1:]), [("bcast", shape)])
    return Input(values(shape))


def draw_shape(data, min_dims=1, max_dims=4, budget=BUDGET, sizes=SIZES):
    shape = []
    for _ in range(data.draw(st.integers(min_dims, max_dims))):
        s = data.draw(st.sampled_from([n for n in sizes if n <= budget]))
        shape.append(s)
        budget //= s
    return tuple(shape)


def layout(data):
    return data.draw(st.sampled_from(LAYOUTS))


def scalar(lo, hi):
    """A float32 parameter away from the subnormal range, which devices may flush to zero."""
    return st.floats(lo, hi, width=32).filter(lambda v: v == 0 or abs(v) > 1e-3)


def normal(rng, scale=1.0):
    return lambda shape: (rng.standard_normal(shape) * scale).astype(np.float32)


def uniform(rng, lo, hi):
    return lambda shape: rng.uniform(lo, hi, shape).astype(np.float32)


@dataclass
class Spec:
    inputs: list
    params: dict = field(default_factory=dict)
    out_layouts: tuple = ("new", "transposed", "sliced")


# --- one drawing function per op family ----------------------------------------------------------

def broadcast_pair(data, rng, denominator=False):
    out = draw_shape(data)
    shapes = []
    for _ in range(2):
        s = tuple(n if data.draw(st.booleans()) else 1 for n in out)
        shapes.append(s[data.draw(st.integers(0, len(s) - 1)):])
    shapes[0] = out                     # at least one input spans the output
    if data.draw(st.booleans()):
        shapes.reverse()
    vals = [normal(rng), normal(rng)]
    if denominator:                     # keep |b| ≥ 0.5 so DIV is well conditioned
        vals[1] = lambda shape: (rng.choice([-1, 1], shape) * rng.uniform(0.5, 2, shape)).astype(np.float32)
    return Spec([make_input(s, layout(data), v) for s, v in zip(shapes, vals)])


def unary(lo, hi, **param_strategies):
    def draw(data, rng):
        params = {k: data.draw(s) for k, s in param_strategies.items()}
        return Spec([make_input(draw_shape(data), layout(data), uniform(rng, lo, hi))], params)
    return draw


def cont_i32(data, rng):
    ints = lambda shape: rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int64).astype(np.int32)  # noqa: E731
    return Spec([make_input(draw_shape(data), layout(data), ints)], out_layouts=("new",))


def fill(data, rng):
    return Spec([], {"shape": draw_shape(data), "value": data.draw(scalar(-1e6, 1e6))})


def rows(data, rng, **params):
    shape = draw_shape(data)
    inputs = [make_input(shape, layout(data), normal(rng, 2.0))]
    if params.pop("weight", False):
        inputs.append(make_input(shape[-1:], layout(data), normal(rng)))
    if "scale" in params and data.draw(st.booleans()):
        # masked entries as attention uses them; a fully masked row is NaN in both
        mask = rng.random(inputs[0].stored.shape) < 0.2
        inputs[0].stored[mask] = -np.inf
    return Spec(inputs, params)


def softmax(data, rng):
    return rows(data, rng, scale=data.draw(scalar(-3, 3)))


def rms_norm(data, rng):
    eps = data.draw(st.sampled_from([1e-6, 1e-3, 0.5]))
    return rows(data, rng, eps=eps, weight=data.draw(st.booleans()))


def concat(data, rng):
    n = data.draw(st.integers(2, 4))
    base_shape = list(draw_shape(data, budget=BUDGET // 8))
    axis = data.draw(st.integers(-len(base_shape), len(base_shape) - 1))
    inputs = []
    for _ in range(n):
        s = list(base_shape)
        s[axis] = data.draw(st.sampled_from([1, 2, 3, 5, 8]))
        inputs.append(make_input(s, layout(data), normal(rng)))
    return Spec(inputs, {"axis": axis})


def mul_mat(data, rng):
    T = data.draw(st.sampled_from([1, 2, 3, 5, 8, 9, 17, 64, 65, 130]))
    K = data.draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 33, 64, 100, 257]))
    N = data.draw(st.sampled_from([1, 3, 4, 5, 16, 31, 65, 129, 300]))
    batch = draw_shape(data, 0, 2, budget=6, sizes=[1, 2, 3])
    xb = tuple(b if data.draw(st.booleans()) else 1 for b in batch)[data.draw(st.integers(0, len(batch))):]
    wb = batch                         # x's batch dims broadcast against w's
    if data.draw(st.booleans()):
        xb, wb = wb, xb
    scale = 1 / np.sqrt(K)
    return Spec([make_input(xb + (T, K), layout(data), normal(rng)),
                 make_input(wb + (N, K), layout(data), normal(rng, scale))],
                {"kernel": data.draw(st.sampled_from(F32_KERNELS))})


def get_rows(data, rng):
    V = data.draw(st.sampled_from([1, 2, 7, 64, 257]))
    D = data.draw(st.sampled_from([1, 3, 16, 33, 256, 257]))
    N = data.draw(st.sampled_from([1, 2, 5, 31, 100]))
    bad = np.array([-1, V, V + 7, 2**31 - 1, -2**31], np.int64)

    def ids(shape):
        i = rng.integers(0, V, shape)
        out_of_range = rng.random(shape) < 0.2
        i[out_of_range] = rng.choice(bad, out_of_range.sum())
        return i.astype(np.int32)
    return Spec([make_input((V, D), layout(data), normal(rng)),
                 make_input((N,), data.draw(st.sampled_from(["contig", "sliced", "broadcast"])), ids)])


@dataclass
class OpCase:
    op: str
    draw: callable
    nmse: float          # NMSE bound (0: exact copies)
    rtol: float          # max-abs bound, relative to max(1, max |reference|) (|terms| for SUMS)
    examples: int = 40


CASES = [
    OpCase("ADD", broadcast_pair, 1e-13, 1e-6),
    OpCase("MUL", broadcast_pair, 1e-13, 1e-6),
    OpCase("DIV", lambda d, r: broadcast_pair(d, r, denominator=True), 1e-13, 1e-6),
    OpCase("SCALE", unary(-4, 4, a=scalar(-3, 3), b=scalar(-3, 3)), 1e-13, 1e-6),
    OpCase("SIGMOID", unary(-8, 8), 1e-10, 1e-6),
    OpCase("EXP", unary(-5, 5), 1e-10, 1e-6),
    OpCase("CONT", unary(-4, 4), 0.0, 0.0),
    OpCase("CONT", cont_i32, 0.0, 0.0, examples=4),
    OpCase("FILL", fill, 0.0, 0.0, examples=6),
    OpCase("SOFT_MAX", softmax, 1e-10, 1e-6),
    OpCase("SUM_ROWS", lambda d, r: rows(d, r), 1e-10, 1e-5),
    # 3e-6: without subgroup ops one invocation sums a 4096-long row serially (1.3e-6 seen)
    OpCase("RMS_NORM", rms_norm, 1e-10, 3e-6),
    OpCase("CONCAT", concat, 0.0, 0.0),
    OpCase("MUL_MAT", mul_mat, 1e-10, 1e-5, examples=120),
    OpCase("GET_ROWS", get_rows, 0.0, 0.0),
]
SUMS = ("SCALE", "SUM_ROWS", "MUL_MAT")
BOUNDS = {c.op: (c.nmse, c.rtol) for c in reversed(CASES)}


# --- running one case ------------------------------------------------------------------------------

def out_view(g, shape, kind):
    """(view passed as out=, sentinel-filled storage around a sliced view or None) for an out layout."""
    if kind == "new":
        return None, None
    if kind == "transposed" and len(shape) >= 2:
        return g.empty(shape[:-2] + (shape[-1], shape[-2])).transpose(-1, -2), None
    whole = g.empty(tuple(2 * s + 1 for s in shape))
    g.op("FILL", out=whole, shape=whole.shape, value=SENTINEL)
    return whole[tuple(slice(1, 2 * s + 1, 2) for s in shape)], whole


_record = recording.record_launch


def _record_folded(rec, buffers, node, launch):
    """Record `launch` on a grid refolded to 3 groups in x: every kernel must recover its flat group
    index from (x, y) and skip the spare groups of the last row."""
    gx, gy, gz = launch.grid
    groups = gx * gy
    if groups > 1:
        launch = dataclasses.replace(launch, grid=(3, -(-groups // 3), gz))
    _record(rec, buffers, node, launch)


def run_op(name, spec, out_kind="new", fold=False, as_gpu=False):
    """Build a fresh graph and executor, run, check everything; returns (result, reference).
    as_gpu: lower as for a discrete GPU (kernel choices that key on the device type)."""
    op = get_op(name)
    g = Graph()
    tensors, arrays, feeds = [], [], {}
    for i, inp in enumerate(spec.inputs):
        dt = "i32" if inp.stored.dtype == np.int32 else "f32"
        t = g.input(f"in{i}", inp.stored.shape, dt)
        tensors.append(inp.view(t))
        arrays.append(inp.view(inp.stored))
        feeds[f"in{i}"] = inp.stored
    ref = op.reference(*arrays, **spec.params)
    # A sum's f32 rounding error scales with Σ|terms|, not with |Σ terms|: a few outputs that
    # cancel (e.g. every row broadcast from one, or x·a ≈ −b) would fail any |ref|-relative bound.
    # Errors of sums are measured against the same op on |inputs| and |scalar params|.
    scale = ref
    if name in SUMS:
        scale = op.reference(*map(np.abs, arrays), **{k: abs(v) if isinstance(v, float) else v
                                                       for k, v in spec.params.items()})
    out, whole = out_view(g, ref.shape, out_kind)
    y = g.op(name, *tensors, out=out, **spec.params)
    g.output("y", y)
    if whole is not None:
        g.output("whole", whole)
    ex = Executor()
    caps = dataclasses.replace(ex.device.caps, type="discrete-gpu") if as_gpu else ex.device.caps
    with mock.patch.object(recording, "record_launch", _record_folded if fold else _record), \
            mock.patch.object(ex.device, "caps", caps):
        res = ex.run(g, **feeds)
    try:
        assert ex.last.check_guards() == []
        got = res["y"]
        assert got.shape == ref.shape and got.dtype == (np.int32 if y.dtype == "i32" else np.float32)
        if whole is not None:       # nothing outside the out= view changed
            rest = res["whole"].copy()
            rest[tuple(slice(1, 2 * s + 1, 2) for s in ref.shape)] = SENTINEL
            assert np.all(rest == SENTINEL), "kernel wrote outside its out= view"
        return got, ref, scale
    finally:
        ex.last.release()


def check_close(got, ref, scale, nmse_max, rtol):
    """NaN/inf at the same places; NMSE Σ(got−ref)²/Σscale² ≤ nmse_max; max-abs ≤ rtol · max(1, max |scale|).
    scale is ref itself, or for sums the sum of |terms| (see run_op)."""
    assert nonfinite_mismatch(got, ref) == 0, "NaN/inf placement differs"
    e = nmse(got, ref, scale)
    assert e <= nmse_max, f"NMSE {e:.3e} > {nmse_max:.0e}"
    finite = np.isfinite(ref)
    bound = rtol * max(1.0, float(np.abs(scale[finite]).max()) if finite.any() else 1.0)
    assert max_abs(got, ref) <= bound, f"max abs error {max_abs(got, ref):.3e} > {bound:.3e}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.op + ("_i32" if c.draw is cont_i32 else ""))
def test_op_matches_reference(case):
    @settings(max_examples=case.examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def check(data):
        spec = case.draw(data, np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed")))
        out_kind = data.draw(st.sampled_from(spec.out_layouts), label="out")
        result = run_op(case.op, spec, out_kind, fold=data.draw(st.booleans(), label="fold"),
                        as_gpu=data.draw(st.booleans(), label="as_gpu"))
        check_close(*result, case.nmse, case.rtol)
    check()


# --- what the table cannot reach cheaply -----------------------------------------------------------

def test_grid_beyond_65535_workgroups(rng):
    n = 65535 * 256 + 257                     # 65537 workgroups of 256: folded into y
    assert base.grid_1d(n)[1] == 2
    x = rng.standard_normal(n).astype(np.float32)
    got, ref, _ = run_op("SCALE", Spec([Input(x)], {"a": 2.0, "b": -1.0}))
    assert np.array_equal(got, ref.astype(np.float32))


# Row lengths and K around every cluster width (1, 2, 4, 8, 16 lanes), the DSV4 widths, and the
# MUL_MAT kernels at T = 1 and T > 1: run in-process, at other subgroup sizes and without subgroup ops.
# Rows of 256 values and more, 5 at a time, are reduced by a whole workgroup each (reduce_rows.row_workgroup).
LANE_ROWS = [1, 3, 4, 5, 9, 17, 33, 64, 65, 129, 255, 256, 257, 1000, 4096, 5000]  # 5000: past a lane's register cache
LANE_MATMUL = [(1, 4096, 24), (1, 16384, 7), (3, 17, 40), (1, 33, 130), (5, 64, 3), (8, 9, 5), (9, 129, 66),
               (130, 4096, 9), (1, 257, 3001), (17, 7, 2500), (1, 64, 1000), (1, 4, 1)]


def rope_inputs(rng, half, capacity, p0):
    """pos [1] i32 = p0 and random angle tables cos, sin [capacity, half] (RMS_NORM's rope inputs)."""
    ang = rng.uniform(-np.pi, np.pi, (capacity, half))
    return [Input(np.array([p0], np.int32)), Input(np.cos(ang).astype(np.float32)), Input(np.sin(ang).astype(np.float32))]


def check_lane_variants(rng):
    for as_gpu in (False, True):
        check_lane_variants_on(rng, as_gpu)


def check_lane_variants_on(rng, as_gpu):
    from dsv4_vk.ops.reduce_rows import row_workgroup
    from dsv4_vk.vk import default_device
    dev = default_device()
    has_ops = {"basic", "arithmetic"} <= set(dev.caps.subgroup.operations)
    assert row_workgroup(dev, 5, 4096) == has_ops and not row_workgroup(dev, 5, 255)
    assert not row_workgroup(dev, 257, 4096)
    x = make_input((257, 300), "contig", normal(rng, 2.0))          # many long rows: the cluster kernels
    check_close(*run_op("SOFT_MAX", Spec([x], {"scale": 0.5}), as_gpu=as_gpu), *BOUNDS["SOFT_MAX"])
    check_close(*run_op("RMS_NORM", Spec([x], {"eps": 1e-6}), as_gpu=as_gpu), *BOUNDS["RMS_NORM"])
    for n in LANE_ROWS:
        x = make_input((5, n), "contig", normal(rng, 2.0))
        check_close(*run_op("SOFT_MAX", Spec([x], {"scale": 0.5}), as_gpu=as_gpu), *BOUNDS["SOFT_MAX"])
        check_close(*run_op("SUM_ROWS", Spec([x]), as_gpu=as_gpu), *BOUNDS["SUM_ROWS"])
        w = make_input((n,), "contig", normal(rng))
        check_close(*run_op("RMS_NORM", Spec([x, w], {"eps": 1e-6}), as_gpu=as_gpu), *BOUNDS["RMS_NORM"])
        if n % 2 == 0:                   # with RoPE on the trailing channels: 5 tokens, the last 2 past capacity 6
            check_close(*run_op("RMS_NORM", Spec([x, w, *rope_inputs(rng, min(n // 2, 5), 6, 3)],
                                                 {"eps": 1e-6, "rope": True}), as_gpu=as_gpu), *BOUNDS["RMS_NORM"])
            q = make_input((3, 2, n), "sliced", normal(rng, 2.0))    # [T, heads, n]: token = row // heads
            check_close(*run_op("RMS_NORM", Spec([q, *rope_inputs(rng, n // 2, 9, 1)], {"eps": 1e-6, "rope": True}),
                                as_gpu=as_gpu), *BOUNDS["RMS_NORM"])
    for T, K, N in LANE_MATMUL:
        for layout_x in ("contig", "sliced"):     # vec4 and scalar loads
            x = make_input((T, K), layout_x, normal(rng))
            w = make_input((N, K), "contig", normal(rng, 1 / np.sqrt(K)))
            for kernel in ("gemv", "gemm"):
                check_close(*run_op("MUL_MAT", Spec([x, w], {"kernel": kernel}), as_gpu=as_gpu), *BOUNDS["MUL_MAT"])
            g = make_input((K,), "contig", normal(rng))      # RMS_NORM(x, g) → MUL_MAT in one dispatch
            check_close(*run_op("MUL_MAT", Spec([x, w, g], {"rms_eps": 1e-6}), as_gpu=as_gpu), *BOUNDS["MUL_MAT"])


def test_lane_variants(rng):
    check_lane_variants(rng)


def test_without_subgroup_operations(device, rng, monkeypatch):
    no_ops = dataclasses.replace(device.caps.subgroup, operations=())
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, subgroup=no_ops))
    check_lane_variants(rng)


@pytest.mark.parametrize("width, subgroup", [(128, 4), (512, 16)])
def test_other_subgroup_sizes(width, subgroup):
    code = ("import sys, numpy as np; sys.path.insert(0, %r); import test_ops as t; "
            "from dsv4_vk.vk import default_device; assert default_device().subgroup_size == %d; "
            "t.check_lane_variants(np.random.default_rng())" % (HERE, subgroup))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LP_NATIVE_VECTOR_WIDTH": str(width)})
    assert r.returncode == 0, r.stdout + r.stderr


def test_attention_style_matmul_with_transposed_v(rng):
    H, T, S, dh = 3, 5, 37, 16
    att = make_input((H, T, S), "contig", uniform(rng, 0, 1))
    v_t = make_input((H, dh, S), "transposed", normal(rng))      # v [H, S, dh] viewed as [H, dh, S]
    check_close(*run_op("MUL_MAT", Spec([att, v_t])), *BOUNDS["MUL_MAT"])


def test_get_rows_out_of_range_rows_are_nan(rng):
    table = rng.standard_normal((10, 6)).astype(np.float32)
    ids = np.array([0, 10, -1, 9, 2**31 - 1], np.int32)
    got, _, _ = run_op("GET_ROWS", Spec([Input(table), Input(ids)]))
    assert np.array_equal(got[[0, 3]], table[[0, 9]])
    assert np.isnan(got[[1, 2, 4]]).all()


@pytest.mark.parametrize("n", [7, 1000])
def test_row_reductions_on_strided_views_masked_rows_and_out_views(rng, n):
    """Cluster (n = 7) and workgroup-per-row (n = 1000) kernels: a transposed input, −inf entries and
    a fully masked softmax row, a sliced out view with its sentinel surroundings untouched."""
    x = make_input((3, n), "transposed", normal(rng, 2.0))
    x.stored[rng.random(x.stored.shape) < 0.2] = -np.inf
    x.stored[:, 1] = -np.inf                                         # stored [n, 3]: logical row 1
    got, ref, _ = run_op("SOFT_MAX", Spec([x], {"scale": 0.7}), out_kind="sliced")
    assert nonfinite_mismatch(got, ref) == 0 and np.isnan(got[1]).all()
    ok = np.isfinite(ref)
    assert np.abs(got[ok] - ref[ok]).max() <= 1e-6
    y = make_input((4, n), "sliced", normal(rng))
    check_close(*run_op("RMS_NORM", Spec([y], {"eps": 1e-6}), out_kind="sliced"), *BOUNDS["RMS_NORM"])
    check_close(*run_op("SUM_ROWS", Spec([y]), out_kind="transposed"), *BOUNDS["SUM_ROWS"])


def test_store_at_stores_at_a_device_position_and_advances_it():
    """Recorded 4 times back to back: each repetition stores src at dst[index] and moves index on by
    advance; positions outside dst (here −1 and past the end) are skipped."""
    for start, adv, reps in ((1, 2, 4), (-1, 1, 3), (8, 3, 2)):
        g = Graph()
        src, idx, dst = g.input("src", (2,), "i32"), g.param("idx", (1,), "i32"), g.param("dst", (9,), "i32")
        g.op("STORE_AT", src, idx, dst, out=dst, advance=adv)
        ex = Executor()
        ex.set_param("idx", np.array([start], np.int32))
        ex.set_param("dst", np.full(9, -7, np.int32))
        ex.compile(g, repeat=reps).run({"src": np.array([5, 6], np.int32)})
        want = np.full(9, -7)
        for r in range(reps):
            for i, v in enumerate((5, 6)):
                if 0 <= start + r * adv + i < 9:
                    want[start + r * adv + i] = v
        assert ex.params["dst"].read().tolist() == want.tolist()
        assert int(ex.params["idx"].read()[0]) == start + reps * adv
    g = Graph()
    src, idx, dst = g.input("s", (1,), "i32"), g.input("i", (1,), "i32"), g.param("d", (3,), "i32")
    with pytest.raises(ValueError, match="writes its input 1"):
        g.op("STORE_AT", src, idx, dst, out=dst, advance=1)
    g = Graph()
    g.op("STORE_AT", g.input("s", (1,), "i32"), g.param("i", (1,), "i32"), g.param("d", (3,), "i32"), advance=1)
    ex = Executor()
    ex.set_param("i", np.zeros(1, np.int32))
    ex.set_param("d", np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"STORE_AT writes dst in place: pass out=<the dst tensor given as input 2>"):
        ex.compile(g)


def test_softmax_fully_masked_row_is_nan_like_reference():
    x = np.array([[0.0, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf]], np.float32)
    got, ref, _ = run_op("SOFT_MAX", Spec([Input(x)]))
    assert nonfinite_mismatch(got, ref) == 0 and np.isnan(got[1]).all()
    assert np.abs(got[0] - ref[0]).max() <= 1e-6 and got[0, 2] == 0 and abs(got[0, :2].sum() - 1) < 1e-6


# --- declaration errors -----------------------------------------------------------------------------

BAD_CALLS = [
    ("SOFT_MAX", [(4, 5)], {"scale": float("inf")}, "SOFT_MAX scale must be a finite"),
    ("SOFT_MAX", [(4, 5)], {"axis": 0}, r"unknown parameter\(s\) \['axis'\]"),
    ("SUM_ROWS", [(0, 5)], {}, "input 0 is empty"),
    ("RMS_NORM", [(4, 5)], {}, "needs eps"),
    ("RMS_NORM", [(4, 5)], {"eps": 0.0}, "eps must be > 0"),
    ("RMS_NORM", [(4, 5)], {"eps": float("nan")}, "eps must be a finite"),
    ("RMS_NORM", [(4, 5), (4,)], {"eps": 1e-6}, r"input 1 \(w\) has shape \(4,\), expected \(5,\)"),
    ("RMS_NORM", [(4, 5), (5,), (5,)], {"eps": 1e-6}, "takes x, optionally w; got 3"),
    ("RMS_NORM", [(4, 6), (6,)], {"eps": 1e-6, "rope": True}, r"then pos, cos, sin \(rope=True\)"),
    ("RMS_NORM", [(4, 6), ("i32", (1,)), (8, 4), (8, 4)], {"eps": 1e-6, "rope": True}, "hold the 8 rotated"),
    ("RMS_NORM", [(4, 6), ("i32", (1,)), (8, 2), (8, 3)], {"eps": 1e-6, "rope": True}, "sin"),
    ("RMS_NORM", [(4, 6), (1,), (8, 2), (8, 2)], {"eps": 1e-6, "rope": True}, "pos"),
    ("RMS_NORM", [(4, 6)], {"eps": 1e-6, "rope": 1}, "rope must be True or False"),
    ("CONCAT", [(2, 3), (2, 4)], {"axis": 0}, "input 1 has size 4 in dim 1, input 0 has 3"),
    ("CONCAT", [(2, 3), (2, 3, 1)], {"axis": 0}, "input 1 has 3 dimensions"),
    ("CONCAT", [(2, 3), (2, 3)], {"axis": 2}, r"axis must be an int in \[-2, 2\)"),
    ("CONCAT", [(2, 3), (2, 3)], {}, "needs axis"),
    ("CONCAT", [(2, 3)], {"axis": 0}, "takes 2 to 4 input tensors"),
    ("CONCAT", [(2, 3)] * 5, {"axis": 0}, "takes 2 to 4 input tensors"),
    ("MUL_MAT", [(3, 4), (5, 6)], {}, r"K differs: input 0 \(x\) \(3, 4\) has K=4"),
    ("MUL_MAT", [(4,), (5, 4)], {}, "input 0 has shape"),
    ("MUL_MAT", [(2, 3, 4), (3, 5, 4)], {}, "do not broadcast"),
    ("MUL_MAT", [(3, 4), (5, 4)], {"kernel": "fast"}, "kernel must be one of"),
    ("MUL_MAT", [(3, 4), (5, 4), (4,)], {}, "a norm weight needs rms_eps"),
    ("MUL_MAT", [(3, 4), (5, 4), (3,)], {"rms_eps": 1e-6}, r"norm weight g \(\[K\]\)"),
    ("MUL_MAT", [(3, 4), (5, 4)], {"rms_eps": 1e-6}, "rms_eps is given without a norm weight"),
    ("MUL_MAT", [(3, 4), (5, 4), (4,)], {"rms_eps": 1e-6, "kernel": "gemm"}, "runs the gemv kernel"),
    ("MUL_MAT", [(3, 4), (5, 4), (4,)], {"rms_eps": -1.0}, "rms_eps must be ≥ 0"),
    ("MUL_MAT", [(3, 0), (5, 0)], {}, "input 0 is empty"),
    ("GET_ROWS", [(4, 5), (3,)], {}, r"input 1 \(ids\) is \(3,\) f32; expected a 1-D i32"),
    ("GET_ROWS", [(4, 5), ("i32", (3, 1))], {}, "expected a 1-D i32"),
    ("GET_ROWS", [(20,), ("i32", (3,))], {}, r"input 0 \(table\) is \(20,\) f32; expected a 2-D f32"),
    ("GET_ROWS", [("i32", (4, 5)), ("i32", (3,))], {}, "expected a 2-D f32"),
    ("SOFT_MAX", [("i32", (4, 5))], {}, "input 0 has dtype i32; expected f32"),
]


@pytest.mark.parametrize("name, shapes, params, message", BAD_CALLS,
                         ids=[f"{c[0]}-{c[3][:24]}" for c in BAD_CALLS])
def test_bad_calls_raise_clear_errors(name, shapes, params, message):
    g = Graph()
    inputs = [g.input(f"in{i}", *((s[1], s[0]) if isinstance(s[0], str) else (s,))) for i, s in enumerate(shapes)]
    with pytest.raises(ValueError, match=message):
        g.op(name, *inputs, **params)
