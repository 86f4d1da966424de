"""The model-family kernels that predate DeepSeek-V4's attention (KV_WRITE and ATTENTION over a
per-head cache, MOE_ROUTE, MUL_MAT_ID, SAMPLE) against their float64 references."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4_vk.ops.sample as sample_ops
from dsv4_vk import Executor, Graph
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.ops import get_op, mul_mat
from dsv4_vk.ops.attention import rope_tables
from dsv4_vk.ops.sample import sample_candidates, sample_uniform


def run_graph(g, **inputs):
    ex = Executor()
    out = ex.run(g, **inputs)
    assert ex.last.check_guards() == []
    return out


# --- kernels against their references ---------------------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 9), S=st.integers(1, 2), H=st.integers(1, 3), half=st.integers(1, 9),
       C=st.integers(1, 24), p0=st.integers(-2, 26), seed=st.integers(0, 2**31))
def test_kv_write_writes_rotated_rows_at_the_device_position_only(T, S, H, half, C, p0, seed):
    rng = np.random.default_rng(seed)
    hd = 2 * half
    cos, sin = (a.astype(np.float32) for a in rope_tables(hd, C))
    cache = rng.standard_normal((C, S, H, hd)).astype(np.float32)
    x = rng.standard_normal((T, 2 * S, H, hd)).astype(np.float32)          # written from a strided view
    rot = int(rng.integers(0, S + 1))
    g = Graph()
    c, xi, pi = g.input("cache", cache.shape), g.input("x", x.shape), g.input("pos", (1,), "i32")
    g.output("c", g.op("KV_WRITE", c, xi[:, ::2], pi, g.const(cos), g.const(sin), rotate=rot, out=c))
    got = run_graph(g, cache=cache, x=x, pos=np.array([p0], np.int32))["c"]
    ref = get_op("KV_WRITE").reference(cache, x[:, ::2], [p0], cos, sin, rotate=rot)
    assert nmse(got, ref) <= 1e-12 and max_abs(got, ref) <= 1e-5
    untouched = [p for p in range(C) if not p0 <= p < p0 + T]
    assert np.array_equal(got[untouched], cache[untouched])


def test_kv_write_without_out_is_refused():
    cos, sin = (a.astype(np.float32) for a in rope_tables(4, 8))
    g = Graph()
    g.op("KV_WRITE", g.input("cache", (8, 1, 1, 4)), g.input("x", (1, 1, 1, 4)), g.input("pos", (1,), "i32"),
         g.const(cos), g.const(sin))
    with pytest.raises(ValueError, match=r"KV_WRITE writes the cache in place: pass out=<the cache tensor given as "
                                         r"input 0>"):
        Executor().compile(g)


@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 6), H=st.integers(1, 4), half=st.integers(1, 40), C=st.integers(1, 40),
       p0=st.integers(0, 40), rope=st.booleans(), seed=st.integers(0, 2**31))
def test_attention_is_causal_over_the_cache_and_nan_past_capacity(T, H, half, C, p0, rope, seed):
    rng = np.random.default_rng(seed)
    hd = 2 * half
    cos, sin = (a.astype(np.float32) for a in rope_tables(hd, C))
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    kv = (rng.standard_normal((C, 2, H, hd)) * 2).astype(np.float32)
    g = Graph()
    qi, ki, pi = g.input("q", q.shape), g.input("kv", kv.shape), g.input("pos", (1,), "i32")
    g.output("o", g.op("ATTENTION", qi, ki[:, 0], ki[:, 1], pi, g.const(cos), g.const(sin), scale=hd ** -0.5, rope=rope))
    got = run_graph(g, q=q, kv=kv, pos=np.array([p0], np.int32))["o"]
    ref = get_op("ATTENTION").reference(q, kv[:, 0], kv[:, 1], [p0], cos, sin, scale=hd ** -0.5, rope=rope)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got).any() == (p0 + T > C)
    if not np.isnan(ref).all():
        assert nmse(got, ref) <= 1e-10 and max_abs(got, ref) <= 1e-4


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
@pytest.mark.parametrize("norm", [True, False])
def test_moe_route_picks_top_k_with_ties_to_the_lower_id(router, norm, rng):
    T, E, K = 37, 9, 3
    lg = rng.standard_normal((T, E)).astype(np.float32)
    lg[0, [2, 5, 7]] = lg[0].max() + 1.0                  # a three-way tie at the top
    lg[1, 4] = np.nan                                      # never picked
    g = Graph()
    li = g.input("l", (T, E))
    g.output("r", g.op("MOE_ROUTE", li, top_k=K, router=router, norm=norm, route_scale=1.5, n_shared=2))
    got = run_graph(g, l=lg)["r"]
    ref = get_op("MOE_ROUTE").reference(np.nan_to_num(lg, nan=-np.inf), top_k=K, router=router, norm=norm,
                                        route_scale=1.5, n_shared=2)
    assert np.array_equal(got[..., 0], ref[..., 0])
    assert list(got[0, :K, 0]) == [2, 5, 7] and 4 not in got[1, :, 0]
    ok = np.arange(T) != 1                                 # the softmax denominator of row 1 is NaN
    assert max_abs(got[ok, :, 1], ref[ok, :, 1]) <= 1e-6


@pytest.mark.parametrize("D,F,unroll,routes,wg,top_k", [
    (20, 12, None, None, None, 2), (400, 200, 4, None, None, 2), (400, 200, 3, 2, None, 2),
    (400, 200, 4, 4, None, 6), (20, 12, 1, 3, None, 6), (400, 200, 2, 4, 64, 6), (20, 12, 1, 8, 16, 2)])
@pytest.mark.parametrize("as_gpu", [False, True])
def test_mul_mat_id_reads_only_the_chosen_experts(tune, as_gpu, D, F, unroll, routes, wg, top_k, rng, monkeypatch, device):
    """SwiGLU over the routes, then the weighted sum (+ add); an invalid id gives NaN, not a wild read.
    unroll: vec4 steps in flight per lane (400, 200: unrolled steps, then a tail of single steps);
    routes: the sum's routes loaded together (top_k + 1 routes: groups, then a padded last group);
    wg: the sum's outputs reduced by a workgroup of that many lanes each."""
    if as_gpu:      # lower as for a GPU: subgroup-lane clusters over K instead of one lane per output
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.unroll": unroll})
    tune({"mul_mat_id.routes": routes})
    tune({"mul_mat_id.wg": wg})
    T, E = 5, 8
    route = get_op("MOE_ROUTE").reference(rng.standard_normal((T, E - 1)), top_k=top_k, n_shared=1).astype(np.float32)
    route[3, 1, 0] = E + 7                                 # out of range: token 3 -> NaN
    w13 = rng.standard_normal((E, 2 * F, D)).astype(np.float32)
    w2 = rng.standard_normal((E, D, F)).astype(np.float32)
    x, add = rng.standard_normal((T, D)).astype(np.float32), rng.standard_normal((T, D)).astype(np.float32)
    g = Graph()
    xi, ri, ai = g.input("x", x.shape), g.input("r", route.shape), g.input("a", add.shape)
    h = g.output("h", g.op("MUL_MAT_ID", xi.reshape(T, 1, D), g.const(w13), ri, mode="swiglu"))
    g.output("y", g.op("MUL_MAT_ID", h, g.const(w2), ri, ai, mode="sum"))
    out = run_graph(g, x=x, r=route, a=add)
    op = get_op("MUL_MAT_ID")
    rh = op.reference(x[:, None, :], w13, route, mode="swiglu")
    ry = op.reference(rh, w2, route, add, mode="sum")
    for got, ref in ((out["h"], rh), (out["y"], ry)):
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(got[3]).any()
        assert nmse(got, ref) <= 1e-10
    gn = rng.standard_normal(D).astype(np.float32)           # with the FFN norm folded in
    g = Graph()
    xi, ri = g.input("x", x.shape), g.input("r", route.shape)
    g.output("h", g.op("MUL_MAT_ID", xi.reshape(T, 1, D), g.const(w13), ri, g.const(gn), mode="swiglu",
                       rms_eps=1e-6))
    got = run_graph(g, x=x * 30, r=route)["h"]
    ref = op.reference(x[:, None, :] * 30, w13, route, gn, mode="swiglu", rms_eps=1e-6)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(got[3]).any()
    assert nmse(got, ref) <= 1e-10
    assert nmse(ref, rh) > 1e-3                                # the norm changed the result


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("as_gpu", [False, True])
def test_mul_mat_id_over_16bit_experts(dtype, as_gpu, rng, monkeypatch, device):
    """MUL_MAT_ID's SwiGLU (with and without the folded norm) and weighted sum over bf16 / f16
    experts (K a multiple of 8, and K = 20), against float64."""
    from dsv4_vk.model.checkpoint import BF16
    if as_gpu:
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    npdt = BF16 if dtype == "bf16" else np.dtype(np.float16)
    op = get_op("MUL_MAT_ID")
    for D, F in ((400, 200), (20, 12)):
        T, E = 3, 5
        route = get_op("MOE_ROUTE").reference(rng.standard_normal((T, E - 1)), top_k=2, n_shared=1).astype(np.float32)
        w13 = (rng.standard_normal((E, 2 * F, D)) / np.sqrt(D)).astype(npdt)
        w2 = (rng.standard_normal((E, D, F)) / np.sqrt(F)).astype(npdt)
        x, gn = rng.standard_normal((T, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32)
        for norm in (False, True):
            g = Graph()
            xi, ri = g.input("x", x.shape), g.input("r", route.shape)
            extra = ([g.const(gn)], {"rms_eps": 1e-6}) if norm else ([], {})
            h = g.output("h", g.op("MUL_MAT_ID", xi.reshape(T, 1, D), g.const(w13), ri, *extra[0], mode="swiglu",
                                   **extra[1]))
            g.output("y", g.op("MUL_MAT_ID", h, g.const(w2), ri, mode="sum"))
            out = run_graph(g, x=x, r=route)
            rh = op.reference(x[:, None, :], w13.astype(np.float64), route, *([gn] if norm else []), mode="swiglu",
                              **extra[1])
            ry = op.reference(rh, w2.astype(np.float64), route, mode="sum")
            assert nmse(out["h"], rh) <= 1e-10 and nmse(out["y"], ry) <= 1e-10, (D, norm)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("as_gpu,spread", [(False, None), (True, None), (True, 0)])
def test_one_token_gemv_over_16bit_weights(tune, dtype, as_gpu, spread, rng, monkeypatch, device):
    """MUL_MAT at T = 1 over bf16 / f16 weights, plain and with the RMS norm folded in, against
    float64: K of 4096, 200, 68, and a weight view starting 4 elements in. As on a GPU, 37 outputs
    are reduced by a workgroup each where K allows (K = 4096: 256 lanes), or by subgroup-lane
    clusters (spread 0)."""
    from dsv4_vk.model.checkpoint import BF16
    if as_gpu:      # lower as for a GPU: lane clusters over K, 4 vec4 steps in flight
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"gemv.spread": spread})
    if as_gpu:      # the launch is the one the parameters name
        g = Graph()
        g.op("MUL_MAT", g.input("x", (1, 4096)), g.input("w", (37, 4096), dtype))
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert ("LANES_WORKGROUP" in launch.defines) == (spread is None)
    npdt = BF16 if dtype == "bf16" else np.dtype(np.float16)
    for K, start in ((4096, 0), (200, 0), (68, 0), (64, 4)):
        N = 37
        w = (rng.standard_normal((N * K + start,)) / np.sqrt(K)).astype(npdt)
        x = rng.standard_normal((1, K)).astype(np.float32) * 3
        gn = rng.standard_normal(K).astype(np.float32)
        for norm in (False, True):
            g = Graph()
            wv = g.const(w)[start:].reshape(N, K)
            args = [g.input("x", (1, K)), wv] + ([g.const(gn)] if norm else [])
            g.output("y", g.op("MUL_MAT", *args, **({"rms_eps": 1e-6} if norm else {})))
            got = run_graph(g, x=x)["y"]
            ref = get_op("MUL_MAT").reference(x, w[start:].astype(np.float64).reshape(N, K),
                                              *([gn] if norm else []), **({"rms_eps": 1e-6} if norm else {}))
            assert nmse(got, ref) <= 1e-10 and max_abs(got, ref) <= 1e-4 * np.abs(ref).max(), (K, start, norm)


def test_sample_greedy_and_top_k_match_the_reference_draw_by_draw(rng):
    T, V = 400, 70
    lg = (rng.standard_normal((T, V)) * 2).astype(np.float32)
    lg[0] = np.nan
    lg[1, :] = -np.inf
    lg[1, 9] = 0.5                                          # the only finite logit
    lg[2, [3, 30]] = lg[2].max() + 1                        # tie: the lower id is greedy's pick
    for temp, k in ((0.0, 8), (1.0, 1), (0.7, 5), (1.3, 64)):
        g = Graph()
        li, ci, si = g.input("l", (T, V)), g.input("c", (2,)), g.input("s", (2,), "i32")
        g.output("tok", g.op("SAMPLE", li, ci, si))
        g.output("state", si)
        seed, counter = int(rng.integers(0, 2**31)), int(rng.integers(0, 2**30))
        out = run_graph(g, l=lg, c=np.array([temp, k], np.float32), s=np.array([seed, counter], np.int32))
        ref = get_op("SAMPLE").reference(lg, [temp, k], [seed, counter])
        assert list(out["state"]) == [seed, counter + T]     # the counter advanced on the device
        assert out["tok"][0] == -1 and out["tok"][1] == 9
        if temp == 0 or k == 1:
            assert out["tok"][2] == 3
        # a draw may flip only where u lies within f32 rounding of a cumulative boundary
        near = np.zeros(T, bool)
        for r in range(2, T):
            ids, p = sample_candidates(lg[r], temp, k)
            near[r] = np.min(np.abs(np.cumsum(p) - sample_uniform(seed, counter + r))) < 1e-5
        assert near.sum() <= T // 50                            # ≥ 98% of the draws compared exactly
        assert np.array_equal(out["tok"][~near], ref[~near])


@pytest.mark.parametrize("temp, k", [(0.0, 1), (0.8, 5), (1.2, 64)])
def test_two_stage_sample_draws_the_single_stage_token(rng, temp, k):
    """SAMPLE_CANDIDATES (top_k per 2048-logit chunk) then SAMPLE over the pairs: the same tokens as
    SAMPLE over the whole row, with ties across chunks, NaN/inf logits and a row without any."""
    T, V = 5, sample_ops.SPLIT_MIN_VOCAB + 3000            # a partial last chunk
    lg = (rng.standard_normal((T, V)) * 2).astype(np.float32)
    lg[0, [7, 3000, V - 1]] = lg[0].max() + 1              # a three-way tie in three chunks: id 7 first
    lg[1, ::3] = np.nan
    lg[1, 5::7] = np.inf
    lg[2, :] = -np.inf                                     # no finite logit: token −1
    lg[3, :] = 0.25                                        # everything tied: ids in order
    seed, counter = int(rng.integers(0, 2**31)), int(rng.integers(0, 2**30))
    toks = {}
    for split in (False, True):
        g = Graph()
        li, ci, si = g.input("l", (T, V)), g.input("c", (2,)), g.input("s", (2,), "i32")
        if split:
            cands = g.op("SAMPLE_CANDIDATES", li, ci)
            g.output("cands", cands)
            g.output("tok", g.op("SAMPLE", cands, ci, si, candidates=True))
            assert [n.op.name for n in g.nodes] == ["SAMPLE_CANDIDATES", "SAMPLE"]
        else:
            g.output("tok", g.op("SAMPLE", li, ci, si))
        g.output("state", si)
        cfg = np.array([temp, k], np.float32)
        out = run_graph(g, l=lg, c=cfg, s=np.array([seed, counter], np.int32))
        assert list(out["state"]) == [seed, counter + T]
        toks[split] = out["tok"]
        if split:
            ref = get_op("SAMPLE_CANDIDATES").reference(lg, cfg)
            assert np.array_equal(out["cands"], ref.astype(np.float32))
            assert np.array_equal(out["tok"], get_op("SAMPLE").reference(ref, cfg, [seed, counter], candidates=True))
    assert np.array_equal(toks[False], toks[True])
    assert toks[True][2] == -1
    if temp == 0 or k == 1:
        assert toks[True][0] == 7 and toks[True][3] == 0


def test_two_stage_sample_at_deepseek_vocabulary(rng):
    T, V = 2, 129280
    lg = (rng.standard_normal((T, V)) * 3).astype(np.float32)
    for temp, k in ((0.0, 1), (0.9, 64)):
        g = Graph()
        li, ci, si = g.input("l", (T, V)), g.input("c", (2,)), g.input("s", (2,), "i32")
        g.output("tok", sample_ops.sample(g, li, ci, si))
        cfg, st = np.array([temp, k], np.float32), np.array([11, 5], np.int32)
        out = run_graph(g, l=lg, c=cfg, s=st)
        assert np.array_equal(out["tok"], get_op("SAMPLE").reference(lg, cfg, st))


def test_model_graph_samples_long_vocabularies_in_two_stages():
    g = Graph()
    li, ci = g.input("l", (1, sample_ops.SPLIT_MIN_VOCAB)), g.input("c", (2,))
    sample_ops.sample(g, li, ci, g.input("s", (2,), "i32"))
    sample_ops.sample(g, g.input("short", (1, 100)), ci, g.input("s2", (2,), "i32"))
    assert [n.op.name for n in g.nodes] == ["SAMPLE_CANDIDATES", "SAMPLE", "SAMPLE"]
    with pytest.raises(ValueError, match="longer than 8000: sample it in two stages"):
        g.op("SAMPLE", g.input("long", (1, 8001)), ci, g.input("s4", (2,), "i32"))
    with pytest.raises(ValueError, match="candidates=True needs SAMPLE_CANDIDATES pairs"):
        g.op("SAMPLE", g.input("odd", (1, 100)), ci, g.input("s3", (2,), "i32"), candidates=True)


def test_sample_frequencies_follow_the_top_k_softmax():
    """8000 draws from one row: never outside the top k, frequencies within 5 sigma of softmax(v/T)."""
    V, T, k, temp = 30, 8000, 6, 0.9
    row = np.random.default_rng(3).standard_normal(V).astype(np.float32)
    g = Graph()
    li, ci, si = g.input("l", (1, V)), g.input("c", (2,)), g.input("s", (2,), "i32")
    g.output("tok", g.op("SAMPLE", li.broadcast_to((T, V)), ci, si))
    toks = run_graph(g, l=row[None], c=np.array([temp, k], np.float32), s=np.array([7, 0], np.int32))["tok"]
    ids, p = sample_candidates(row, temp, k)
    assert set(toks.tolist()) <= set(ids.tolist())
    freq = np.array([(toks == i).mean() for i in ids])
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / T))


def test_model_op_declaration_errors():
    g = Graph()
    cache, x = g.input("c", (8, 2, 2, 4)), g.input("x", (3, 2, 2, 4))
    pos, cos, sin = g.input("p", (1,), "i32"), g.input("cos", (8, 2)), g.input("sin", (8, 2))
    with pytest.raises(ValueError, match="pos .* must be i32"):
        g.op("KV_WRITE", cache, x, g.input("pf", (1,)), cos, sin, out=cache)
    with pytest.raises(ValueError, match="cos .*RoPE table.*\\[8, 2\\]"):
        g.op("KV_WRITE", cache, x, pos, g.input("c7", (7, 2)), sin, out=cache)
    with pytest.raises(ValueError, match="rotate must be an integer in \\[0, 2\\]"):
        g.op("KV_WRITE", cache, x, pos, cos, sin, rotate=3, out=cache)
    with pytest.raises(ValueError, match="ATTENTION needs scale="):
        g.op("ATTENTION", x[:, 0], cache[:, 0], cache[:, 1], pos, cos, sin)
    with pytest.raises(ValueError, match="top_k must be an integer in \\[1, 4\\]"):
        g.op("MOE_ROUTE", g.input("l", (3, 4)), top_k=5)
    with pytest.raises(ValueError, match="x has 2 rows per token, expected 1 or 3"):
        g.op("MUL_MAT_ID", g.input("xx", (2, 2, 4)), g.input("w", (5, 6, 4)), g.input("r", (2, 3, 2)), mode="swiglu")
    with pytest.raises(ValueError, match="state .* must be i32"):
        g.op("SAMPLE", g.input("lg", (1, 9)), g.input("cf", (2,)), g.input("st", (2,)))
    # KV_WRITE writes in place: a fresh output would leave the cache unwritten
    g2 = Graph()
    c2 = g2.input("c", (8, 2, 2, 4))
    g2.output("o", g2.op("KV_WRITE", c2, g2.input("x", (3, 2, 2, 4)), g2.input("p", (1,), "i32"),
                         g2.input("cos", (8, 2)), g2.input("sin", (8, 2))))
    with pytest.raises(ValueError, match="in place: pass out=<the cache"):
        Executor().compile(g2)


@pytest.mark.parametrize("T,K,norm", [(1, 520, False), (3, 520, True), (8, 2048, False), (5, 1030, True)])
def test_gemv_with_a_workgroup_per_output(T, K, norm, rng, monkeypatch, device):
    """MUL_MAT's GEMV with each output reduced by a whole workgroup (few outputs on a GPU), f32
    weights, 1 to 8 tokens per cluster, with and without the RMS norm folded in, K with and without a
    vec4 tail, against float64."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    N = 5
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    gn = rng.standard_normal(K).astype(np.float32)
    g = Graph()
    args = [g.input("x", (T, K)), g.const(w)] + ([g.const(gn)] if norm else [])
    g.output("y", g.op("MUL_MAT", *args, **({"rms_eps": 1e-6} if norm else {})))
    (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
    assert "LANES_WORKGROUP" in launch.defines and launch.spec[0] == mul_mat.gemv_workgroup_lanes(device, N, K) >= 64
    got = run_graph(g, x=x)["y"]
    ref = get_op("MUL_MAT").reference(x, w, *([gn] if norm else []), **({"rms_eps": 1e-6} if norm else {}))
    assert nmse(got, ref) <= 1e-10 and max_abs(got, ref) <= 1e-4 * np.abs(ref).max()


def test_gemv_workgroup_lanes_follow_the_outputs_and_the_device(tune, device, monkeypatch):
    """A workgroup per output only where outputs are too few to keep the spread of lanes busy in
    subgroup clusters; a power of two no larger than GEMV_WG_MAX, the device's workgroup limits and
    K / 8; never on CPU devices unless asked for."""
    gpu = dataclasses.replace(device.caps, type="discrete-gpu")
    monkeypatch.setattr(device, "caps", gpu)
    sg = gpu.subgroup.max_size
    assert mul_mat.gemv_workgroup_lanes(device, 512, 4096) == mul_mat.GEMV_WG_MAX
    assert mul_mat.gemv_workgroup_lanes(device, 4096, 8192) == (64 if sg < 64 else None)   # 2¹⁸ / 4096 lanes
    assert mul_mat.gemv_workgroup_lanes(device, 129280, 4096) is None        # the vocabulary head: subgroups
    assert mul_mat.gemv_workgroup_lanes(device, 5, 100) is None              # K / 8 = 12 lanes at most
    small = dataclasses.replace(gpu.limits, max_workgroup_invocations=96)
    monkeypatch.setattr(device, "caps", dataclasses.replace(gpu, limits=small))
    assert mul_mat.gemv_workgroup_lanes(device, 512, 4096) == (64 if sg < 64 else None)
    monkeypatch.setattr(device, "caps", dataclasses.replace(gpu, type="cpu"))
    assert mul_mat.gemv_workgroup_lanes(device, 512, 4096) is None
    tune({"gemv.spread": 1 << 18})
    assert mul_mat.gemv_workgroup_lanes(device, 512, 4096) == mul_mat.GEMV_WG_MAX
