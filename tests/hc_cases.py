"""HC kernels at one lavapipe subgroup size: the worker that tests/test_hc.py runs in a subprocess per
size (LP_NATIVE_VECTOR_WIDTH=128/256/512 → 4/8/16, DSV4_HC_EXPECT_SG=the size it must see):

    LP_NATIVE_VECTOR_WIDTH=512 DSV4_HC_EXPECT_SG=16 .venv/bin/python -m pytest -q tests/hc_cases.py

Every path this device can run (each fused HC_COMB variant, the fused PRE/POST, the unfused chain)
against the others (NMSE ≤ 1e-7) and against the float64 reference (within f32 rounding), on
fresh random inputs: the spec's cases, subgroup/workgroup boundaries, hypothesis-drawn shapes and
strided views, peaked logits, NaN inputs, grids folded past 65535 workgroups; guard regions
checked after every run.
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4_vk import Executor, Graph, hc
from dsv4_vk.hc.policy import HCUnsupported
from dsv4_vk.hc.metrics import max_abs, nmse, nonfinite_mismatch
from dsv4_vk.hc import kernels as ops_hc
from dsv4_vk.hc.kernels import reference_comb, reference_post, reference_pre

PATH_NMSE = 1e-7          # fused vs unfused (the spec's pass criterion)
REF_NMSE = 1e-12          # comb / coefs vs float64: f32 rounding (≈1e-14) with margin
REF_MAX_ABS = 5e-7        # comb values ≤ 2: a few f32 ulps (tight enough to catch a missing eps = 1e-6)
SITE_NMSE, SITE_MAX_ABS = 1e-11, 2e-6    # a site adds the rounding of its 4·D-long mixes mat-mul
U = 2.0 ** -24            # f32 unit roundoff


def sum_bound(magnitude, n_terms):
    """Elementwise rounding bound of an f32 sum of n_terms products: 2·n·u·Σ|term|."""
    return 2 * n_terms * U * magnitude + 1e-30


def pre_bound(x, w):
    return sum_bound(ops_hc.magnitude(reference_pre, x, w), 4)


def post_bound(f, residual, post, comb):
    return sum_bound(ops_hc.magnitude(reference_post, f, residual, post, comb), 5)


def check_pre(results, x, w, label):
    scale = ops_hc.magnitude(reference_pre, x, w)
    check_paths(results, reference_pre(x, w), label, sum_bound(scale, 4), None, scale)


def check_post(results, f, residual, post, comb, label):
    scale = ops_hc.magnitude(reference_post, f, residual, post, comb)
    check_paths(results, reference_post(f, residual, post, comb), label, sum_bound(scale, 5), None, scale)


SETTINGS = settings(max_examples=25, deadline=None, database=None)


@pytest.fixture(scope="module")
def ex(device):
    want = os.environ.get("DSV4_HC_EXPECT_SG")
    print(f"worker: subgroup size {device.subgroup_size}, expected {want or 'any'}")
    if want:
        assert device.subgroup_size == int(want), f"worker saw subgroup size {device.subgroup_size}, expected {want}"
    return Executor(device)


def comb_paths(device):
    return [(True, v) for v in hc.variants(device)["HC_COMB"]] + [(False, None)]


def run(ex, inputs, build, views=None):
    """Build a graph from named inputs (views: {name: fn(graph tensor) -> view}), run it, check guards."""
    g = Graph()
    t = {k: g.input(k, v.shape) for k, v in inputs.items()}
    for k, fn in (views or {}).items():
        t[k] = fn(t[k])
    outs = build(g, t)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for i, o in enumerate(outs):
        g.output(f"o{i}", o)
    res = ex.run(g, **inputs)
    assert ex.last.check_guards() == [], "a kernel wrote outside its tensor"
    return [res[f"o{i}"] for i in range(len(outs))], g


def comb_inputs(rng, T, peak=1.0):
    return {"mixes": rng.uniform(-2, 2, (T, 24)).astype(np.float32),
            "scale": (rng.uniform(-0.5, 0.5, 3) * peak).astype(np.float32),
            "base": rng.uniform(-0.25, 0.25, 24).astype(np.float32)}


def pre_inputs(rng, T, D):
    return {"x": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
            "weights": rng.uniform(0, 1, (T, 4)).astype(np.float32)}


def post_inputs(rng, T, D):
    return {"f": rng.uniform(-1, 1, (T, D)).astype(np.float32),
            "residual": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
            "post": rng.uniform(0, 2, (T, 4)).astype(np.float32),
            "comb": rng.uniform(0, 1, (T, 4, 4)).astype(np.float32)}


def check_paths(results, ref, label, bound=REF_MAX_ABS, nmse_max=REF_NMSE, scale=None):
    """results: {path name: array}. Each against float64 (NMSE ≤ nmse_max unless None, and
    |error| ≤ bound elementwise), each pair within PATH_NMSE. scale: Σ|term| where the output is a
    sum that may cancel (metrics.nmse)."""
    for name, r in results.items():
        assert r.shape == ref.shape, f"{label} {name}: shape {r.shape}, expected {ref.shape}"
        assert np.isfinite(r).all(), f"{label} {name}: non-finite values"
        e, err = nmse(r, ref, scale), np.abs(r - ref)
        assert nmse_max is None or e <= nmse_max, f"{label} {name}: NMSE {e:.3g} vs float64"
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        assert (err <= bound).all(), (f"{label} {name}: error {err[worst]:.3g} at {worst} beyond the f32 bound "
                                      f"{np.broadcast_to(bound, err.shape)[worst]:.3g}")
    names = list(results)
    for a in names:
        for b in names:
            if a < b:
                e = nmse(results[a], results[b], scale)
                assert e <= PATH_NMSE, f"{label}: {a} vs {b} NMSE {e:.3g}"


def comb_all_paths(ex, inputs, eps=1e-6, n_iter=20, views=None):
    out = {}
    for fused, variant in comb_paths(ex.device):
        (c,), g = run(ex, inputs, lambda g, t: hc.comb(g, t["mixes"], t["scale"], t["base"], eps=eps,
                                                       n_iter=n_iter, fused=fused, variant=variant), views)
        out[g.paths[-1][1]] = c
    return out


# --- HC_COMB ---------------------------------------------------------------------------------------

SPEC_COMB = [(1, 1), (17, 4), (257, 8), (17, 20)] + [(T, 20) for T in (1, 256, 336, 512, 513, 1024, 2048)]


@pytest.mark.parametrize("T, n_iter", SPEC_COMB)
def test_comb_spec_cases(ex, rng, T, n_iter):
    inputs = comb_inputs(rng, T)
    ref = reference_comb(**inputs, eps=1e-6, n_iter=n_iter)
    res = comb_all_paths(ex, inputs, n_iter=n_iter)
    assert len(res) == len(comb_paths(ex.device))
    check_paths(res, ref, f"HC_COMB T={T} n_iter={n_iter}")


def test_comb_subgroup_and_workgroup_boundaries(ex, rng):
    sg = ex.device.subgroup_size
    for T in sorted({t for k in (sg // 16, sg // 4, sg, 16, 64) for t in (k - 1, k, k + 1) if t >= 1}):
        inputs = comb_inputs(rng, T)
        check_paths(comb_all_paths(ex, inputs), reference_comb(**inputs), f"HC_COMB T={T}")


@pytest.mark.parametrize("T", [1, 17, 513])
def test_comb_peaked_logits(ex, rng, T):
    inputs = comb_inputs(rng, T, peak=10.0)
    inputs["scale"][2] = rng.choice([-1, 1]) * rng.uniform(3, 5)    # the comb logits' scale: surely peaked
    ref = reference_comb(**inputs)
    if T > 1:
        row_err = np.abs(ref.sum(-1) - 1).max()
        assert row_err > 1e-3, "peaked logits leave rows visibly unnormalised (several % in the spec)"
    check_paths(comb_all_paths(ex, inputs), ref, f"HC_COMB T={T} peaked")


@SETTINGS
@given(T=st.integers(1, 300), n_iter=st.integers(1, 25), log_eps=st.floats(-8, -2), peak=st.sampled_from([1.0, 10.0]),
       col0=st.integers(0, 6), seed=st.integers(0, 2**32 - 1))
def test_comb_hypothesis_shapes_eps_and_strided_mixes(ex, T, n_iter, log_eps, peak, col0, seed):
    # mixes is a column slice of a wider [T, 31] input: offsets and row strides through push constants
    rng = np.random.default_rng(seed)
    inputs = comb_inputs(rng, T, peak)
    wide = rng.uniform(-2, 2, (T, 31)).astype(np.float32)
    wide[:, col0:col0 + 24] = inputs["mixes"]
    eps = float(10.0 ** log_eps)
    res = comb_all_paths(ex, {**inputs, "mixes": wide}, eps, n_iter, views={"mixes": lambda m: m[:, col0:col0 + 24]})
    check_paths(res, reference_comb(**inputs, eps=eps, n_iter=n_iter), f"HC_COMB T={T} n_iter={n_iter} eps={eps:.2g}")


def test_comb_ends_on_columns(ex, rng):
    inputs = comb_inputs(rng, 300)
    for name, c in comb_all_paths(ex, inputs).items():
        assert np.abs(c.sum(axis=1) - 1).max() < 1e-4, f"{name}: destination columns must sum to 1 − O(eps)"


def test_comb_nan_inputs_propagate_alike(ex, rng):
    inputs = comb_inputs(rng, 40)
    inputs["mixes"][[3, 17], [9, 20]] = np.nan         # comb logits of tokens 3 and 17
    inputs["mixes"][25, 2] = np.nan                    # a pre mix: HC_COMB must not care
    ref = reference_comb(**inputs)
    res = comb_all_paths(ex, inputs)
    for name, c in res.items():
        assert nonfinite_mismatch(c, ref) == 0, f"{name}: NaN placement differs from the reference"
        assert np.isnan(c[[3, 17]]).all() and np.isfinite(np.delete(c, [3, 17], axis=0)).all(), name
        assert nmse(c, ref) <= REF_NMSE, name


@pytest.mark.parametrize("variant", ["sg16", "rows4"])
def test_comb_grid_folded_past_65535_workgroups(ex, rng, variant):
    if variant not in hc.variants(ex.device)["HC_COMB"]:
        pytest.skip(f"{variant} cannot run at subgroup size {ex.device.subgroup_size} (tested where it can)")
    per_group = ex.device.subgroup_size // 4 if variant == "sg16" else ops_hc.ROWS4_WORKGROUP // 4
    T = 65535 * per_group + 3
    inputs = comb_inputs(rng, T)
    (c,), g = run(ex, inputs, lambda g, t: hc.comb(g, t["mixes"], t["scale"], t["base"], variant=variant))
    assert g.nodes[-1].op.name == "HC_COMB"
    # tokens are independent: check the first and last (folded part of the grid) and a random sample
    idx = np.unique(np.concatenate([np.arange(64), np.arange(T - 64 * per_group, T), rng.integers(0, T, 4000)]))
    ref = reference_comb(inputs["mixes"][idx], inputs["scale"], inputs["base"])
    assert nmse(c[idx], ref) <= REF_NMSE and max_abs(c[idx], ref) <= REF_MAX_ABS
    assert np.isfinite(c).all()


def test_sg16_below_16_lanes_is_refused_and_the_kernel_poisons(ex, rng, monkeypatch):
    if ex.device.subgroup_size >= 16:
        pytest.skip("this device can run sg16")
    g0 = Graph()
    with pytest.raises(HCUnsupported, match="subgroup size"):
        hc.comb(g0, g0.input("m", (2, 24)), g0.input("s", (3,)), g0.input("b", (24,)), variant="sg16",
                device=ex.device)
    # force the 16-lane pipeline onto this smaller subgroup: the kernel must write NaN, not garbage
    monkeypatch.setattr(ops_hc, "comb_support", lambda d: {"sg16": None, "rows4": None})
    monkeypatch.setattr(ops_hc, "sg16_subgroup_size", lambda d: 16)
    inputs = comb_inputs(rng, 9)
    g = Graph()
    t = {k: g.input(k, v.shape) for k, v in inputs.items()}
    g.output("c", g.op("HC_COMB", t["mixes"], t["scale"], t["base"], eps=1e-6, n_iter=20, variant="sg16"))
    c = ex.run(g, **inputs)["c"]
    assert np.isnan(c).all(), "a 16-lane kernel on a smaller subgroup must poison its output"
    assert ex.last.check_guards() == []


# --- HC_PRE / HC_POST ----------------------------------------------------------------------------------

SPEC_DT = [(1, 1), (31, 17), (128, 257), (4096, 21)]


def pre_all_paths(ex, inputs, views=None):
    out = {}
    for fused in (True, False):
        (u,), g = run(ex, inputs, lambda g, t: hc.pre(g, t["x"], t["weights"], fused=fused), views)
        out[g.paths[-1][1]] = u
    return out


def post_all_paths(ex, inputs, views=None):
    out = {}
    for fused in (True, False):
        (o,), g = run(ex, inputs, lambda g, t: hc.post(g, t["f"], t["residual"], t["post"], t["comb"],
                                                       fused=fused), views)
        out[g.paths[-1][1]] = o
    return out


@pytest.mark.parametrize("D, T", SPEC_DT + [(2, 3), (5, 9), (257, 3), (1028, 2), (7168, 1)])
def test_pre_and_post_cases(ex, rng, D, T):
    i = pre_inputs(rng, T, D)
    check_pre(pre_all_paths(ex, i), i["x"], i["weights"], f"HC_PRE D={D} T={T}")
    i = post_inputs(rng, T, D)
    check_post(post_all_paths(ex, i), **i, label=f"HC_POST D={D} T={T}")


@SETTINGS
@given(T=st.integers(1, 40), D=st.integers(1, 300), layout=st.sampled_from(["contiguous", "streams_outer", "d_strided"]),
       seed=st.integers(0, 2**32 - 1))
def test_pre_post_hypothesis_shapes_and_views(ex, T, D, layout, seed):
    """x / residual as a contiguous input, as a permuted [4,T,D] input (strided, read in place), or as
    a transposed [T,D,4] input (last axis strided: the graph inserts a CONT)."""
    rng = np.random.default_rng(seed)
    pi, qi = pre_inputs(rng, T, D), post_inputs(rng, T, D)
    feed = {"contiguous": lambda a: a, "streams_outer": lambda a: np.ascontiguousarray(a.transpose(1, 0, 2)),
            "d_strided": lambda a: np.ascontiguousarray(a.transpose(0, 2, 1))}[layout]
    view = {"contiguous": lambda t: t, "streams_outer": lambda t: t.permute(1, 0, 2),
            "d_strided": lambda t: t.transpose(1, 2)}[layout]
    res = pre_all_paths(ex, {**pi, "x": feed(pi["x"])}, views={"x": view})
    check_pre(res, pi["x"], pi["weights"], f"HC_PRE T={T} D={D} {layout}")
    res = post_all_paths(ex, {**qi, "residual": feed(qi["residual"])}, views={"residual": view})
    check_post(res, **qi, label=f"HC_POST T={T} D={D} {layout}")


def test_pre_post_nan_inputs_propagate_alike(ex, rng):
    T, D = 6, 12
    pi, qi = pre_inputs(rng, T, D), post_inputs(rng, T, D)
    pi["x"][1, 2, 5] = np.nan
    pi["weights"][4, 0] = np.nan
    qi["residual"][0, 3, 7] = np.nan
    qi["comb"][2, 1, 3] = np.nan
    qi["post"][5, 0] = np.nan
    for res, ref, bound in ((pre_all_paths(ex, pi), reference_pre(pi["x"], pi["weights"]), pre_bound(pi["x"], pi["weights"])),
                            (post_all_paths(ex, qi), reference_post(**qi), post_bound(**qi))):
        assert np.isnan(ref).any() and np.isfinite(ref).any()
        ok = np.isfinite(ref)
        for name, r in res.items():
            assert nonfinite_mismatch(r, ref) == 0, f"{name}: NaN placement differs from the reference"
            assert (np.abs(r - ref)[ok] <= bound[ok]).all(), name


@pytest.mark.parametrize("op", ["pre", "post"])
def test_pre_post_grid_folded_past_65535_workgroups(ex, rng, op):
    T, D = 65537, 4                    # one workgroup per token slice
    if op == "pre":
        i = pre_inputs(rng, T, D)
        (u,), _ = run(ex, i, lambda g, t: hc.pre(g, t["x"], t["weights"], fused=True))
        ref, bound = reference_pre(i["x"], i["weights"]), pre_bound(i["x"], i["weights"])
    else:
        i = post_inputs(rng, T, D)
        (u,), _ = run(ex, i, lambda g, t: hc.post(g, t["f"], t["residual"], t["post"], t["comb"], fused=True))
        ref, bound = reference_post(**i), post_bound(**i)
    assert (np.abs(u - ref) <= bound).all()


# --- a whole site ---------------------------------------------------------------------------------------

def site_inputs(rng, T, D, m=24, peak=1.0):
    return {"X": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
            "fn": (rng.uniform(-1, 1, (m, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32),
            "scale": (rng.uniform(-0.5, 0.5, 3 if m == 24 else 1) * peak).astype(np.float32),
            "base": rng.uniform(-0.25, 0.25, m).astype(np.float32)}


SITE_CASES = [(1, 1, 1.0), (3, 2, 1.0), (64, 5, 1.0), (4096, 2, 1.0), (64, 8, 10.0), (256, 17, 1.0), (64, 17, 10.0)]


@pytest.mark.parametrize("D, T, peak", SITE_CASES)
def test_site_pre_all_paths(ex, rng, D, T, peak):
    """fused: HC_MIX (T ≤ 8) or RMS_NORM + MUL_MAT, then HC_COEFS and HC_PRE; unfused: the whole chain."""
    inputs = site_inputs(rng, T, D, peak=peak)
    pre_w, post_w, comb_w = ops_hc.reference_site_coefs(**inputs)
    refs = (reference_pre(inputs["X"], pre_w), post_w, comb_w)
    u_scale = ops_hc.magnitude(reference_pre, inputs["X"], pre_w)
    results = [{}, {}, {}]
    for fused in (True, False):
        outs, g = run(ex, inputs, lambda g, t: hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], fused=fused))
        ops = [n.op.name for n in g.nodes]
        if fused:
            mix = T <= hc.mix_max_t(ex.device)
            assert ("HC_MIX" in ops) == mix and "HC_COEFS" in ops and "HC_PRE" in ops, ops
            assert len(ops) == (3 if mix else 4), ops
        name = "+".join(p[1] for p in g.paths)
        for k, o in enumerate(outs):
            results[k][name] = o
    for k, what in enumerate(("u", "post", "comb")):
        check_paths(results[k], refs[k], f"site D={D} T={T} {what}", SITE_MAX_ABS, SITE_NMSE,
                    u_scale if what == "u" else None)


@pytest.mark.parametrize("D, T", [(1, 1), (7, 3), (1024, 8), (64, 9)])
def test_head_pre_all_paths(ex, rng, D, T):
    i = site_inputs(rng, T, D, m=4)
    w = ops_hc.reference_head_weights(i["X"], i["fn"], i["scale"], i["base"])
    ref, scale = reference_pre(i["X"], w), ops_hc.magnitude(reference_pre, i["X"], w)
    res = {}
    for fused in (True, False):
        (u,), g = run(ex, i, lambda g, t: hc.head_pre(g, t["X"], t["fn"], t["scale"], t["base"], fused=fused))
        res[g.paths[-1][1]] = u
    check_paths(res, ref, f"head D={D} T={T}", SITE_MAX_ABS, SITE_NMSE, scale)


@SETTINGS
@given(T=st.integers(1, 9), D=st.integers(1, 70), m=st.sampled_from([4, 24]), layout=st.sampled_from(["c", "strided"]),
       seed=st.integers(0, 2**32 - 1))
def test_mix_kernel_hypothesis(ex, T, D, m, layout, seed):
    """HC_MIX alone: any D (vec4 or scalar), m rows, X contiguous or a permuted [4,T,D] input."""
    rng = np.random.default_rng(seed)
    i = site_inputs(rng, T, D, m=m)
    X = i["X"] if layout == "c" else np.ascontiguousarray(i["X"].transpose(1, 0, 2))
    view = {"X": (lambda t: t) if layout == "c" else (lambda t: t.permute(1, 0, 2))}
    (mix,), _ = run(ex, {"X": X, "fn": i["fn"]}, lambda g, t: g.op("HC_MIX", t["X"], t["fn"], norm_eps=1e-6), view)
    ref = ops_hc.reference_mixes(i["X"], i["fn"])
    x = i["X"].reshape(T, -1).astype(np.float64)
    r = 1 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)
    bound = 64 * U * (np.abs(x) @ np.abs(i["fn"].T)) * r + 8 * U * np.abs(ref)   # dot over 4·D, then the norm
    assert (np.abs(mix - ref) <= bound).all(), np.abs(mix - ref).max()


@pytest.mark.parametrize("T", [1, 17, 300])
def test_coefs_kernel(ex, rng, T):
    """HC_COEFS alone, every variant: gates and comb in the mixes' layout."""
    inputs = comb_inputs(rng, T)
    ref = ops_hc.reference_coefs(**inputs)
    for variant in hc.variants(ex.device)["HC_COMB"]:
        (c,), _ = run(ex, inputs, lambda g, t: g.op("HC_COEFS", t["mixes"], t["scale"], t["base"], eps=1e-6,
                                                    n_iter=20, variant=variant))
        assert nmse(c, ref) <= REF_NMSE and max_abs(c, ref) <= REF_MAX_ABS, variant
