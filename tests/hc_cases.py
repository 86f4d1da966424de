"""HC kernels at one lavapipe subgroup size: the worker that tests/test_hc.py runs in a subprocess per
size (LP_NATIVE_VECTOR_WIDTH=128/256/512 → 4/8/16, DSV4_HC_EXPECT_SG=the size it must see):

    LP_NATIVE_VECTOR_WIDTH=512 DSV4_HC_EXPECT_SG=16 .venv/bin/python -m pytest -q tests/hc_cases.py

Every path this device can run (each fused HC_COMB variant, the fused PRE/POST, the unfused chain)
against the others (NMSE ≤ 1e-7) and against the float64 reference (within f32 rounding), on
fresh random inputs: the spec's cases, subgroup/workgroup boundaries, hypothesis-drawn shapes and
strided views, peaked logits, NaN inputs, grids folded past 65535 workgroups; guard regions
checked after every run.
"""
import contextlib
import dataclasses
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4_vk import Executor, Graph, hc
from dsv4_vk.hc import cases
from dsv4_vk.vk import default_device
import dsv4_vk.hc.composite  # noqa: F401  (hc.composite.CARRY_MAX_T)
from dsv4_vk.hc.policy import HCUnsupported
from dsv4_vk.hc.metrics import max_abs, nmse, nonfinite_mismatch
from dsv4_vk.hc import kernels as ops_hc, mix_kernels, plan as hc_plan, tcr
from dsv4_vk.hc.kernels import reference_comb, reference_post, reference_pre

PATH_NMSE, U, sum_bound = cases.PATH_NMSE, cases.U, cases.sum_bound
REF_NMSE, REF_MAX_ABS = cases.COMB_NMSE, cases.COMB_MAX_ABS
SITE_NMSE, SITE_MAX_ABS = cases.SITE_NMSE, cases.SITE_MAX_ABS


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


def comb_inputs(rng, T, peaked=False):
    return cases.make_inputs(cases.Case("HC_COMB", T, peaked=peaked), rng)


def pre_inputs(rng, T, D):
    return cases.make_inputs(cases.Case("HC_PRE", T, D), rng)


def post_inputs(rng, T, D):
    return cases.make_inputs(cases.Case("HC_POST", T, D), rng)


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


# --- the one HC case list (what `dsv4_vk eval` runs), every case along every path ------------------------

DEVICE_CASES = cases.eval_cases(default_device())


@pytest.mark.parametrize("case", DEVICE_CASES, ids=[c.name for c in DEVICE_CASES])
def test_case_list(ex, rng, case):
    rows = cases.evaluate_case(ex.device, case, cases.paths(ex.device, case.op), rng)
    assert len(rows) == len(cases.paths(ex.device, case.op)) - case.fused_only
    bad = [r for r in rows if not r["pass"]]
    assert not bad, [{k: r[k] for k in ("path", "nmse_ref", "max_abs", "bound_excess", "nmse_unfused",
                                         "nonfinite", "guards", "error", "note")} for r in bad]


# --- HC_COMB beyond the case list ------------------------------------------------------------------------

@SETTINGS
@given(T=st.integers(1, 300), n_iter=st.integers(1, 25), log_eps=st.floats(-8, -2), peak=st.sampled_from([1.0, 10.0]),
       col0=st.integers(0, 6), seed=st.integers(0, 2**32 - 1))
def test_comb_hypothesis_shapes_eps_and_strided_mixes(ex, T, n_iter, log_eps, peak, col0, seed):
    # mixes is a column slice of a wider [T, 31] input: offsets and row strides through push constants
    rng = np.random.default_rng(seed)
    inputs = comb_inputs(rng, T, peak > 1)
    wide = rng.uniform(-2, 2, (T, 31)).astype(np.float32)
    wide[:, col0:col0 + 24] = inputs["mixes"]
    eps = float(10.0 ** log_eps)
    res = comb_all_paths(ex, {**inputs, "mixes": wide}, eps, n_iter, views={"mixes": lambda m: m[:, col0:col0 + 24]})
    check_paths(res, reference_comb(**inputs, eps=eps, n_iter=n_iter), f"HC_COMB T={T} n_iter={n_iter} eps={eps:.2g}",
                bound=cases.comb_max_abs(**inputs))


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


def test_sg16_below_16_lanes_is_refused_and_the_kernel_poisons(ex, rng, monkeypatch):
    g0 = Graph()
    args = (g0.input("m", (2, 24)), g0.input("s", (3,)), g0.input("b", (24,)))
    if ex.device.subgroup_size >= 16:       # the 16-lane kernel is this device's to run: the same call is accepted
        hc.comb(g0, *args, variant="sg16", device=ex.device)
        assert [n.op.name for n in g0.nodes] == ["HC_COMB"]
        return
    with pytest.raises(HCUnsupported, match="subgroup size"):
        hc.comb(g0, *args, variant="sg16", device=ex.device)
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


# --- a whole site ---------------------------------------------------------------------------------------

def site_inputs(rng, T, D, m=24, peak=1.0):
    return {"X": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
            "fn": (rng.uniform(-1, 1, (m, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32),
            "scale": (rng.uniform(-0.5, 0.5, 3 if m == 24 else 1) * peak).astype(np.float32),
            "base": rng.uniform(-0.25, 0.25, m).astype(np.float32)}


SITE_CASES = [c for c in DEVICE_CASES if c.op == "HC_SITE_PRE" and c.T > 0]
# (fused, site): the site kernels, the three fused ops, the unfused chains
SITE_PATHS = [(True, True), (True, False), (False, None)]


@pytest.mark.parametrize("T, D", [(1, 64), (3, 4096), (9, 36), (70, 260)])
def test_site_scale_and_base_views(ex, rng, T, D):
    """A site's scale and base as views at an offset and a stride into wider tensors (a model's packed
    parameters): u, post and comb on each path (the site kernels, the three fused ops, the unfused
    chain) against float64."""
    i = site_inputs(rng, T, D)
    scale_w = rng.uniform(-0.5, 0.5, 9).astype(np.float32)
    base_w = rng.uniform(-0.25, 0.25, 60).astype(np.float32)
    scale, base = scale_w[4:7], base_w[5:53:2]           # the views below
    feed = {"X": i["X"], "fn": i["fn"], "scale_w": scale_w, "base_w": base_w}
    pre, post, comb = ops_hc.reference_site_coefs(i["X"], i["fn"], scale, base, 1e-6, 1e-6, 20)
    u = reference_pre(i["X"], pre)
    for fused, site in SITE_PATHS:
        outs, _ = run(ex, feed, lambda g, t: hc.site_pre(g, t["X"], t["fn"], t["scale_w"][4:7], t["base_w"][5:53:2],
                                                          fused=fused, site=site, device=ex.device))
        for name, got, ref in (("u", outs[0], u), ("post", outs[1], post), ("comb", outs[2], comb)):
            e = nmse(got, ref)
            assert e <= SITE_NMSE, f"T={T} D={D} fused={fused} site={site} {name}: NMSE {e:.3g} vs float64"


@pytest.mark.parametrize("case", SITE_CASES, ids=[c.name for c in SITE_CASES])
def test_site_pre_structure(ex, case):
    """site: HC_MIX_PART + HC_SITE; three-op: the mixes (HC_MIX, or HC_MIX_PART + HC_MIX_REDUCE), HC_COEFS,
    HC_PRE_GATE, with no barrier between the last two (the collapse forms its own gates); numbers:
    test_case_list, and the chain test below for all three paths."""
    from dsv4_vk.cli.bench import graph_barriers
    for site in (True, False):
        g = Graph()
        t = {k: g.input(k, s) for k, s in cases.input_shapes(case).items()}
        outs = hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], site=site, device=ex.device)
        ops = [n.op.name for n in g.nodes]
        if site:
            assert ops == ["HC_MIX_PART", "HC_SITE"], ops
        else:
            assert ops[-2:] == ["HC_COEFS", "HC_PRE_GATE"] and ops[:-2] in (["HC_MIX"], ["HC_MIX_PART", "HC_MIX_REDUCE"]), ops
            for name, o in zip(("u", "post", "comb"), outs):
                g.output(name, o)
            assert graph_barriers(ex.device, g) == len(ops) - 2, ops     # one after each mixes dispatch only


def chain_reference(i, n_sites, stage_inputs=None):
    """float64: n_sites sites (sublayer f = 0.5·u + 0.1, fn/scale/base per site) then the head collapse;
    returns ([X after each site], [u of each site], head output, [(terms' magnitude) of u and X], head's).
    stage_inputs: a path's own X after each site; then stage k > 0 and the head start from that path's
    X (each stage's own rounding, not the conditioning of the chain before it)."""
    X = np.asarray(i["X"], np.float64)
    xs, us, mags = [], [], []
    for k in range(n_sites):
        if stage_inputs is not None and k > 0:
            X = np.asarray(stage_inputs[k - 1], np.float64)
        pre_w, post_w, comb_w = ops_hc.reference_site_coefs(X, i[f"fn{k}"], i[f"scale{k}"], i[f"base{k}"])
        u = reference_pre(X, pre_w)
        f = 0.5 * u + 0.1
        mags.append((ops_hc.magnitude(reference_pre, X, pre_w), ops_hc.magnitude(reference_post, f, X, post_w, comb_w)))
        X = reference_post(f, X, post_w, comb_w)
        us.append(u)
        xs.append(X)
    if stage_inputs is not None:
        X = np.asarray(stage_inputs[n_sites - 1], np.float64)
    w = ops_hc.reference_head_weights(X, i["fn_h"], i["scale_h"], i["base_h"])
    return xs, us, reference_pre(X, w), mags, ops_hc.magnitude(reference_pre, X, w)


def chain_inputs(rng, T, D, n_sites, peak=1.0):
    out = {"X": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)}
    for k in range(n_sites):
        s = site_inputs(rng, T, D, peak=peak)
        out.update({f"fn{k}": s["fn"], f"scale{k}": s["scale"], f"base{k}": s["base"]})
    h = site_inputs(rng, T, D, m=4)
    out.update(fn_h=h["fn"], scale_h=h["scale"], base_h=h["base"])
    return out


def run_chain(ex, inputs, n_sites, fused, site, views=None):
    """n_sites sites with hc.site (each post given the next site's fn), then head_pre with the carry."""
    def build(g, t):
        X, carry, outs = t["X"], None, []
        fns = [t[f"fn{k}"] for k in range(n_sites)] + [t["fn_h"]]
        for k in range(n_sites):
            us = []
            X, carry = hc.site(g, X, fns[k], t[f"scale{k}"], t[f"base{k}"],
                               lambda u: (us.append(u), g.op("SCALE", u, a=0.5, b=0.1))[1], mix=carry,
                               next_fn=fns[k + 1], fused=fused, site=site)
            outs += [us[0], X]
        outs.append(hc.head_pre(g, X, t["fn_h"], t["scale_h"], t["base_h"], mix=carry, fused=fused, site=site))
        return tuple(outs)
    return run(ex, inputs, build, views)


@pytest.mark.parametrize("D, T, peak, layout, post", [
    (1, 1, 1.0, "c", {}), (5, 3, 1.0, "c", {"post_wg": 16}), (64, 8, 10.0, "c", {"post_wg": 32}),
    (64, 9, 1.0, "c", {}), (33, 4, 1.0, "streams_outer", {}), (4096, 1, 1.0, "c", {}),
    (7168, 2, 1.0, "c", {"post_wg": 256}), (256, 40, 10.0, "streams_outer", {})])
def test_site_chain_site_vs_three_op_vs_unfused_vs_float64(ex, rng, D, T, peak, layout, post):
    """Two whole sites and the head collapse, the posts carrying the next mixes (HC_POST_MIX, several
    layouts) at T ≤ CARRY_MAX_T: the streams after each site, each u and the head's output on every
    path against float64 and each other. X is also fed as a permuted [4,T,D] input (strided views)."""
    with tuning(hc.composite.SITE_TUNING, **post):
        site_chain_case(ex, rng, D, T, peak, layout)


@pytest.mark.parametrize("D, T, layout, kernel", [(64, 70, "c", "ksplit"), (33, 9, "c", "ksplit"),
                                                   (256, 40, "streams_outer", "ksplit"), (4096, 65, "c", "ksplit"),
                                                   (68, 70, "c", "tc"), (33, 9, "c", "tc"),
                                                   (256, 40, "streams_outer", "tc"), (4096, 65, "c", "tc"),
                                                   (64, 300, "c", "ksplit-gpu"), (36, 130, "streams_outer", "ksplit-gpu")])
def test_site_chain_carrying_at_prefill(ex, rng, D, T, layout, kernel, monkeypatch):
    """The chain with PREFILL_CARRY: past CARRY_MAX_T each post is HC_POST_MIX in KSPLIT's layout, or the
    tensor-core kernel's (where the streams are vec4-aligned; odd D keeps KSPLIT), and the next site starts
    from HC_MIX_REDUCE of its partials (three-op path; the site kernels when forced). ksplit-gpu: lowered
    as for a GPU, KSPLIT in the carry's own layout (PREFILL_CARRY's tb, lpt, tpl: 128-token blocks)."""

    def carry_params():
        g = Graph()
        hc.composite.site_post(g, g.input("f", (T, D)), g.input("X", (T, 4, D)), g.input("post", (T, 4)),
                               g.input("comb", (T, 4, 4)), next_fn=g.input("fn", (24, 4 * D)), device=ex.device)
        (node,) = [n for n in g.nodes if n.op.name == "HC_POST_MIX"]
        return node.params

    if kernel == "ksplit-gpu":
        monkeypatch.setattr(ex.device, "caps", dataclasses.replace(ex.device.caps, type="discrete-gpu"))
        kernel = "ksplit"
        assert {k: carry_params()[k] for k in ("tb", "lpt", "tpl")} == \
            {k: hc.composite.PREFILL_CARRY[k] for k in ("tb", "lpt", "tpl")}
    with tuning(hc.composite.PREFILL_CARRY, prefill=True, kernel=kernel):
        assert hc.carries(ex.device, True, T, D, None) and hc.carries(ex.device, True, T, D, True)
        assert kernel == "tc" or carry_params()["split"] == mix_kernels.KSPLIT_S
        site_chain_case(ex, rng, D, T, 1.0, layout)


@pytest.mark.parametrize("D, T, wg, cpt", [(64, 1, 16, 2), (33, 3, 16, 4), (256, 2, 32, 2), (4096, 1, None, 4),
                                         (7, 9, 8, 3)])
def test_site_chain_across_slice_layouts(ex, rng, D, T, wg, cpt):
    """The chain again with other slice layouts of HC_SITE, HC_PRE_GATE and HC_POST: workgroup size and
    chunks per invocation (X prefetched per chunk; chunks past the row clamped, never stored). HC_SITE
    takes its decode workgroup from SITE_TUNING (set to the same wg here); HC_POST_MIX has its own
    layout (test_site_chain_site_vs_three_op_vs_unfused_vs_float64 varies it)."""
    site_wg = wg or hc.composite.SITE_TUNING["site_wg"]
    with tuning(ops_hc.SLICE_TUNING, wg=wg, cpt=cpt), tuning(hc.composite.SITE_TUNING, site_wg=site_wg):
        site_chain_case(ex, rng, D, T, 1.0, "c")


def site_chain_case(ex, rng, D, T, peak, layout):
    n = 2
    i = chain_inputs(rng, T, D, n, peak)
    feed = {**i, "X": np.ascontiguousarray(i["X"].transpose(1, 0, 2)) if layout == "streams_outer" else i["X"]}
    views = {"X": lambda t: t.permute(1, 0, 2)} if layout == "streams_outer" else None
    xs, us, head, mags, head_mag = chain_reference(i, n)
    refs = [r for k in range(n) for r in (us[k], xs[k])] + [head]
    scales = [m for k in range(n) for m in mags[k]] + [head_mag]
    results = [{} for _ in refs]
    for fused, site in SITE_PATHS:
        outs, g = run_chain(ex, feed, n, fused, site, views)
        ops = [nd.op.name for nd in g.nodes]
        if fused:
            carry = hc.carries(ex.device, fused, T, D, site)
            assert ops.count("HC_POST_MIX") == (n if carry else 0), ops
            if site:
                assert ops.count("HC_MIX_PART") == (1 if carry else n + 1), ops
        name = "site" if site else "three-op" if fused else "unfused"
        for k, o in enumerate(outs):
            results[k][name] = o
    for k, (ref, scale) in enumerate(zip(refs, scales)):
        # end to end: the chain's conditioning (at D = 1 the head's gates see 4 values) amplifies each
        # stage's rounding, so the spec's ceiling; the mixes of every site up to output k (k // 2 + 1 of them)
        # add their rounding (the unfused chain at D = 256, T = 40, peak 10 went 10% past one site's bound in
        # about 1 seed of 100 on lavapipe); each stage alone is held to one site's bound below
        bound = sum_bound(scale, 64) + (k // 2 + 1) * cases.site_max_abs(D)
        check_paths(results[k], ref, f"chain D={D} T={T} output {k}", bound, PATH_NMSE, scale)
    for name in results[0]:
        own_x = [results[2 * k + 1][name] for k in range(n)]
        xs, us, head, _, _ = chain_reference(i, n, stage_inputs=own_x)
        for k, ref in enumerate([r for k in range(n) for r in (us[k], xs[k])] + [head]):
            e = nmse(results[k][name], ref, scales[k])
            assert e <= SITE_NMSE, f"chain D={D} T={T} {name}: stage output {k} NMSE {e:.3g} vs float64 of its own input"


@settings(max_examples=16, deadline=None, database=None)     # each layout is a new pipeline (≈ 0.1 s here)
@given(T=st.integers(1, 12), D=st.integers(1, 70), m=st.sampled_from([4, 24]), layout=st.sampled_from(["c", "strided"]),
       wg=st.sampled_from([16, 64]), groups=st.integers(1, 6), split=st.sampled_from([0, 16]),
       lpt=st.sampled_from([1, 2, 4]), tb=st.sampled_from([1, 5, 64]), tpl=st.sampled_from([1, 2, 4]),
       rh=st.sampled_from([1, 2]), kernel=st.sampled_from([None, "tc"]), seed=st.integers(0, 2**32 - 1))
def test_mix_kernels_hypothesis(ex, T, D, m, layout, wg, groups, split, lpt, tb, tpl, rh, kernel, seed):
    """The mixes through any HC_MIX layout (the per-token kernel: workgroup size, D splits; KSPLIT: chunks
    per split, lanes per token, tokens per block, tokens per lane group, row groups) as HC_MIX or HC_MIX_PART +
    HC_MIX_REDUCE, any D (vec4 or scalar), m rows, X contiguous or a permuted [4,T,D] input; and
    HC_MIX_PART's partials against their float64 layout (the tensor-core kernel: D a multiple of 4)."""
    wg = max(wg, ex.device.subgroup_size)
    D = 4 * -(-D // 4) if kernel == "tc" else D
    rh = rh if lpt * rh <= ex.device.subgroup_size else 1
    with tuning(mix_kernels.MIX_TUNING, wg=wg, groups=groups, split=split, lpt=lpt, tb=tb, tpl=tpl, rh=rh, kernel=kernel):
        mix_layouts_case(ex, T, D, m, layout, seed)


@pytest.mark.parametrize("T,D,lpt,tb", [(70, 64, 4, 64), (9, 8, 2, 5), (33, 5, 1, 64), (1, 12, 4, 1)])
def test_mix_tokens_per_lane_group_give_the_same_sums(ex, rng, T, D, lpt, tb):
    """KSPLIT with two or four tokens per lane group (one shared fn load for all) adds the same terms
    in the same order as one token per group: equal partials, and each against float64 (odd T: a
    group's later tokens past the block or past T)."""
    wg = max(16, ex.device.subgroup_size)
    outs = []
    for tpl in (1, 2, 4):
        with tuning(mix_kernels.MIX_TUNING, kernel="ksplit", wg=wg, split=16, lpt=min(lpt, ex.device.subgroup_size), tb=tb,
                    tpl=tpl):
            seed = int(rng.integers(0, 2**32 - 1)) if not outs else seed
            mix_layouts_case(ex, T, D, 24, "c", seed)
            i = site_inputs(np.random.default_rng(seed), T, D, m=24)
            lay = hc_plan.mix_layout(ex.device, T, D // (4 if D % 4 == 0 else 1))
            assert lay["tpl"] == tpl and lay["split"] == 16
            (part,), _ = run(ex, {"X": i["X"], "fn": i["fn"]}, lambda g, t: (g.op("HC_MIX_PART", t["X"], t["fn"], **lay),))
            outs.append(part)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("T,D,m,tpl,layout", [(130, 64, 24, 4, "c"), (64, 48, 16, 2, "strided"), (70, 4096, 24, 4, "c"),
                                             (300, 80, 8, 1, "c"), (33, 7, 24, 4, "c"), (9, 8, 4, 4, "strided")])
def test_mix_row_groups(ex, rng, T, D, m, tpl, layout):
    """KSPLIT with two row groups (rh = 2: two groups of lanes take the same tokens, each half of the fn
    rows; the GPUs' default): 1, 2 or 4 tokens a group, a last block partly past T, scalar chunks (odd
    D), 24, 16 and 8 rows, and 4 rows (one quad: the kernel runs one group), a permuted X; against
    float64, as HC_MIX and as the partials."""
    lpt = max(1, min(4, ex.device.subgroup_size // 2))
    with tuning(mix_kernels.MIX_TUNING, kernel="ksplit", rh=2, tpl=tpl, lpt=lpt, wg=max(16, ex.device.subgroup_size),
                tb=64):
        lay = hc_plan.mix_layout(ex.device, T, D // (4 if D % 4 == 0 else 1))
        assert lay["rh"] == 2 and mix_kernels.ksplit_row_groups(lay, m) == (2 if m % 8 == 0 else 1)
        mix_layouts_case(ex, T, D, m, layout, int(rng.integers(0, 2**32 - 1)))


def test_ksplit_split_and_shared_memory_are_checked(ex, rng, monkeypatch):
    """KSPLIT takes splits of 16 chunks only (MIX_TUNING["split"] = 32, removed, is refused by name), and a
    fn slice past the device's shared memory is HCUnsupported naming both sizes (here a device that
    reports 16 KiB: 24 rows × 4 streams × 16 vec4 chunks stage 24 KiB)."""
    i = site_inputs(rng, 70, 64, m=24)
    feed = {"X": i["X"], "fn": i["fn"]}
    wg = max(16, ex.device.subgroup_size)
    with tuning(mix_kernels.MIX_TUNING, kernel="ksplit", split=32, wg=wg, lpt=1, tb=64, tpl=1, rh=1):
        with pytest.raises(ValueError, match=r"split must be 16 with partials of groups = ceil\(16 / 16\), got split 32"):
            run(ex, feed, lambda g, t: hc.mixes(g, t["X"], t["fn"]))
    caps = ex.device.caps
    monkeypatch.setattr(ex.device, "caps", dataclasses.replace(caps, limits=dataclasses.replace(
        caps.limits, max_shared_memory=16384)))
    with tuning(mix_kernels.MIX_TUNING, kernel="ksplit", wg=wg, lpt=1, tb=64, tpl=1, rh=1):
        with pytest.raises(HCUnsupported, match="split 16 stages 24576 B of fn in shared memory, .* has 16384 B"):
            run(ex, feed, lambda g, t: hc.mixes(g, t["X"], t["fn"]))


def test_mix_row_groups_refuse_what_the_subgroup_cannot_hold(ex, rng):
    """rh other than 1 or 2, and 2·lpt lanes wider than the subgroup: refused by name."""
    i = site_inputs(rng, 70, 64, m=24)
    sg = ex.device.caps.subgroup.min_size
    base = {"wg": max(16, sg), "groups": 1, "split": 16, "tb": 64, "tpl": 2}
    for params, match in [({**base, "lpt": 1, "rh": 3}, "rh \\(row groups\\) must be 1 or 2"),
                          ({**base, "lpt": sg, "rh": 2}, f"lpt·rh \\({sg}·2\\)")]:
        with pytest.raises(ValueError, match=match):
            run(ex, {"X": i["X"], "fn": i["fn"]}, lambda g, t: (g.op("HC_MIX_PART", t["X"], t["fn"], **params),))


@pytest.mark.parametrize("T,D,split,m,layout", [(130, 64, 12, 24, "c"), (64, 36, 8, 4, "strided"), (3, 4096, 64, 24, "c"),
                                                 (65, 8, 64, 24, "c"), (200, 132, 16, 8, "c")])
def test_mix_tensor_core_kernel(ex, rng, T, D, split, m, layout):
    """The tensor-core kernel TC (cooperative matrices where the device has them, else its FMA form):
    partial token blocks (T past a multiple of 64), splits ending inside a staging step of 16 chunks
    and past D, the head's 4 rows and 8 rows (one fn tile), a permuted X; against float64."""
    with tuning(mix_kernels.MIX_TUNING, kernel="tc", split=split):
        lay = hc_plan.mix_layout(ex.device, T, D // 4)
        assert lay["tc"] == (1 if mix_kernels.tc_tile_n(ex.device) else 2) and lay["split"] == split
        mix_layouts_case(ex, T, D, m, layout, int(rng.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("T,D,split,m,layout,tt", [(130, 128, 32, 24, "c", 1), (64, 64, 16, 4, "strided", 1),
                                                    (3, 1024, 64, 24, "c", 2), (77, 448, 16, 8, "c", 2)])
def test_mix_tcr_kernel(ex, rng, T, D, split, m, layout, tt):
    """TCR, x split in registers into the tensor-core matrices' elements (cooperative matrices where the
    device's probed layout is TCR's, else its emulation through shared memory) with fn split once by
    HC_MIX_FN_SPLIT: partial 16-token tiles and workgroup blocks, the head's 4 rows and 8 rows, D = 448
    (7 steps of 64), a permuted X; against float64."""
    if tt == 2 and not isinstance(tcr.tcr_layout(ex.device), tuple) and ex.device.caps.limits.max_shared_memory < 40000:
        tt = 1                                 # (the emulation of 128-token blocks needs 39 KiB of shared memory)
    with tuning(mix_kernels.MIX_TUNING, kernel="tcr", split=split, tt=tt):
        lay = hc_plan.mix_layout(ex.device, T, D // 4)
        assert lay["tcr"] and lay["tt"] == tt and lay["cm"] == int(isinstance(tcr.tcr_layout(ex.device), tuple))
        mix_layouts_case(ex, T, D, m, layout, int(rng.integers(0, 2**32 - 1)))


def test_mix_fn_split_words(ex, rng):
    """HC_MIX_FN_SPLIT's words are the reference's bit for bit, and decode to fn within fp32's rounding
    (hi + 2⁻¹¹·lo, 22 significant bits), rows past m zero; tiny weights (fp16 subnormal hi) included."""
    m, D = 20, 128
    fn = rng.uniform(-1, 1, (m, 4 * D)).astype(np.float32)
    fn[:, ::5] *= 1e-6
    lay = tcr.tcr_layout(ex.device)
    lay = lay if isinstance(lay, tuple) else tcr.TCR_H200_LAYOUT
    (w,), _ = run(ex, {"fn": fn}, lambda g, t: (g.op("HC_MIX_FN_SPLIT", t["fn"], layout=lay),))
    ref = tcr.HcMixFnSplit().reference(fn, layout=lay)
    assert w.view(np.uint32).tolist() == ref.view(np.uint32).tolist()
    back = tcr.tcr_fn_from_split(w, m, D, lay)
    assert np.all(np.abs(back - fn) <= 2.0 ** -22 * np.abs(fn) + 2.0 ** -36), np.abs(back - fn).max()
    assert not np.any(tcr.tcr_fn_from_split(w, 24, D, lay)[m:])


def _probe_of(a_entry, b_entry):
    """A probe's A [32, 8] and B [32, 4] from per-element entry functions of (g, q, e)."""
    a = np.array([[a_entry(l // 4, l % 4, e) for e in range(8)] for l in range(32)])
    b = np.array([[b_entry(l // 4, l % 4, e) for e in range(4)] for l in range(32)])
    return a, b


def _h200_entries(a_order=range(8), b_order=range(4)):
    """The H200's A element e = (g + 8·(e ≥ 4), 2q + (0, 1, 8, 9)[e % 4]), B e = (g + 8·(e ≥ 2), 2q + e % 2),
    in another order of the elements where asked."""
    ao, bo = list(a_order), list(b_order)
    return (lambda g, q, e: (g + 8 * (ao[e] >= 4)) * 16 + 2 * q + (0, 1, 8, 9)[ao[e] % 4],
            lambda g, q, e: (g + 8 * (bo[e] >= 2)) * 8 + 2 * q + bo[e] % 2)


def test_tcr_layout_from_a_probe():
    """The probe's layouts: the H200's gives TCR_H200_LAYOUT; another order of the elements other constants;
    an entry outside the lane's rows or columns, one missing, or lanes that differ: a reason, not constants."""
    assert tcr.tcr_layout_from(*_probe_of(*_h200_entries())) == tcr.TCR_H200_LAYOUT
    other = tcr.tcr_layout_from(*_probe_of(*_h200_entries([4, 5, 6, 7, 0, 1, 2, 3], [1, 0, 3, 2])))
    assert other == (0b00001111, tcr.TCR_H200_LAYOUT[1], 0b10_11_00_01)
    a, b = _probe_of(*_h200_entries())
    ptx_b = np.array([[(2 * (l % 4) + (e & 1) + 8 * (e >> 1)) * 8 + l // 4 for e in range(4)] for l in range(32)])
    for bad, match in [((np.where(np.arange(8) == 2, 16 * 15, a), b), "A element 2 of lane 0 is \\(15, 0\\)"),
                       ((a[:, [0, 0, 2, 3, 4, 5, 6, 7]], b), "do not cover"),
                       ((a, ptx_b), "B element 1 of lane 0 is \\(1, 0\\), not in rows 0, 8"),
                       ((np.vstack([a[:1], a[1:2][:, [1, 0, 2, 3, 4, 5, 6, 7]], a[2:]]), b), "differs|different entry")]:
        reason = tcr.tcr_layout_from(*bad)
        assert isinstance(reason, str), bad
        assert re.search(match, reason), reason


def test_tcr_emulation_follows_the_layout_constants(ex, rng, monkeypatch):
    """The emulation reads the same spec constants as the kernel: with another order of the elements (as
    a device could have) it still matches float64 — the constants reach every element, not just the
    H200's order."""
    if isinstance(tcr.tcr_layout(ex.device), tuple):
        pytest.skip("this device runs TCR on its cooperative matrices (test_mix_tcr_kernel covers it)")
    other = tcr.tcr_layout_from(*_probe_of(*_h200_entries([6, 4, 7, 5, 2, 0, 3, 1], [3, 1, 2, 0])))
    assert isinstance(other, tuple) and other != tcr.TCR_H200_LAYOUT
    monkeypatch.setattr(mix_kernels, "TCR_H200_LAYOUT", other)     # (what mix_layout gives the emulation)
    with tuning(mix_kernels.MIX_TUNING, kernel="tcr", split=16, tt=1):
        assert hc_plan.mix_layout(ex.device, 70, 16)["layout"] == other
        mix_layouts_case(ex, 70, 64, 24, "c", int(rng.integers(0, 2**32 - 1)))


def test_tcr_refuses_what_it_cannot_take(ex, rng):
    """D not a multiple of 64 (steps of 64 floats), a split not of whole steps, token blocks past the device's
    shared memory, a layout that is not three codes, fn_split of another D: refused by name."""
    g = Graph()
    X, fn = g.input("X", (70, 4, 128)), g.input("fn", (24, 512))
    with pytest.raises(ValueError, match="D must be a multiple of 64, got 96"):
        g.op("HC_MIX_FN_SPLIT", g.input("fn2", (24, 384)), layout=tcr.TCR_H200_LAYOUT)
    with pytest.raises(ValueError, match="layout must be TCR's three element codes"):
        g.op("HC_MIX_FN_SPLIT", fn, layout=(1, 2))
    fw = g.op("HC_MIX_FN_SPLIT", fn, layout=tcr.TCR_H200_LAYOUT)
    base = {"m": 24, "groups": 2, "split": 16, "tt": 1, "cm": 0, "layout": tcr.TCR_H200_LAYOUT}
    with pytest.raises(ValueError, match="split .* must be a multiple of 16 and groups = ceil\\(32 / split\\), got split 8"):
        g.op("HC_MIX_TCR", X, fw, **{**base, "split": 8, "groups": 4})
    with pytest.raises(ValueError, match="fn_split"):
        g.op("HC_MIX_TCR", g.input("X2", (70, 4, 64)), fw, **base)
    with pytest.raises(ValueError, match="tt .* must be 1, 2 or 4 and cm 0 or 1, got tt 3"):
        g.op("HC_MIX_TCR", X, fw, **{**base, "tt": 3})
    i = site_inputs(rng, 70, 128, m=24)
    big = {**base, "tt": 4}
    emulated_need = 4 * (256 * 24 + 256) + 16 * (4 * 256 + 3 * 128)        # C tiles and Σx², the emulation's A and B

    def build(g, t):
        return (g.op("HC_MIX_TCR", t["X"], g.op("HC_MIX_FN_SPLIT", t["fn"], layout=tcr.TCR_H200_LAYOUT), **big),)
    if emulated_need > ex.device.caps.limits.max_shared_memory:
        with pytest.raises(HCUnsupported, match=f"tt = 4 \\(256 tokens a workgroup\\) keeps {emulated_need} B in shared"):
            run(ex, {"X": i["X"], "fn": i["fn"]}, build)
    else:                                      # (a device with the room runs it)
        (part,), _ = run(ex, {"X": i["X"], "fn": i["fn"]}, build)
        pref = mix_kernels.reference_mix_partials(i["X"], i["fn"], 2, 4, 16)
        assert nmse(part, pref) < 1e-11


@contextlib.contextmanager
def tuning(table, **values):
    """Set knobs of a tuning table (core.tuning.KnobTable) for the duration of a block."""
    with table.tuned(**values):
        yield


def mix_layouts_case(ex, T, D, m, layout, seed):
    rng = np.random.default_rng(seed)
    i = site_inputs(rng, T, D, m=m)
    X = i["X"] if layout == "c" else np.ascontiguousarray(i["X"].transpose(1, 0, 2))
    view = {"X": (lambda t: t) if layout == "c" else (lambda t: t.permute(1, 0, 2))}
    unit = 4 if D % 4 == 0 else 1                      # (a permuted X's strides D and T·D: multiples of 4 too)
    lay = hc_plan.mix_layout(ex.device, T, D // unit)
    (mix, part), g = run(ex, {"X": X, "fn": i["fn"]}, lambda g, t: (
        hc.mixes(g, t["X"], t["fn"]), mix_kernels.mix_partials(g, t["X"], t["fn"], lay)), view)
    single = lay["groups"] == 1 and not lay["split"]
    parts = ["HC_MIX_FN_SPLIT", "HC_MIX_TCR"] if lay.get("tcr") else ["HC_MIX_PART"]
    want = ["HC_MIX"] if single else parts + ["HC_MIX_REDUCE"]          # (then the partials asked for on their own)
    assert [n.op.name for n in g.nodes][:len(want)] == want
    groups = lay["groups"]
    ref = ops_hc.reference_mixes(i["X"], i["fn"])
    x = i["X"].reshape(T, -1).astype(np.float64)
    r = 1 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)
    bound = 64 * U * (np.abs(x) @ np.abs(i["fn"].T)) * r + 8 * U * np.abs(ref)   # dot over 4·D, then the norm
    assert (np.abs(mix - ref) <= bound).all(), np.abs(mix - ref).max()
    pref = mix_kernels.reference_mix_partials(i["X"], i["fn"], groups, unit, lay["split"])
    pmag = mix_kernels.reference_mix_partials(np.abs(i["X"]), np.abs(i["fn"]), groups, unit, lay["split"])
    assert (np.abs(part - pref) <= 64 * U * pmag + 1e-30).all(), np.abs(part - pref).max()


def test_site_kernels_fold_past_65535_workgroups(tune, ex, rng, monkeypatch):
    """One token per workgroup (no D split; KSPLIT: blocks of one token) and one HC_SITE workgroup per token: grids
    folded into y. (Workgroups of one subgroup: lavapipe runs barriers slowly.)"""
    sg = ex.device.subgroup_size
    tune({"slice.wg": sg})
    T, D = 65537, 4
    i = site_inputs(rng, T, D)
    # the per-token kernel (one token per workgroup), then KSPLIT (one token per block)
    for knobs in ({"kernel": "token", "groups": 1, "wg": sg, "split": 0}, {"kernel": "ksplit", "split": 16, "tb": 1, "wg": sg}):
        with tuning(mix_kernels.MIX_TUNING, **knobs):
            check_site_folded(ex, rng, i, T)


@pytest.mark.parametrize("D, T", [(1024, 1), (37, 3), (4096, 2)])
def test_site_workgroup_size(ex, rng, D, T):
    """HC_SITE at the decode workgroup size SITE_TUNING['site_wg'] (4 to 256, a multiple of 4): its
    launch has that workgroup, and u, post and comb match float64 at every size; a size outside that
    is refused by name."""
    i = site_inputs(rng, T, D)
    pre_r, post_r, comb_r = ops_hc.reference_site_coefs(**i)
    for wg in (4, 8, 64, 256):
        with tuning(hc.composite.SITE_TUNING, site_wg=wg):
            (u, post_w, comb_w), g = run(ex, i, lambda g, t: hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"],
                                                                           site=True))
        node = [n for n in g.nodes if n.op.name == "HC_SITE"][0]
        assert node.op.lower(node, ex.device)[0].spec[0] == wg
        assert nmse(u, reference_pre(i["X"], pre_r)) <= SITE_NMSE, wg
        assert max_abs(post_w, post_r) <= SITE_MAX_ABS and max_abs(comb_w, comb_r) <= SITE_MAX_ABS, wg
    for wg in (0, 6, 260):
        with tuning(hc.composite.SITE_TUNING, site_wg=wg), pytest.raises(ValueError, match="wg"):
            g = Graph()
            t = {k: g.input(k, v.shape) for k, v in i.items()}
            hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], site=True)


def check_site_folded(ex, rng, i, T):
    (u, post_w, comb_w), g = run(ex, i, lambda g, t: hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], site=True))
    assert [n.op.name for n in g.nodes] == ["HC_MIX_PART", "HC_SITE"]
    idx = np.unique(np.concatenate([np.arange(64), np.arange(T - 64, T), rng.integers(0, T, 2000)]))
    sub = {k: (v[idx] if k == "X" else v) for k, v in i.items()}
    pre_r, post_r, comb_r = ops_hc.reference_site_coefs(**sub)
    assert nmse(u[idx], reference_pre(sub["X"], pre_r)) <= SITE_NMSE
    assert max_abs(post_w[idx], post_r) <= SITE_MAX_ABS and max_abs(comb_w[idx], comb_r) <= SITE_MAX_ABS


@pytest.mark.parametrize("D, T", [(1, 1), (7, 3), (1024, 8), (64, 9)])
def test_head_pre_all_paths(ex, rng, D, T):
    i = site_inputs(rng, T, D, m=4)
    w = ops_hc.reference_head_weights(i["X"], i["fn"], i["scale"], i["base"])
    ref, scale = reference_pre(i["X"], w), ops_hc.magnitude(reference_pre, i["X"], w)
    res = {}
    for fused, site in SITE_PATHS:
        (u,), g = run(ex, i, lambda g, t: hc.head_pre(g, t["X"], t["fn"], t["scale"], t["base"], fused=fused, site=site))
        res["+".join(p[1] for p in g.paths)] = u
    assert len(res) == 3, res.keys()
    check_paths(res, ref, f"head D={D} T={T}", SITE_MAX_ABS, SITE_NMSE, scale)


@pytest.mark.parametrize("T", [1, 17, 300])
def test_coefs_kernel(ex, rng, T):
    """HC_COEFS alone, every variant: gates and comb in the mixes' layout."""
    inputs = comb_inputs(rng, T)
    ref = ops_hc.reference_coefs(**inputs)
    for variant in hc.variants(ex.device)["HC_COMB"]:
        (c,), _ = run(ex, inputs, lambda g, t: g.op("HC_COEFS", t["mixes"], t["scale"], t["base"], eps=1e-6,
                                                    n_iter=20, variant=variant))
        assert nmse(c, ref) <= REF_NMSE and max_abs(c, ref) <= REF_MAX_ABS, variant


@pytest.mark.parametrize("T, D, eps", [(1, 4096, 1e-6), (17, 33, 1e-3), (300, 260, 1e-6), (5, 7168, 1e-3)])
def test_pre_gate_kernel(ex, rng, T, D, eps):
    """HC_PRE_GATE alone: the collapse with gates formed from the mixes — the pre mixes a strided view of
    a [T,24] mixes tensor, scale and base views at an offset and a stride into wider tensors — against
    float64 (the gates, then the sum in the unfused chain's order) and against HC_PRE with HC_COEFS's
    pre gates; hc_eps at 1e-6 and 1e-3; bad shapes refused by name."""
    X = rng.standard_normal((T, 4, D)).astype(np.float32)
    mixes = rng.uniform(-3, 3, (T, 24)).astype(np.float32)
    scale_w = rng.uniform(0.5, 1.5, 9).astype(np.float32)          # scale = scale_w[4:7]
    base_w = rng.uniform(-0.5, 0.5, 60).astype(np.float32)         # base = base_w[5:53:2]
    scale, base = scale_w[4:7], base_w[5:53:2]
    feed = {"X": X, "mixes": mixes, "scale_w": scale_w, "base_w": base_w}

    def build(g, t):
        s, b = t["scale_w"][4:7], t["base_w"][5:53:2]
        u = g.op("HC_PRE_GATE", t["X"], t["mixes"][:, 0:4], s[0:1], b[0:4], eps=eps)
        coefs = g.op("HC_COEFS", t["mixes"], s, b, eps=eps, n_iter=20, variant="rows4")
        return u, g.op("HC_PRE", t["X"], coefs[:, 0:4])
    (u, u_coefs), _ = run(ex, feed, build)
    pre = 1.0 / (1.0 + np.exp(-(mixes[:, :4].astype(np.float64) * scale[0] + base[:4]))) + eps
    ref = reference_pre(X, pre)
    assert (np.abs(u - ref) <= pre_bound(X, pre)).all(), np.abs(u - ref).max()
    assert nmse(u, ref) <= 1e-12 and nmse(u, u_coefs) <= 1e-12
    g = Graph()
    with pytest.raises(ValueError, match="base"):
        g.op("HC_PRE_GATE", g.input("X", (T, 4, D)), g.input("m", (T, 4)), g.input("s", (1,)), g.input("b", (24,)))


@pytest.mark.parametrize("T, D, m, layout", [
    (1, 4096, 24, {"wg": 64}), (3, 5, 4, {"wg": 16}), (8, 36, 24, {"wg": 32}), (2, 7168, 4, {"wg": 256}),
    (2, 64, 24, {"wg": 4, "partial_subgroup": True}),
    (9, 64, 24, {"split": 16, "lpt": 4, "tb": 64, "tpl": 2}), (70, 5, 4, {"split": 16, "lpt": 1, "tb": 5, "tpl": 1}),
    (130, 260, 24, {"split": 16, "lpt": 2, "tb": 64, "tpl": 2}), (65, 4096, 24, {"split": 16, "lpt": 4, "tb": 256, "tpl": 2}),
    (130, 257, 24, {"split": 16, "lpt": 2, "tb": 64, "tpl": 2}), (70, 640, 16, {"split": 16, "lpt": 4, "tb": 64, "tpl": 1})])
def test_post_mix_partials(ex, rng, T, D, m, layout):
    """HC_POST_MIX alone: the new streams (as HC_POST) and the next fn's partial sums against float64,
    per D slice of wg/4 chunks (hc_post.comp -D MIX_NEXT) or, with split, per split of 16 chunks in
    KSPLIT's layout (hc_mix_ksplit.comp -D POST: partial token blocks, scalar chunks at odd D, a last
    split shorter than 16 chunks); a residual fed as a permuted [4,T,D] input (strided)."""
    split = layout.get("split", 0)
    partial = layout.get("partial_subgroup", False)   # wg 4: one chunk per destination stream, a workgroup
    layout = {k: v for k, v in layout.items() if k != "partial_subgroup"}   # smaller than the subgroup
    if not partial:
        layout["wg"] = max(layout.get("wg", 64), ex.device.subgroup_size)
    if split:
        layout["lpt"] = min(layout["lpt"], ex.device.subgroup_size)
    i = post_inputs(rng, T, D)
    fn = (rng.uniform(-1, 1, (m, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32)
    feed = {**i, "residual": np.ascontiguousarray(i["residual"].transpose(1, 0, 2)), "fn": fn}

    def build(g, t):
        out = g.empty((T, 4, D))
        part = g.op("HC_POST_MIX", t["f"], t["residual"], t["post"], t["comb"], t["fn"], out, **layout)
        return out, part
    (x_new, part), g = run(ex, feed, build, views={"residual": lambda t: t.permute(1, 0, 2)})
    ref = reference_post(**i)
    assert (np.abs(x_new - ref) <= post_bound(**i)).all()
    unit = 4 if D % 4 == 0 else 1           # (the permuted residual's strides are multiples of 4 where D is)
    per = split or layout["wg"] // 4       # -D MIX_NEXT: one destination stream per invocation
    groups = -(-(D // unit) // per)
    assert part.shape == (T, groups, m + 1)
    pref = mix_kernels.reference_mix_partials(ref, fn, groups, unit, per)
    pmag = mix_kernels.reference_mix_partials(np.abs(ref), np.abs(fn), groups, unit, per)
    assert (np.abs(part - pref) <= 64 * U * pmag + 1e-6 * np.abs(pmag)).all(), np.abs(part - pref).max()


def test_mixes_with_other_row_counts_go_unfused(ex, rng):
    """The mixes kernels take a multiple of 4 rows, at most 24; any other fn runs RMS_NORM → MUL_MAT."""
    i = site_inputs(rng, 3, 8, m=4)
    fn = (rng.uniform(-1, 1, (5, 32)) / 4).astype(np.float32)
    (mix,), g = run(ex, {"X": i["X"], "fn": fn}, lambda g, t: hc.mixes(g, t["X"], t["fn"]))
    assert [n.op.name for n in g.nodes] == ["RMS_NORM", "MUL_MAT"]
    assert nmse(mix, ops_hc.reference_mixes(i["X"], fn)) <= 1e-12
    with pytest.raises(ValueError, match="multiple of 4 rows"):
        g2 = Graph()
        g2.op("HC_MIX", g2.input("X", (3, 4, 8)), g2.input("fn", (5, 32)), wg=64)
