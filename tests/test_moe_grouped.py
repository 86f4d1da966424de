"""MUL_MAT_ID's grouped path (ops/moe_grouped.py: the routing sort, the grouped GEMM, the route sum)
against float64 and against the per-route kernels, over every weight format, skewed routings (an
expert with every token, experts with none, invalid ids, another part's experts), T not a multiple
of the tile, the device's and a GPU's tile shapes.

Run as a script, the file is the subprocess worker for other lavapipe subgroup sizes.
"""
import dataclasses
import sys

import numpy as np
import pytest

from lavapipe_child import worker_output
from dsv4_vk import Executor, Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.model.synthetic import quantize
from dsv4_vk.ops import get_op
from dsv4_vk.ops.moe_grouped import SORT_POOL, expert_kernel, reference_sort, sort_layout, tile_shape
from dsv4_vk.ops.quant import quant_arrays

FORMATS = ("f32", "bf16", "f16", "fp8", "fp4", "fp4+fp8")
GPU_TILES = {"mul_mat_id_grouped.tokens": 64, "mul_mat_id_grouped.outputs": 64, "mul_mat_id_grouped.k_step": 32,
             "mul_mat_id_grouped.thread_tokens": 4, "mul_mat_id_grouped.thread_outputs": 4}


def skewed_route(rng, T, E, top_k):
    """[T, top_k + 1, 2] (V4_ROUTE's layout, route top_k the shared expert E): expert 0 on every token,
    expert E − 1 on none, the rest random; token 3's route 1 an invalid id (its outputs NaN)."""
    route = np.zeros((T, top_k + 1, 2), np.float32)
    for t in range(T):
        route[t, 0, 0] = 0
        route[t, 1:top_k, 0] = rng.choice(np.arange(1, E - 1), top_k - 1, replace=False)
    route[:, :top_k, 1] = rng.uniform(0.1, 1.0, (T, top_k))
    route[:, top_k] = (E, 1.0)
    if T > 3:
        route[3, 1, 0] = E + 9
    return route


def weights(rng, fmt, E, N, K, grid_rows=None):
    """(graph inputs: w and its extra inputs, op params, float64 reference weights with the shared
    expert last) of E routed experts and one shared expert [N, K] in format fmt."""
    w = rng.standard_normal((E + 1, N, K)).astype(np.float32) * 0.2
    if fmt in ("f32", "bf16", "f16"):
        dt = {"f32": np.float32, "bf16": BF16, "f16": np.float16}[fmt]
        wc = w.astype(dt)
        return [wc], [], {}, wc.astype(np.float64)
    if fmt in ("fp8", "fp4"):
        q = quantize(w, fmt, grid_rows)
        words, scale = quant_arrays(q.codes, q.scale)
        prm = {"wq": fmt, **({"grid_rows": grid_rows} if grid_rows else {})}
        return [words], [scale], prm, dequant(words, scale, fmt, K, E + 1, N, grid_rows)
    q = quantize(w[:E], "fp4")
    qs = quantize(w[E:], "fp8", grid_rows)
    words, scale = quant_arrays(q.codes, q.scale)
    swords, sscale = quant_arrays(qs.codes, qs.scale)
    prm = {"wq": "fp4", "shared_wq": "fp8", **({"shared_grid_rows": grid_rows} if grid_rows else {})}
    ref = np.concatenate([dequant(words, scale, "fp4", K, E, N, None), dequant(swords, sscale, "fp8", K, 1, N, grid_rows)])
    return [words], [scale, swords, sscale], prm, ref


def dequant(words, scale, fmt, K, E, N, grid_rows):
    from dsv4_vk.ops.quant import dequantize
    return dequantize(fmt, words, scale, K, E * N // (grid_rows or N)).reshape(E, N, K)


def build(mode, T, top_k, x_shape, w_in, extra, prm, add=False, norm=None, limit=None, id_prm=None):
    """(graph, its MUL_MAT_ID node); inputs x, r (and a: add, g: the norm weight as a const)."""
    g = Graph()
    xi, ri = g.input("x", x_shape), g.input("r", (T, top_k + 1, 2))
    args = [xi, g.const(w_in[0]), ri]
    kw = dict(prm, **(id_prm or {}))
    if mode == "sum" and add:
        args.append(g.input("a", add))
    if mode == "swiglu" and norm is not None:
        args.append(g.const(norm))
        kw["rms_eps"] = 1e-6
    if limit is not None:
        kw["limit"] = limit
    out = g.op("MUL_MAT_ID", *args, *[g.const(a) for a in extra], mode=mode, **kw)
    g.output("y", out)
    return g, g.nodes[-1]


def run(g, **inputs):
    ex = Executor()
    out = ex.run(g, **inputs)
    assert ex.last.check_guards() == []
    return out["y"]


def check_case(rng, fmt, mode, T, device, per_route_x=False, norm=False, add=False, D=72, F=20, E=6, top_k=3):
    """The grouped MUL_MAT_ID against float64 (NMSE ≤ 1e-10, NaNs where the reference has them) and
    against the per-route kernels (NMSE ≤ 1e-7)."""
    op = get_op("MUL_MAT_ID")
    route = skewed_route(rng, T, E, top_k)
    R = top_k + 1
    if mode == "swiglu":
        w_in, extra, prm, wref = weights(rng, fmt, E, 2 * F, D, F if fmt in ("fp8", "fp4+fp8") else None)
        x = rng.standard_normal((T, R if per_route_x else 1, D)).astype(np.float32) * (30 if norm else 1)
        gn = rng.standard_normal(D).astype(np.float32) if norm else None
        xn = x.astype(np.float64)
        if norm:
            from dsv4_vk.ops.reduce_rows import reference_rms_norm
            xn = reference_rms_norm(x, gn, 1e-6)
        ref = op.reference(xn, wref, route, mode="swiglu", limit=4.0)
        kw = dict(norm=gn, limit=4.0)
        feeds = {"x": x, "r": route}
    else:
        w_in, extra, prm, wref = weights(rng, fmt, E, D, F)
        x = rng.standard_normal((T, R, F)).astype(np.float32)
        a = rng.standard_normal((T, D)).astype(np.float32) if add else None
        ref = op.reference(x, wref, route, *([a] if add else []), mode="sum")
        kw = dict(add=(T, D) if add else False)
        feeds = {"x": x, "r": route, **({"a": a} if add else {})}
    got = {}
    for on in (True, False):
        with tuned({"mul_mat_id_grouped.on": on, "mul_mat_id_grouped.swiglu_min_routes": 0}):   # (GPU lowering too)
            g, node = build(mode, T, top_k, x.shape, w_in, extra, prm, **kw)
            shaders = [launch.shader for launch in node.op.lower(node, device)]
            assert ("mul_mat_id_grouped" in shaders) == on, shaders
            got[on] = run(g, **feeds)
    what = (fmt, mode, T, per_route_x, norm, add)
    for y in got.values():
        assert np.array_equal(np.isnan(y), np.isnan(ref)), what
    if T > 3:
        assert np.isnan(got[True][3, 1] if mode == "swiglu" else got[True][3]).all(), what
    assert nmse(got[True], ref) <= 1e-10, (what, nmse(got[True], ref))
    ok = ~np.isnan(ref)
    assert max_abs(got[True][ok], ref[ok]) <= 1e-5 * max(1.0, np.abs(ref[ok]).max()), what
    assert nmse(got[True], got[False]) <= 1e-7, what
    return got[True]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["swiglu", "sum"])
def test_grouped_experts_match_float64_and_the_per_route_kernels(fmt, mode, rng, device):
    """T = 19 (not a multiple of the tile), K = 72 with a partial K step and N = 20 / 72 partial output
    tiles; the SwiGLU with its norm folded and its clamp, the sum with and without add."""
    check_case(rng, fmt, mode, 19, device, norm=mode == "swiglu", add=mode == "sum")
    check_case(rng, fmt, mode, 9, device, add=False, D=66, F=34)            # K % 4 != 0: scalar weight loads


def test_grouped_experts_per_route_x_and_gpu_tiles(rng, tune, device, monkeypatch):
    """x different per route in the SwiGLU; the tiles a GPU gets by default (lowered as for one: 16
    route slots here, 64 outputs, k step 32, 64 invocations) and the largest (64 × 64, 256
    invocations), over bf16 and the FP4 / FP8 pair."""
    check_case(rng, "f32", "swiglu", 12, device, per_route_x=True)
    odd = {"mul_mat_id_grouped.tokens": 12, "mul_mat_id_grouped.outputs": 12, "mul_mat_id_grouped.k_step": 8,
           "mul_mat_id_grouped.thread_tokens": 3, "mul_mat_id_grouped.thread_outputs": 3}
    with tuned(odd):                                    # tiles of no power of two, 3 × 3 an invocation
        check_case(rng, "fp8", "swiglu", 29, device, norm=True)
        check_case(rng, "fp4", "sum", 29, device, add=True)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    assert tile_shape(device, 70 * 4, 8) == (64, 64, 32, 4, 4)
    assert tile_shape(device, 12 * 4, 8)[0] == 16
    check_case(rng, "fp4+fp8", "swiglu", 12, device, norm=True, D=136, F=72)
    check_case(rng, "bf16", "sum", 12, device, add=True, D=136, F=72)
    tune(GPU_TILES)
    for fmt in ("bf16", "fp4+fp8"):
        check_case(rng, fmt, "swiglu", 70, device, norm=True, D=136, F=72)
        check_case(rng, fmt, "sum", 70, device, add=True, D=136, F=72)


@pytest.mark.parametrize("tiles", [{}, GPU_TILES, {**GPU_TILES, "mul_mat_id_grouped.thread_tokens": 8}])
def test_literal_arrays_give_the_same_sums(tiles, rng, device, monkeypatch):
    """mul_mat_id_grouped.literal: the same f32 GEMM with literal-size per-invocation arrays, taken by
    vec4 rows of bf16 experts and of FP4 ones beside the FP8 shared expert (the variants declared),
    at the device's tiles, a GPU's and 8 route slots an invocation; the same values bit for bit as
    the spec-sized arrays (and so against float64, as check_case holds them); other formats, scalar
    rows and tiles past the literal sizes keep the spec-sized kernel."""
    from dsv4_vk.ops.moe_grouped import literal_fits
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    for fmt, mode in (("bf16", "swiglu"), ("bf16", "sum"), ("fp4+fp8", "swiglu"), ("fp4+fp8", "sum")):
        seed = int(rng.integers(1 << 30))
        same_sums(seed, fmt, mode, 70, device, tiles, {"mul_mat_id_grouped.literal": True}, "LITERAL_ARRAYS")
    assert not literal_fits({"VEC4": 1, "MODE_SUM": 1}, 64, 64, 32, 4, 4, 256, 1)             # f32: not declared
    assert not literal_fits({"MODE_SUM": 1, "W_BF16": 1}, 64, 64, 32, 4, 4, 256, 1)           # scalar rows
    assert not literal_fits({"VEC4": 1, "W_BF16": 1}, 64, 64, 32, 16, 4, 64, 2)               # TM past 8
    assert literal_fits({"VEC4": 1, "W_FP4": 1, "SHARED_FP8": 1}, 64, 64, 32, 4, 4, 256, 2)


@pytest.mark.parametrize("tiles", [{}, GPU_TILES, {**GPU_TILES, "mul_mat_id_grouped.thread_tokens": 8}])
def test_prefetch_gives_the_same_sums(tiles, rng, device, monkeypatch):
    """mul_mat_id_grouped.prefetch: the f32 grouped GEMM with the next k step's loads issued before the
    step's products (register double-buffering), taken where literal is (vec4 rows of bf16 experts and
    of FP4 ones beside the FP8 shared expert), alone at the device's tiles and a GPU's, with the
    literal-size arrays at a GPU's and 8 route slots an invocation; T = 69, K with a partial last step
    (136 = 4·32 + 8, 72 = 2·32 + 8; the device's 16-input steps too) and, at a GPU's tiles, K of
    whole steps only (128, 64); the same values bit for bit as without it (and so against float64, as
    check_case holds them). Scalar rows (K % 4 ≠ 0) and tiles whose staging is past the literal sizes
    keep the plain kernel."""
    from dsv4_vk.ops.moe_grouped import prefetch_fits
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    on = {"mul_mat_id_grouped.prefetch": True}
    shapes = ((136, 72), (128, 64)) if tiles == GPU_TILES else ((136, 72),)
    for fmt, mode in (("bf16", "swiglu"), ("bf16", "sum"), ("fp4+fp8", "swiglu"), ("fp4+fp8", "sum")):
        for D, F in shapes:
            if tiles.get("mul_mat_id_grouped.thread_tokens") != 8:
                same_sums(int(rng.integers(1 << 30)), fmt, mode, 69, device, tiles, on, "PREFETCH", D=D, F=F)
            if tiles and (D, F) == (136, 72):
                same_sums(int(rng.integers(1 << 30)), fmt, mode, 69, device,
                          {**tiles, "mul_mat_id_grouped.literal": True}, on, "PREFETCH", D=D, F=F)
    with tuned({**tiles, **on}):                                           # K % 4 != 0: scalar rows, no prefetch
        assert "PREFETCH" not in gemm_defines("bf16", "sum", 9, device, D=66, F=34)
    assert not prefetch_fits({"VEC4": 1, "MODE_SUM": 1}, 64, 64, 32, 256, 1)                # f32: not declared
    assert not prefetch_fits({"MODE_SUM": 1, "W_BF16": 1}, 64, 64, 32, 256, 1)              # scalar rows
    assert not prefetch_fits({"VEC4": 1, "W_BF16": 1}, 64, 64, 32, 64, 2)                   # 32 x elements each
    assert prefetch_fits({"VEC4": 1, "W_FP4": 1, "SHARED_FP8": 1}, 64, 64, 32, 256, 2)


def gemm_defines(fmt, mode, T, device, D, F):
    """The defines of the grouped GEMM check_case(fmt, mode, T, D=D, F=F) lowers to (the tuning in effect)."""
    r = np.random.default_rng(0)
    w_in, extra, prm, _ = weights(r, fmt, 6, 2 * F if mode == "swiglu" else D, D if mode == "swiglu" else F)
    g, node = build(mode, T, 3, (T, 1, D) if mode == "swiglu" else (T, 4, F), w_in, extra, prm,
                    **({"limit": 4.0} if mode == "swiglu" else {}))
    gemm = [launch for launch in node.op.lower(node, device) if launch.shader == "mul_mat_id_grouped"]
    return gemm[0].defines


def same_sums(seed, fmt, mode, T, device, tiles, knobs, define, D=136, F=72):
    """check_case on the same inputs under `tiles` and under `tiles` with `knobs`, which must add
    `define` to the grouped GEMM: the same values bit for bit (the SwiGLU with its norm folded, the sum
    with add)."""
    outs = []
    for extra in ({}, knobs):
        with tuned({**tiles, **extra}):
            outs.append(check_case(np.random.default_rng(seed), fmt, mode, T, device, norm=mode == "swiglu",
                                   add=mode == "sum", D=D, F=F))
            assert (define in gemm_defines(fmt, mode, T, device, D, F)) == bool(extra), (fmt, mode, tiles, extra)
    assert np.array_equal(outs[0], outs[1], equal_nan=True), (fmt, mode, tiles, knobs, D, F)


def test_split_stack_adds_only_its_part(rng, device):
    """Two parts of a stack (id_base / n_ids): each grouped call computes its own experts, 0 for the
    other part's routes (SwiGLU) or nothing (sum), NaN for invalid ids; the parts together are the
    whole."""
    op = get_op("MUL_MAT_ID")
    T, E, top_k, D, F = 17, 8, 3, 40, 24
    route = skewed_route(rng, T, E - 1, top_k)         # ids 0 .. E − 1 (E − 1: the shared one)
    w13 = rng.standard_normal((E, 2 * F, D)).astype(np.float32)
    w2 = rng.standard_normal((E, D, F)).astype(np.float32)
    x = rng.standard_normal((T, 1, D)).astype(np.float32)
    h = rng.standard_normal((T, top_k + 1, F)).astype(np.float32)
    for lo, hi in ((0, 5), (5, 8)):
        ids = {"id_base": lo, "n_ids": E}
        for mode, xin, w in (("swiglu", x, w13), ("sum", h, w2)):
            g, node = build(mode, T, top_k, xin.shape, [w[lo:hi]], [], {}, id_prm=ids)
            assert "mul_mat_id_grouped" in [launch.shader for launch in node.op.lower(node, device)]
            got = run(g, x=xin, r=route)
            ref = op.reference(xin, w[lo:hi], route, mode=mode, **ids)
            assert np.array_equal(np.isnan(got), np.isnan(ref))
            assert np.isnan(got[3, 1] if mode == "swiglu" else got[3]).all()
            if mode == "swiglu":                        # another part's routes: 0
                other = ~((route[..., 0] >= lo) & (route[..., 0] < hi)) & (route[..., 0] < E)
                assert other.any() and np.all(got[other] == 0)
            assert nmse(got, ref) <= 1e-10, (lo, mode)
            ok = ~np.isnan(ref)
            assert max_abs(got[ok], ref[ok]) <= 1e-5 * max(1.0, np.abs(ref[ok]).max()), (lo, mode)


@pytest.mark.parametrize("shared,id_base", [(False, 0), (True, 0), (False, 3)])
def test_routing_sort_is_a_stable_counting_sort(shared, id_base, rng, device):
    """The sort's counts, offsets, list (tokens in order within an expert) and tile table, read back
    from its working memory, equal numpy's stable sort; hash-routed tables (any ids, repeats across
    tokens) and a split stack's ids (other parts' routes in the last bucket) too."""
    T, R, E = 37, 4, 5
    n_ids = E + 1 if shared else E + id_base + 4       # shared: id E is the shared expert
    route = np.zeros((T, R, 2), np.float32)
    route[..., 0] = rng.integers(0, n_ids + 2, (T, R))  # ids past n_ids: invalid
    route[:, 0, 0] = id_base                            # one expert on every token
    route[5, 2, 0] = -1.0
    route[6, 1, 0] = 2.5
    bt = tile_shape(device, T * R, E + int(shared) + 1)[0]
    g = Graph()
    x, r = g.input("x", (T, R, 8)), g.input("r", route.shape)
    if shared:
        q = quantize(np.zeros((E, 4, 8), np.float32), "fp4")
        qs = quantize(np.zeros((1, 4, 8), np.float32), "fp8")
        words, scale = quant_arrays(q.codes, q.scale)
        args = [x, g.const(words), r, g.const(scale), *map(g.const, quant_arrays(qs.codes, qs.scale))]
        prm = {"wq": "fp4", "shared_wq": "fp8"}
    else:
        args, prm = [x, g.const(np.zeros((E, 4, 8), np.float32)), r], {"id_base": id_base, "n_ids": n_ids}
    g.output("y", g.op("MUL_MAT_ID", *args, mode="sum", **prm))
    cg = Executor().compile(g)
    cg.run(x=np.zeros((T, R, 8), np.float32), r=route)
    got = cg.read(g.scratch(SORT_POOL))
    B = E + int(shared) + 1
    lay = sort_layout(T * R, B)
    ref = reference_sort(route, E, id_base, n_ids, shared, bt)
    assert np.array_equal(got[lay["CNT"]:lay["CNT"] + B], ref["counts"])
    assert np.array_equal(got[lay["OFF"]:lay["OFF"] + B], ref["offsets"])
    assert np.array_equal(got[lay["LIST0"]:lay["LIST0"] + T * R], ref["list"])
    n = int(got[0])
    assert n == len(ref["tiles"])
    assert np.array_equal(got[lay["TILE0"]:lay["TILE0"] + 3 * n].reshape(n, 3), ref["tiles"])
    assert ref["counts"][0] >= T and ref["counts"][-1] >= 2         # skewed: expert 0 everywhere, invalid ids


def test_kernel_choice_and_knobs(device, tune, monkeypatch):
    """T below mul_mat_id_grouped.min_tokens (the decode step) and the escape hatch take the per-route
    kernels; tile knobs that cannot work are refused naming the knob."""
    assert expert_kernel(1).kernel == "per_route"
    assert expert_kernel(8).kernel == "grouped"
    with tuned({"mul_mat_id_grouped.on": False}):
        assert expert_kernel(4096).kernel == "per_route" and "on is off" in expert_kernel(4096).reason
    # a GPU's SwiGLU over quantised experts with few routes each keeps the per-route kernels; the sum, bf16
    # experts and CPU devices don't
    from dsv4_vk.ops import moe_grouped
    gpu = not moe_grouped.is_cpu(device)
    assert expert_kernel(512, "swiglu", 14.0, device, True).kernel == ("per_route" if gpu else "grouped")
    with monkeypatch.context() as mp:
        mp.setattr(moe_grouped, "is_cpu", lambda d: False)
        c = expert_kernel(512, "swiglu", 14.0, device, True)
        assert c.kernel == "per_route" and "14.0 routes each on average, < mul_mat_id_grouped.swiglu_min_routes" in c.reason
        assert expert_kernel(512, "swiglu", 55.0, device, True).kernel == "grouped"
        assert expert_kernel(512, "swiglu", 14.0, device, False).kernel == "grouped"
        assert expert_kernel(512, "sum", 14.0, device, True).kernel == "grouped"
        with tuned({"mul_mat_id_grouped.swiglu_min_routes": 8}):
            assert expert_kernel(512, "swiglu", 14.0, device, True).kernel == "grouped"
        from dsv4_vk.cli.info import _human, report
        assert ("MUL_MAT_ID    its SwiGLU over 257 FP8/FP4 experts: per_route — the SwiGLU's experts get 13.9 "
                "routes each") in _human(report(device))
        for bad in (-1, "32", True):
            with tuned({"mul_mat_id_grouped.swiglu_min_routes": bad}), pytest.raises(ValueError, match="swiglu_min_routes"):
                expert_kernel(512, "swiglu", 14.0, device, True)
    from dsv4_vk.cli.info import _human, report
    assert "MUL_MAT_ID    512 tokens × 7 routes: grouped — T = 512 ≥ mul_mat_id_grouped.min_tokens" in _human(report(device))
    g, node = build("sum", 9, 2, (9, 3, 8), [np.zeros((4, 8, 8), np.float32)], [], {})
    with tuned({"mul_mat_id_grouped.sort_chunk": 0}), pytest.raises(ValueError, match="'mul_mat_id_grouped.sort_chunk'"):
        node.op.lower(node, device)
    # tiles past any device's shared memory, every other tile check holding (a 64-invocation workgroup)
    with tuned({"mul_mat_id_grouped.outputs": 4096, "mul_mat_id_grouped.thread_outputs": 1024,
                "mul_mat_id_grouped.tokens": 64, "mul_mat_id_grouped.k_step": 16}), \
            pytest.raises(ValueError, match="bytes of shared memory, past this device's"):
        tile_shape(device)
    tune({"mul_mat_id_grouped.thread_tokens": 3})
    with pytest.raises(ValueError, match="thread_tokens 3 must divide tokens"):
        tile_shape(device)


def test_working_memory_is_one_pool_per_name_as_large_as_the_largest_request():
    """Every grouped MUL_MAT_ID of a graph shares the sort's pool and the routes' products' pool
    (sized to the largest); the per-route path asks for none; an unknown pool is refused by name."""
    from dsv4_vk.ops.moe_grouped import ROUTES_POOL, grouped_scratch
    g = Graph()
    x = g.input("x", (20, 1, 8))
    h = g.op("MUL_MAT_ID", x, g.const(np.zeros((5, 12, 8), np.float32)), g.input("r", (20, 3, 2)), mode="swiglu")
    g.op("MUL_MAT_ID", h, g.const(np.zeros((5, 8, 6), np.float32)), g.input("r2", (20, 3, 2)), mode="sum")
    g.op("MUL_MAT_ID", g.input("x3", (9, 4, 6)), g.const(np.zeros((7, 8, 6), np.float32)), g.input("r3", (9, 4, 2)),
         mode="sum")
    g.op("MUL_MAT_ID", g.input("x4", (1, 4, 6)), g.const(np.zeros((7, 8, 6), np.float32)), g.input("r4", (1, 4, 2)),
         mode="sum")
    pools = [s for s in g.storages if (s.name or "").startswith("scratch:")]
    assert sorted(s.name for s in pools) == [f"scratch:{ROUTES_POOL}", f"scratch:{SORT_POOL}"]
    want = [grouped_scratch(20, 3, 5, 8, "sum", False), grouped_scratch(9, 4, 7, 8, "sum", False)]
    assert g.scratch(SORT_POOL).numel == max(w[SORT_POOL][0] for w in want)
    assert g.scratch(ROUTES_POOL).numel == max(w[ROUTES_POOL][0] for w in want) == 20 * 3 * 8
    with pytest.raises(ValueError, match="no op of this graph asked for scratch pool 'nope'"):
        g.scratch("nope")


def worker():
    from dsv4_vk.vk import default_device
    dev = default_device()
    print(f"worker: subgroup size {dev.subgroup_size}")
    rng = np.random.default_rng(5)
    for fmt in ("bf16", "fp8", "fp4+fp8"):
        if fmt == "fp8":
            check_case(rng, fmt, "swiglu", 19, dev, norm=True)
            check_case(rng, fmt, "sum", 19, dev, add=True)
            continue
        for mode in ("swiglu", "sum"):                  # and with the next step's loads issued a step ahead
            same_sums(int(rng.integers(1 << 30)), fmt, mode, 19, dev, {}, {"mul_mat_id_grouped.prefetch": True},
                      "PREFETCH", D=72, F=20)
    print("worker: grouped ok")


@pytest.mark.parametrize("width,subgroup", [(128, 4), (256, 8), (512, 16)])
def test_other_subgroup_sizes(width, subgroup):
    out = worker_output(__file__, width)
    assert f"worker: subgroup size {subgroup}" in out and "worker: grouped ok" in out, out


if __name__ == "__main__":
    {"worker": worker}[sys.argv[1]]()
