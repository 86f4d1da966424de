"""MUL_MAT_ID's grouped GEMM on cooperative matrices (ops/moe_coopmat.py, shaders/mul_mat_id_coopmat.comp).

"coopmat_fma" is the kernel's data flow on any device (the same route lists, power-of-two row scales, fp16
staging and epilogue, FMA products in place of the cooperative matrices): here it runs at lavapipe's subgroup
sizes 4, 8 and 16 over every weight format, both modes, skewed routings (an expert on every token, experts
on none, an invalid id), T not a multiple of the tile. Each result is checked against float64 (NMSE ≤ 1e-5,
the coopmat MUL_MAT tests' bound; NaNs where the reference has them), against the float64 product of the
rows as the kernel rounds them to fp16 (to f32 summation error: so the scales and the rounding are the
header's), and against the f32 grouped kernel (NMSE ≤ 1e-5); on the H200 too (knob
mul_mat_id_coopmat.emulate: the FMA twin on any device). "coopmat" runs where the device has the matrix
units (the H200, with mul_mat_id_coopmat.auto on: off by default until measured there) and falls back
to its FMA twin here. mul_mat_id_coopmat.x_half (x rounded to fp16 once, by a pass before the GEMM) is checked
bit for bit against the kernel without it.

Run as a script, the file is the subprocess worker for other lavapipe subgroup sizes.
"""
import dataclasses
import os
import sys

import numpy as np
import pytest

from lavapipe_child import worker_output
from dsv4_vk.core.executor import Executor
from dsv4_vk.core.tuning import tuned
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.ops import get_op, moe_coopmat
from dsv4_vk.ops.base import coopmat_unavailable
from dsv4_vk.ops.reduce_rows import reference_rms_norm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_moe_grouped import build, run, skewed_route, weights  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("bf16", "f16", "fp8", "fp4", "fp4+fp8")
NMSE_MAX = 1e-5                 # against float64 and the f32 grouped kernel (the coopmat MUL_MAT tests' bound)
NMSE_FP16 = {"coopmat_fma": 1e-10, "coopmat": 1e-7}     # against the fp16-rounded rows (f32 sums in another order)
EMULATE = {"mul_mat_id_coopmat.emulate": True, "mul_mat_id_coopmat.auto": True}
SMALL = {"mul_mat_id_coopmat.tokens": 16, "mul_mat_id_coopmat.outputs": 16, "mul_mat_id_coopmat.warp_tokens": 16,
         "mul_mat_id_coopmat.warp_outputs": 16, "mul_mat_id_coopmat.k_step": 32}
BIG = {"mul_mat_id_coopmat.tokens": 64, "mul_mat_id_coopmat.outputs": 64, "mul_mat_id_coopmat.warp_tokens": 32,
       "mul_mat_id_coopmat.warp_outputs": 32}     # (the f32 tile [64][128] past lavapipe's 32 KiB: 2 epilogue passes)
WIDE = {"mul_mat_id_coopmat.tokens": 32, "mul_mat_id_coopmat.outputs": 32, "mul_mat_id_coopmat.warp_tokens": 16,
        "mul_mat_id_coopmat.warp_outputs": 32, "mul_mat_id_coopmat.k_step": 16}


def fp16_rows(x, gn=None):
    """x's rows (x·gn, as f32) as the kernel stages them: times 2^shift of the row's largest finite |value|,
    rounded to fp16, the shift undone (float64)."""
    xs = np.asarray(x, np.float32) * (np.asarray(gn, np.float32) if gn is not None else np.float32(1))
    a = np.abs(xs)
    m = np.where(np.isfinite(a), a, 0).max(axis=-1).astype(np.float32)
    s = np.minimum(15 - ((m.view(np.uint32) >> 23).astype(np.int64) - 126), 126)
    with np.errstate(over="ignore"):
        h = (xs.astype(np.float64) * np.exp2(s)[..., None]).astype(np.float32).astype(np.float16)
    return h.astype(np.float64) * np.exp2(-s)[..., None]


def per_token(op, ts, x, wref, route, extra=(), **kw):
    """op.reference token by token over tokens ts (the experts' float64 weights gathered per route only for
    those tokens: the model's widths would not fit at once)."""
    return np.concatenate([op.reference(x[t:t + 1], wref, route[t:t + 1], *[e[t:t + 1] for e in extra], **kw)
                           for t in ts])


def check_case(rng, fmt, mode, T, device, kernel="coopmat_fma", per_route_x=False, norm=False, add=False, D=72,
               F=24, E=6, top_k=3, x_scale=1.0, sample=None, x_half=False):
    """The grouped MUL_MAT_ID with its GEMM on `kernel` against float64, the fp16-rounded rows' float64 product
    (every token, or `sample` of them spread over T) and the f32 grouped kernel (every output); with x_half,
    also with mul_mat_id_coopmat.x_half on (its X_ROWS pass launched), the same bit for bit."""
    op = get_op("MUL_MAT_ID")
    route = skewed_route(rng, T, E, top_k)
    R = top_k + 1
    ts = list(range(T)) if sample is None else sorted({int(t) for t in np.linspace(0, T - 1, sample)} | {3})
    if mode == "swiglu":
        w_in, extra, prm, wref = weights(rng, fmt, E, 2 * F, D, F if fmt in ("fp8", "fp4+fp8") else None)
        x = rng.standard_normal((T, R if per_route_x else 1, D)).astype(np.float32) * x_scale
        gn = rng.standard_normal(D).astype(np.float32) if norm else None
        xn = reference_rms_norm(x, gn, 1e-6) if norm else x.astype(np.float64)
        ref = per_token(op, ts, xn, wref, route, mode="swiglu", limit=4.0)
        xh = fp16_rows(x, gn)
        if norm:
            xh = xh / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6)
        ref16 = per_token(op, ts, xh, wref, route, mode="swiglu", limit=4.0)
        kw = dict(norm=gn, limit=4.0)
        feeds = {"x": x, "r": route}
    else:
        w_in, extra, prm, wref = weights(rng, fmt, E, D, F)
        x = rng.standard_normal((T, R, F)).astype(np.float32) * x_scale
        a = rng.standard_normal((T, D)).astype(np.float32) if add else None
        ref = per_token(op, ts, x, wref, route, [a] if add else [], mode="sum")
        ref16 = per_token(op, ts, fp16_rows(x), wref, route, [a] if add else [], mode="sum")
        kw = dict(add=(T, D) if add else False)
        feeds = {"x": x, "r": route, **({"a": a} if add else {})}
    got = {}
    for knobs in ({"mul_mat_id_coopmat.emulate": kernel == "coopmat_fma", "mul_mat_id_coopmat.auto": True},
                  {"mul_mat_id_coopmat.auto": False}):
        with tuned({**knobs, "mul_mat_id_grouped.swiglu_min_routes": 0}):      # grouped on GPUs too
            g, node = build(mode, T, top_k, x.shape, w_in, extra, prm, **kw)
            launches = node.op.lower(node, device)
            shaders = [ln.shader for ln in launches]
            on = knobs["mul_mat_id_coopmat.auto"]
            assert ("mul_mat_id_coopmat" in shaders) == on and ("mul_mat_id_grouped" in shaders) != on, shaders
            if on:
                (cm,) = [ln for ln in launches if ln.shader == "mul_mat_id_coopmat"]
                assert ("CM_NV" in cm.defines) == (kernel == "coopmat")
            got[on] = run(g, **feeds)
            if on and x_half:
                got["x_half"] = run_x_half(g_args=(mode, T, top_k, x.shape, w_in, extra, prm), kw=kw, feeds=feeds,
                                           device=device)
                assert same_bits(got["x_half"], got[True]), (fmt, mode, T, per_route_x, norm, add)
    y = got[True][ts]
    what = (fmt, mode, T, per_route_x, norm, add)
    assert np.array_equal(np.isnan(y), np.isnan(ref)), what
    if T > 3:
        assert np.isnan(got[True][3, 1] if mode == "swiglu" else got[True][3]).all(), what
    assert nmse(y, ref) <= NMSE_MAX, (what, nmse(y, ref))
    assert nmse(y, ref16) <= NMSE_FP16[kernel], (what, nmse(y, ref16))
    ok = ~np.isnan(ref)
    # output by output: to f32 summation error against the fp16-rounded rows' product (the kernel's arithmetic),
    # and within the rounding of x to fp16 against the exact one (2^-11 a value: a bound, not a statistic)
    assert max_abs(y[ok], ref16[ok]) <= 1e-4 * max(1.0, np.abs(ref16[ok]).max()), what
    assert max_abs(y[ok], ref[ok]) <= 1e-2 * max(1.0, np.abs(ref[ok]).max()), what
    assert nmse(got[True], got[False]) <= NMSE_MAX, what
    return got[True]


def same_bits(a, b) -> bool:
    """a and b hold the same f32 values bit for bit (NaNs too)."""
    return a.shape == b.shape and np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def run_x_half(g_args, kw, feeds, device):
    """The graph build(*g_args, **kw) run with mul_mat_id_coopmat.x_half on (under the knobs in effect): its
    lowering checked to launch the X_ROWS pass before the GEMM, which takes X_HALF and binds the pass's
    records."""
    with tuned({"mul_mat_id_coopmat.x_half": True}):
        g, node = build(*g_args, **kw)
        launches = node.op.lower(node, device)
    names = [(ln.shader, "X_ROWS" in ln.defines, ln.defines.get("X_HALF")) for ln in launches]
    at = names.index(("mul_mat_id_coopmat", True, None))
    assert names[at + 1] == ("mul_mat_id_coopmat", False, 1), names
    assert launches[at + 1].args[-1] is launches[at].args[-1], "the GEMM reads the pass's records"
    return run(g, **feeds)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["swiglu", "sum"])
def test_coopmat_fma_grouped_matches_float64_and_the_f32_kernel(fmt, mode, rng, device):
    """T = 19 (not a multiple of the tile's 16 route slots), K = 72 (a partial k step) and N = 24 / 72 partial
    output tiles; the SwiGLU with its folded norm (x of magnitude 30: past its clamp) and the sum with add,
    then without the norm / add at T = 9."""
    with tuned(EMULATE):
        check_case(rng, fmt, mode, 19, device, norm=mode == "swiglu", add=mode == "sum", x_scale=30.0, x_half=True)
        check_case(rng, fmt, mode, 9, device, D=56, F=40, x_half=True)


def test_coopmat_fma_grouped_wider_tiles_and_per_route_x(rng, device):
    """Tiles of 32 route slots × 32 outputs (2 warps along the slots, a k step of 16) and the default ones, x
    per route in the SwiGLU, more tiles than experts (T = 70: the expert on every token spans 3 tiles); 64 × 64
    tiles whose f32 epilogue tile takes two passes where the shared memory holds only half of it; workgroups
    taking 3 output tiles in turn (the last one 2)."""
    with tuned(EMULATE):
        check_case(rng, "bf16", "swiglu", 12, device, per_route_x=True, norm=True, x_half=True)
        with tuned(WIDE):
            for fmt in ("bf16", "fp4+fp8"):
                check_case(rng, fmt, "swiglu", 70, device, norm=True, D=136, F=72, x_half=fmt == "bf16")
                check_case(rng, fmt, "sum", 70, device, add=True, D=136, F=72, sample=5)   # (as on the H200)
        with tuned({**SMALL, "mul_mat_id_coopmat.output_tiles": 3}):   # 5 output tiles: 2 workgroups, 3 + 2
            check_case(rng, "fp4+fp8", "swiglu", 40, device, norm=True, D=136, F=72, x_half=True)
            check_case(rng, "bf16", "sum", 40, device, add=True, D=72, F=136)
        with tuned(BIG):
            assert moe_coopmat.tiling(device)[5] == (64 if device.caps.limits.max_shared_memory >= 37 * 1024 else 32)
            check_case(rng, "bf16", "swiglu", 150, device, norm=True, D=136, F=72, sample=9)
            check_case(rng, "fp4", "sum", 150, device, D=136, F=72, sample=9)


def test_coopmat_fma_grouped_range_past_fp16(rng, device):
    """x rows of magnitude 1e20 and 1e-20 (past fp16 both ways) beside ordinary ones, bf16 experts of
    magnitude 1e15 and 1e-12: each output matches float64 relative to the sum of its |terms| (the scales are
    per row), where fp16 without them would hold inf or 0."""
    op = get_op("MUL_MAT_ID")
    T, E, top_k, K, N = 18, 5, 2, 48, 24
    route = skewed_route(rng, T, E, top_k)
    route[3, 1, 0] = 1                                  # (no invalid id here)
    x = rng.standard_normal((T, top_k + 1, K)).astype(np.float32)
    x[0] *= 1e20
    x[1] *= 1e-20
    x[5, 2, 7] = 3e9
    from dsv4_vk.model.checkpoint import BF16
    w = rng.standard_normal((E + 1, N, K))
    w[1] *= 1e15
    w[2, :5] *= 1e-12
    w = w.astype(BF16)
    with tuned(EMULATE):
        g, _ = build("sum", T, top_k, x.shape, [w], [], {})
        got = run(g, x=x, r=route)
    ref = op.reference(x, w.astype(np.float64), route, mode="sum")
    terms = op.reference(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), np.abs(route), mode="sum")
    assert np.isfinite(got).all() and (got != 0).all()
    rel = np.abs(got - ref) / terms
    assert rel.max() <= 2e-3, f"worst relative error {rel.max():.2e}"


def test_coopmat_fma_x_half_rows_past_fp16_inf_nan(rng, device):
    """mul_mat_id_coopmat.x_half bit for bit as without it where x rows hold 1e20 / 1e-20 / 3e9 outliers, inf and
    NaN (the SwiGLU with x shared by the routes and its folded norm, rows 1e15 / 1e-15 there so that Σx² stays
    an f32; with x per route; the sum), over bf16 experts of magnitude 1e15 and 1e-12 (their products formed
    again with row shifts) and FP4 ones with the FP8 shared expert; the sum against float64 relative to each
    output's |terms|, the SwiGLU against the f32 grouped kernel (and float64 with the norm), NaN / inf where
    they have them."""
    from dsv4_vk.model.checkpoint import BF16
    op = get_op("MUL_MAT_ID")
    T, E, top_k, K, N = 18, 5, 2, 48, 24
    route = skewed_route(rng, T, E, top_k)
    route[3, 1, 0] = 1                                  # (no invalid id here)
    w = rng.standard_normal((E + 1, 2 * N, K))
    w[1] *= 1e15
    w[2, :5] *= 1e-12
    w = w.astype(BF16)
    w4, extra4, prm4, wref4 = weights(rng, "fp4+fp8", E, 2 * N, K)
    for mode, per_route, big in (("swiglu", False, 1e15), ("swiglu", True, 1e20), ("sum", True, 1e20)):
        x = rng.standard_normal((T, top_k + 1 if per_route else 1, K)).astype(np.float32)
        x[0] *= big
        x[1] /= big
        x[5, -1, 7] = 3e9
        x[6, 0, 3], x[7, -1, 0], x[8, 0, 47] = np.inf, np.nan, -np.inf
        gn = rng.uniform(0.5, 2.0, K).astype(np.float32) if mode == "swiglu" and not per_route else None
        kw = dict(norm=gn, limit=4.0) if mode == "swiglu" else {}
        for w_in, extra, prm, wref in (([w], [], {}, w.astype(np.float64)), (w4, extra4, prm4, wref4)):
            with tuned(EMULATE):
                g, _ = build(mode, T, top_k, x.shape, w_in, extra, prm, **kw)
                off = run(g, x=x, r=route)
                on = run_x_half((mode, T, top_k, x.shape, w_in, extra, prm), kw, {"x": x, "r": route}, device)
            what = (mode, per_route, prm)
            assert same_bits(on, off), what
            if mode == "sum":
                with np.errstate(invalid="ignore", over="ignore"):
                    ref = op.reference(x, wref, route, mode="sum")
                    terms = op.reference(np.abs(x.astype(np.float64)), np.abs(wref), np.abs(route), mode="sum")
                assert np.array_equal(np.isnan(on), np.isnan(ref)) and np.array_equal(np.isinf(on), np.isinf(ref)), what
                fin = np.isfinite(ref)
                assert (np.abs(on[fin] - ref[fin]) / terms[fin]).max() <= 2e-3, what
            else:
                with tuned({"mul_mat_id_coopmat.auto": False}):
                    f32 = run(build(mode, T, top_k, x.shape, w_in, extra, prm, **kw)[0], x=x, r=route)
                assert np.array_equal(np.isnan(on), np.isnan(f32)) and np.array_equal(np.isinf(on), np.isinf(f32)), what
                ok = np.isfinite(f32)
                assert nmse(on[ok], f32[ok]) <= NMSE_MAX, what
                if gn is not None:                      # tokens without inf / NaN against float64
                    fin = np.isfinite(x).all(axis=(1, 2))
                    with np.errstate(over="ignore"):    # (silu of a gate far below 0: exp overflows, the value is 0)
                        ref = op.reference(reference_rms_norm(x[fin], gn, 1e-6), wref, route[fin], mode="swiglu",
                                           limit=4.0)
                    assert np.isfinite(on[fin]).all() and nmse(on[fin], ref) <= NMSE_MAX, what


def test_coopmat_fma_x_half_stages_from_the_records(rng, device, monkeypatch):
    """With mul_mat_id_coopmat.x_half the GEMM takes x's values, shifts and 1/rms from the X_ROWS pass's records:
    given NaN for x itself it still gives the right outputs (the pass read the real x); without the knob the
    same swap gives wrong ones. The records hold numpy's rounding of x·gn · 2^shift and the shift, row by row."""
    from dsv4_vk.ops import moe
    T, top_k, E, D, F = 21, 3, 6, 72, 24
    route = skewed_route(rng, T, E, top_k)
    w_in, extra, prm, wref = weights(rng, "bf16", E, 2 * F, D)
    x = rng.standard_normal((T, 1, D)).astype(np.float32) * 3
    gn = rng.standard_normal(D).astype(np.float32)
    ref = get_op("MUL_MAT_ID").reference(reference_rms_norm(x, gn, 1e-6), wref, route, mode="swiglu", limit=4.0)
    lower = moe.MulMatId.lower
    nan_x = {}

    def lower_with_nan_x(self, node, device):
        launches = lower(self, node, device)
        return [dataclasses.replace(ln, args=[nan_x["t"], *ln.args[1:]]) if ln.shader == "mul_mat_id_coopmat"
                and "X_ROWS" not in ln.defines else ln for ln in launches]
    monkeypatch.setattr(moe.MulMatId, "lower", lower_with_nan_x)
    for on in (True, False):
        with tuned({**EMULATE, "mul_mat_id_coopmat.x_half": on}):
            g, _ = build("swiglu", T, top_k, x.shape, w_in, extra, prm, norm=gn, limit=4.0)
            nan_x["t"] = g.const(np.full(x.shape, np.nan, np.float32))
            if on:
                g.output("rec", g.scratch(moe_coopmat.X_HALF_POOL))
            out = Executor().run(g, x=x, r=route)
        ok = ~np.isnan(ref)
        if not on:                                      # (NaN sums pass the SwiGLU's min / clamp as their bounds)
            assert not np.isfinite(nmse(out["y"][ok], ref[ok])) or nmse(out["y"][ok], ref[ok]) > 0.1
            continue
        assert np.array_equal(np.isnan(out["y"]), np.isnan(ref)) and nmse(out["y"][ok], ref[ok]) <= NMSE_MAX
        rec = out["rec"].view(np.uint32).reshape(T, D // 8 + 1, 4)
        xs = x[:, 0] * gn
        m = np.where(np.isfinite(xs), np.abs(xs), 0).max(axis=-1).astype(np.float32)
        shift = np.minimum(15 - ((m.view(np.uint32) >> 23).astype(np.int64) - 126), 126)
        halves = (xs * np.exp2(shift).astype(np.float32)[:, None]).astype(np.float16)
        assert np.array_equal(rec[:, :-1].reshape(T, -1).copy().view(np.uint16), halves.view(np.uint16))
        assert np.array_equal(rec[:, -1, 0].view(np.int32), shift)
        rms = np.sqrt(np.mean(x[:, 0].astype(np.float64) ** 2, axis=-1) + 1e-6)
        np.testing.assert_allclose(rec[:, -1, 1].view(np.float32), 1 / rms, rtol=1e-6)


def test_x_half_knob_cache_key_and_where_it_does_not_apply(device, monkeypatch):
    """mul_mat_id_coopmat.x_half must be a bool (refused naming it); it is part of the graph's signature (the
    program's cache key); where the cooperative-matrix GEMM does not run (K % 8 != 0, f32 experts, auto off)
    no scratch is asked for or no pass launched, and the reasons (expert_gemm's, `info`'s) say whether the
    halves are used and why not."""
    from dsv4_vk.cli.info import _human, report
    w = [np.zeros((4, 32, 64), np.float16)]
    for bad in (1, "on", None):
        with tuned({**EMULATE, "mul_mat_id_coopmat.x_half": bad}), \
                pytest.raises(ValueError, match=f"'mul_mat_id_coopmat.x_half' must be True or False, got {bad!r}"):
            build("swiglu", 40, 2, (40, 1, 64), w, [], {})
    sigs = []
    for on in (False, True):
        with tuned({**EMULATE, "mul_mat_id_coopmat.x_half": on}):
            g, node = build("swiglu", 40, 2, (40, 1, 64), w, [], {})
            sigs.append(g.signature())
            shaders = [(ln.shader, "X_ROWS" in ln.defines) for ln in node.op.lower(node, device)]
            assert (("mul_mat_id_coopmat", True) in shaders) == on, shaders
            c = moe_coopmat.node_gemm(node, device)
            assert c.kernel == "coopmat_fma" and (moe_coopmat.X_HALF_ON in c.reason) == on, c
            d = moe_coopmat.describe(device)
            assert d["x_half"] == on and d["x_half_reason"] == (moe_coopmat.X_HALF_ON if on else moe_coopmat.X_HALF_OFF)
            line = next(ln for ln in _human(report(device)).splitlines() if ln.startswith("MUL_MAT_ID    grouped GEMM"))
            assert (moe_coopmat.X_HALF_ON in line) == on, line
            if on:
                assert g.scratch(moe_coopmat.X_HALF_POOL).shape == (40 * (64 // 8 + 1) * 4,)   # per token: 40 rows
    assert sigs[0] != sigs[1]
    with tuned({**EMULATE, "mul_mat_id_coopmat.x_half": True}):
        for shape, wk in (((40, 3, 68), [np.zeros((4, 16, 68), np.float16)]),       # K % 8
                          ((40, 3, 64), [np.zeros((4, 16, 64), np.float32)])):      # f32 experts
            g, node = build("sum", 40, 2, shape, wk, [], {})
            with pytest.raises(ValueError, match="no op of this graph asked for scratch pool"):
                g.scratch(moe_coopmat.X_HALF_POOL)
            assert "mul_mat_id_grouped" in [ln.shader for ln in node.op.lower(node, device)]
        g, node = build("sum", 40, 2, (40, 3, 64), [np.zeros((4, 16, 64), np.float16)], [], {})
        assert g.scratch(moe_coopmat.X_HALF_POOL).shape == (120 * 9 * 4,)                   # per route: 120 rows
        with tuned({"mul_mat_id_coopmat.auto": False}):
            assert moe_coopmat.x_half_refusal("f32") == "it needs the cooperative-matrix GEMM (the f32 grouped " \
                                                         "kernel runs)"
            d = moe_coopmat.describe(device)
            assert d["x_half"] is False and d["reason"].endswith("; mul_mat_id_coopmat.x_half not used: it needs the "
                                                                 "cooperative-matrix GEMM (the f32 grouped kernel runs)")
        assert moe_coopmat.x_half_refusal("coopmat", "K = 68 is not a multiple of 8 (the kernel stages 8 inputs at a " \
                                          "time)").startswith("K = 68")
    with_matrix_units(device, monkeypatch)
    with tuned({"mul_mat_id_coopmat.x_half": True}):
        assert moe_coopmat.expert_gemm(device).reason.endswith("f32 sums); " + moe_coopmat.X_HALF_ON)


def test_bench_moe_cm_x_half_values(monkeypatch):
    """tools/bench_moe.py --cm-x-half takes 0, 1 or both (knob mul_mat_id_coopmat.x_half), refuses anything else."""
    import importlib
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tools"))
    bench = importlib.import_module("bench_moe")
    assert bench.cm_x_half("0,1") == [0, 1] and bench.cm_x_half("1") == [1]
    for bad in ("2", "", "yes"):
        with pytest.raises(SystemExit, match="--cm-x-half: expected 0, 1 or 0,1"):
            bench.cm_x_half(bad)


def test_coopmat_fma_grouped_fp4_scale_spread(rng, device):
    """FP4 expert rows whose group scales span more than 26 binades are summed in f32 from the dequantised
    weights (1e-5 of the exact product relative to its terms), beside rows that span 26 (staged exactly:
    the fp16-rounded x's product to f32 summation error)."""
    from dsv4_vk.model.synthetic import quantize
    from dsv4_vk.ops.quant import dequantize, quant_arrays
    op = get_op("MUL_MAT_ID")
    T, E, top_k, K, N = 17, 4, 2, 128, 20
    route = skewed_route(rng, T, E, top_k)
    route[3, 1, 0] = 1
    route[:, 1:, 1] = 0                                 # the outputs: expert 0's products alone
    q = quantize(rng.standard_normal((E + 1, N, K)).astype(np.float32), "fp4")
    scale = np.array(q.scale, np.uint8).reshape(E + 1, N, K // 32)
    scale[0, 0] = [127, 100, 127, 127]                  # 27 binades: f32
    scale[0, 1] = [150, 124, 150, 150]                  # 26: fp16
    scale[0, 2] = [1, 200, 100, 50]
    words, sw = quant_arrays(q.codes, scale)
    wref = dequantize("fp4", words, sw, K, E + 1).reshape(E + 1, N, K)
    x = rng.standard_normal((T, top_k + 1, K)).astype(np.float32)
    x[..., 32:64] *= 2.0 ** 26
    with tuned(EMULATE):
        g, _ = build("sum", T, top_k, x.shape, [words], [sw], {"wq": "fp4"})
        got = run(g, x=x, r=route)
    ref = op.reference(x, wref, route, mode="sum")
    terms = op.reference(np.abs(x.astype(np.float64)), np.abs(wref), np.abs(route), mode="sum")
    rel = np.abs(got - ref) / terms
    assert rel.max() <= 2e-3, f"worst relative error {rel.max():.2e}"
    assert rel[:, [0, 2]].max() <= 1e-5, rel[:, [0, 2]].max()      # rows 0 and 2 summed in f32
    rel16 = np.abs(got - op.reference(fp16_rows(x), wref, route, mode="sum")) / terms
    # the others: the fp16-rounded x's product to f32 summation's bound n·u (n the roundings: K fused
    # multiply-adds, the unscale's 3 multiplies, and per route its weight's multiply and add), not a fixed
    # 1e-6: the 2^26 group dominates each sum, so every later step rounds at the size of its terms
    n = K + 3 + 2 * (top_k + 1)
    assert np.delete(rel16, [0, 2], axis=1).max() <= n * 1.001 * 2.0 ** -24


def test_coopmat_grouped_on_the_matrix_units_or_their_fma_twin(rng, device):
    """The cooperative-matrix kernel itself where the device has the matrix units (mul_mat_id_coopmat.auto
    on; off, the default, keeps the f32 grouped kernel), at the cases above, 16-slot tiles, and the model's widths (D 4096, F 2048 over 9 experts, T 512,
    the default GPU tiles; 7 tokens checked against float64, every output against the f32 grouped kernel);
    where it has none (lavapipe) the FMA twin at the small cases, and the automatic choice keeps the f32
    grouped kernel."""
    units = coopmat_unavailable(device) is None
    kernel = "coopmat" if units else "coopmat_fma"
    with tuned({"mul_mat_id_coopmat.auto": True} if units else EMULATE):
        for fmt in FORMATS:
            check_case(rng, fmt, "swiglu", 37, device, kernel, norm=True, D=136, F=72, x_scale=30.0)
            check_case(rng, fmt, "sum", 37, device, kernel, add=True, D=136, F=72)
        if units:
            check_case(rng, "fp4+fp8", "swiglu", 16, device, kernel, norm=True, D=136, F=72)   # 16-slot tiles
            check_case(rng, "bf16", "sum", 16, device, kernel, add=True, D=136, F=72)
            for fmt in ("bf16", "fp4+fp8"):           # (7 tokens of each checked against float64; x_half bit for bit)
                wide = dict(D=4096, F=2048, E=8, top_k=6, sample=6, x_half=True)
                check_case(rng, fmt, "swiglu", 512, device, kernel, norm=True, **wide)
                check_case(rng, fmt, "sum", 512, device, kernel, add=True, **wide)
    g, node = build("sum", 40, 2, (40, 3, 64), [np.zeros((4, 16, 64), np.float32).astype(np.float16)], [], {})
    with tuned({"mul_mat_id_coopmat.auto": False}):
        shaders = [ln.shader for ln in node.op.lower(node, device)]
    assert "mul_mat_id_coopmat" not in shaders and "mul_mat_id_grouped" in shaders, shaders    # auto: off
    shaders = [ln.shader for ln in node.op.lower(node, device)]                               # on, the default
    assert ("mul_mat_id_coopmat" in shaders) == units, shaders


def with_matrix_units(device, monkeypatch):
    from dsv4_vk.vk.caps import CoopMatShape
    cm = (CoopMatShape(16, 16, 16, "f16", "f16", "f32", "f32"),)
    sgc = dataclasses.replace(device.caps.subgroup, min_size=32, max_size=32, size=32, full_subgroups=True)
    limits = dataclasses.replace(device.caps.limits, max_workgroup_invocations=1024, max_shared_memory=48 * 1024,
                                 max_workgroup_size=(1024,) + device.caps.limits.max_workgroup_size[1:])
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, coopmat=cm, subgroup=sgc, limits=limits,
                                                            type="discrete-gpu"))


def test_gemm_choice_refusals_and_knobs(device, monkeypatch, tune):
    """expert_gemm: the matrix units where the device has them (mul_mat's check), the f32 grouped kernel with
    its reason over f32 experts, K % 4 != 0, unaligned rows, mul_mat_id_coopmat.auto off,
    DSV4_VK_DISABLE_COOPMAT; the FMA twin only under emulate; the launch with CM_NV and full subgroups; tile
    knobs that cannot work refused naming the knob; `info` names the choice."""
    units = coopmat_unavailable(device) is None
    if not units:
        c = moe_coopmat.expert_gemm(device)
        assert c.kernel == "f32" and "no VK_NV_cooperative_matrix" in c.reason, c
        with tuned(EMULATE):
            assert moe_coopmat.expert_gemm(device).kernel == "coopmat_fma"
            assert moe_coopmat.expert_gemm(device, "f32").kernel == "f32"
    from dsv4_vk.cli.info import _human, report
    line = next(ln for ln in _human(report(device)).splitlines() if ln.startswith("MUL_MAT_ID    grouped GEMM"))
    assert (" coopmat — matrix units" in line) if units else (" f32 — f32 lanes, since" in line), line
    with_matrix_units(device, monkeypatch)
    assert moe_coopmat.expert_gemm(device) == moe_coopmat.ExpertGemm(         # auto: on by default
        "coopmat", "matrix units (fp16 products of rows scaled by powers of two, f32 sums)")
    with tuned({"mul_mat_id_coopmat.auto": False}):
        assert moe_coopmat.expert_gemm(device) == moe_coopmat.ExpertGemm("f32", "f32 lanes: mul_mat_id_coopmat.auto is off")
    assert moe_coopmat.expert_gemm(device, "i32", "fp4").kernel == "coopmat"
    with tuned(EMULATE):                                # the FMA twin on any device
        assert moe_coopmat.expert_gemm(device).kernel == "coopmat_fma"
    c = moe_coopmat.expert_gemm(device, "f32")
    assert c.kernel == "f32" and "f32 experts stay off the matrix units" in c.reason
    assert "K = 66 is not a multiple of 8" in moe_coopmat.expert_gemm(device, "bf16", None, 66).reason
    with tuned({"mul_mat_id_coopmat.auto": False}):
        assert moe_coopmat.expert_gemm(device).reason == "f32 lanes: mul_mat_id_coopmat.auto is off"
    assert moe_coopmat.tiling(device, 512 * 7, 258) == (16, 64, 16, 32, 32, 16, 1)
    assert moe_coopmat.tiling(device, 4096 * 7, 66) == (64, 64, 32, 32, 32, 64, 1)
    small = dataclasses.replace(device.caps.limits, max_shared_memory=32 * 1024)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=small))
    assert moe_coopmat.tiling(device, 4096 * 7, 66) == (64, 64, 32, 32, 32, 32, 1)     # 32 KiB: 2 epilogue passes
    small = dataclasses.replace(device.caps.limits, max_shared_memory=16 * 1024)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=small))
    assert moe_coopmat.tiling(device, 4096 * 7, 66) == (64, 32, 32, 32, 32, 32, 1)     # 16 KiB: 32 outputs a tile
    with tuned({"mul_mat_id_coopmat.outputs": 64}), pytest.raises(ValueError, match="B of shared memory"):
        moe_coopmat.tiling(device, 4096 * 7, 66)
    with_matrix_units(device, monkeypatch)
    tune({"mul_mat_id_coopmat.auto": True, "mul_mat_id_grouped.swiglu_min_routes": 0})   # (a GPU's SwiGLU here)
    # the lowering: CM_NV, full subgroups, the sort's tiles of BT slots
    g, node = build("swiglu", 40, 2, (40, 1, 64), [np.zeros((4, 32, 64), np.float16)], [], {})
    sort, gemm = node.op.lower(node, device)
    assert gemm.shader == "mul_mat_id_coopmat" and gemm.defines == {"MODE_SWIGLU": 1, "W_F16": 1, "CM_NV": 1}
    assert gemm.full_subgroups and gemm.spec == (4 * 32, 32, 64, 32, 32, 32, 32, 1), gemm.spec      # 120 routes / 4
    assert gemm.grid == (1, 120 // 32 + 5, 1) and sort.shader == "mul_mat_id_sort"
    g2, node2 = build("sum", 40, 2, (40, 3, 66), [np.zeros((4, 16, 66), np.float16)], [], {})
    assert "mul_mat_id_grouped" in [ln.shader for ln in node2.op.lower(node2, device)]   # K % 4: the f32 kernel
    assert "K = 66" in moe_coopmat.node_gemm(node2, device).reason
    g3, node3 = build("sum", 40, 2, (40, 3, 64), [np.zeros((4, 16, 64), np.float32)], [], {})
    assert "mul_mat_id_grouped" in [ln.shader for ln in node3.op.lower(node3, device)]   # f32 experts
    monkeypatch.setattr(device, "coopmat_disabled", True, raising=False)
    c = moe_coopmat.expert_gemm(device)
    assert c.kernel == "f32" and "DSV4_VK_DISABLE_COOPMAT=1" in c.reason
    monkeypatch.setattr(device, "coopmat_disabled", False, raising=False)
    for knobs, msg in (({"mul_mat_id_coopmat.tokens": 24}, "'mul_mat_id_coopmat.tokens' must be a positive multiple"),
                       ({"mul_mat_id_coopmat.tokens": 32, "mul_mat_id_coopmat.warp_tokens": 64}, "must divide tokens"),
                       ({"mul_mat_id_coopmat.k_step": 48, "mul_mat_id_coopmat.tokens": 16,
                         "mul_mat_id_coopmat.outputs": 16, "mul_mat_id_coopmat.warp_outputs": 16},
                        "'mul_mat_id_coopmat.k_step' = 48"),
                       ({"mul_mat_id_coopmat.output_tiles": 0}, "'mul_mat_id_coopmat.output_tiles' must be an integer"),
                       ({"mul_mat_id_coopmat.tokens": 256, "mul_mat_id_coopmat.outputs": 128},
                        "B of shared memory")):
        with tuned(knobs), pytest.raises(ValueError, match=msg):
            moe_coopmat.tiling(device, 512 * 7, 258)


def test_the_cooperative_matrix_variants_compile():
    """glslangValidator compiles the CM_NV variants (declared, so the wheel prebuilds them) into SPIR-V with
    cooperative-matrix loads, stores and multiply-adds, here where no device runs them."""
    from dsv4_vk.vk.shader import compile_shader, declared_variants
    variants = {tuple(sorted(dict(v))) for v in declared_variants("mul_mat_id_coopmat")}
    for fmt in (("W_BF16",), ("W_F16",), ("W_FP8",), ("W_FP4",), ("SHARED_FP8", "W_FP4")):
        assert tuple(sorted(("CM_NV", "MODE_SUM") + fmt)) in variants
        assert tuple(sorted(("CM_NV", "MODE_SWIGLU", "NORM_X") + fmt)) in variants
    for defines in ({"MODE_SWIGLU": 1, "W_BF16": 1, "NORM_X": 1, "CM_NV": 1},
                    {"MODE_SUM": 1, "W_FP4": 1, "SHARED_FP8": 1, "CM_NV": 1}):
        words = np.frombuffer(compile_shader("mul_mat_id_coopmat", defines), np.uint32)
        ops, i = set(), 5
        while i < len(words):
            ops.add(int(words[i] & 0xFFFF))
            i += int(words[i] >> 16) or 1
        assert {5359, 5360, 5361} <= ops            # OpCooperativeMatrixLoadNV, StoreNV, MulAddNV


@pytest.mark.parametrize("name, x_half", [("bf16", False), ("dsv4_fp8", False), ("bf16", True), ("dsv4_fp8", True)])
def test_model_logits_with_the_grouped_gemm_on_the_tensor_core_path(name, x_half):
    """The BF16 fixture model and the published-layout FP8 / FP4 one (FP4 experts, the FP8 shared expert)
    with every prefill chunk's experts on the grouped GEMM's tensor-core data flow (the matrix units where
    the device has them, else their FMA twin) beside MUL_MAT's, and with x rounded once by the X_ROWS pass
    (mul_mat_id_coopmat.x_half: the SwiGLU's and the sum's records in one scratch pool, layer after layer):
    logits against transformers' at NMSE ≤ 1e-5 after the prefill and every decode step."""
    from logits_check import logits_errors
    from dsv4_vk.model import Model
    knobs = {"coopmat.emulate": True, **EMULATE, "mul_mat_id_coopmat.x_half": x_half}
    with tuned(knobs):
        if name == "bf16":
            from test_model import fixture
            cfg, w, e = fixture(name)
            m = Model(cfg, w, prefill_chunk=16)
        else:
            d = os.path.join(ROOT, "tests", "fixtures", name)
            e = np.load(os.path.join(d, "expected.npz"))
            m = Model.load(d, prefill_chunk=16, max_ctx=64)
    details = " ".join(m.compiled("prefill").dispatch_details)
    assert "mul_mat_id_coopmat" in details and "mul_mat_id_grouped" not in details, details[:2000]
    assert ("X_ROWS" in details) == x_half, details[:2000]
    errs = logits_errors(m, e)
    assert max(errs) <= NMSE_MAX, f"{name}: NMSE per position {errs}"


def worker():
    from dsv4_vk.vk import default_device
    dev = default_device()
    print(f"worker: subgroup size {dev.subgroup_size}")
    rng = np.random.default_rng(7)
    with tuned(EMULATE):
        for fmt in FORMATS:                             # (x_half: bit for bit as without it, at a few)
            check_case(rng, fmt, "swiglu", 19, dev, norm=True, x_scale=30.0, x_half=fmt in ("bf16", "fp4+fp8"))
            check_case(rng, fmt, "sum", 19, dev, add=True, x_half=fmt == "fp8")
        with tuned(WIDE):
            check_case(rng, "fp8", "swiglu", 40, dev, D=136, F=72, x_half=True)
    print("worker: coopmat grouped ok")


@pytest.mark.parametrize("width,subgroup", [(128, 4), (256, 8), (512, 16)])
def test_other_subgroup_sizes(width, subgroup, device):
    if "llvmpipe" not in device.name:
        pytest.skip(f"LP_NATIVE_VECTOR_WIDTH sets only lavapipe's subgroup size; the device is {device.name}")
    out = worker_output(__file__, width)
    assert f"worker: subgroup size {subgroup}" in out and "worker: coopmat grouped ok" in out, out


if __name__ == "__main__":
    {"worker": worker}[sys.argv[1]]()
