"""V4_GATE (the router at one token in one dispatch) against its float64 reference and against
MUL_MAT (norm folded) then V4_ROUTE, fresh random inputs each run; tests/test_v4_gate.py runs these
in-process (subgroup 8) and at subgroup sizes 4 and 16 in subprocesses:

    LP_NATIVE_VECTOR_WIDTH=128 .venv/bin/python -m pytest -q tests/v4_gate_cases.py
"""
import numpy as np
import pytest

from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.tensor import DTYPES
from dsv4_vk.ops import get_op, v4_gate
from dsv4_vk.ops.moe import reference_v4_route, router_scores
from dsv4_vk.ops.v4_gate import gate_kernel, reference_gate_logits
from dsv4_vk.vk import default_device

EPS = 1e-6
CLEAR = 1e-4          # ranking margins (of score + bias) past f32 rounding: the ids must match float64's


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % (2 ** 32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def gate_inputs(rng, E, D, k, hashed, norm=True, wdtype="f32", V=40):
    """(arrays, params) of a V4_GATE: x [1, D] of rms ≈ 3, w [E, D] in wdtype, g, bias or the hash
    table and an id."""
    x = (rng.standard_normal((1, D)) * 3).astype(np.float32)
    w = (rng.standard_normal((E, D)) / np.sqrt(D) * 2).astype(DTYPES[wdtype])
    g = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    if hashed:
        sel = [np.stack([rng.permutation(E)[:k] for _ in range(V)]).astype(np.int32),
               rng.integers(0, V, 1).astype(np.int32)]
    else:
        sel = [(rng.standard_normal(E) * 0.1).astype(np.float32)]
    return [x, w] + ([g] if norm else []) + sel, {"top_k": k, "route_scale": 1.5, **({"rms_eps": EPS} if norm else {})}


def margin(logits, arrays, params, scoring):
    """The smallest gap between consecutive ranking values among the top k + 1 (inf for hash layers)."""
    if len(arrays) - ("rms_eps" in params) == 4:
        return np.inf
    v = np.sort(router_scores(logits, scoring)[0] + np.asarray(arrays[-1], np.float64))[::-1]
    return float(np.min(-np.diff(v[:params["top_k"] + 1]))) if len(v) > params["top_k"] else float(np.min(-np.diff(v)))


def check_routes(got, ref, clear):
    """Ids equal (where the ranking is clear), weights within f32 rounding, the shared expert last."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    if clear:
        assert np.array_equal(got[..., 0], ref[..., 0]), (got[..., 0], ref[..., 0])
    assert np.abs(got[..., 1] - ref[..., 1]).max() <= 1e-5 * max(1.0, np.abs(ref[..., 1]).max())
    assert tuple(got[0, -1]) == (ref[0, -1, 0], 1.0)


def run_gate(arrays, params):
    """(routes, logits, guard-damaged storages) of V4_GATE on consts."""
    g = Graph()
    ts = [g.const(a) for a in arrays]
    g.output("routes", g.op("V4_GATE", *ts, **params))
    g.output("logits", g.scratch(v4_gate.LOGITS))
    cg = Executor().compile(g)
    res = cg.run()
    return res["routes"], res["logits"], cg.check_guards()


@pytest.mark.parametrize("hashed", [False, True], ids=["bias", "hash"])
@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize("E,D,k,wdtype,norm", [(16, 64, 4, "f32", True), (256, 512, 8, "bf16", True),
                                              (100, 36, 6, "f16", True), (7, 8, 7, "f32", False),
                                              (33, 4, 2, "bf16", False)])
def test_v4_gate_against_float64(rng, hashed, scoring, E, D, k, wdtype, norm):
    """Routes and logits against float64: E not a multiple of the workgroup or of the rows a
    workgroup, k = E, D = 4 (one vec4 a row), f32, bf16 and f16 gates, with and without the norm."""
    arrays, params = gate_inputs(rng, E, D, k, hashed, norm, wdtype)
    params["scoring"] = scoring
    routes, logits, bad = run_gate(arrays, params)
    assert not bad, f"guards overwritten: {bad}"
    ref_lg = reference_gate_logits(arrays[0], arrays[1], arrays[2] if norm else None, EPS if norm else None)
    assert np.abs(logits - ref_lg[0]).max() <= 1e-5 * max(1.0, np.abs(ref_lg).max())
    ref = get_op("V4_GATE").reference(*arrays, **params)
    assert np.array_equal(ref, reference_v4_route(ref_lg, *arrays[2 + norm:3 + norm], *arrays[3 + norm:],
                                                  top_k=k, scoring=scoring, route_scale=1.5))
    check_routes(routes, ref, margin(ref_lg, arrays, params, scoring) > CLEAR)


@pytest.mark.parametrize("hashed", [False, True], ids=["bias", "hash"])
@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
def test_v4_gate_equals_mul_mat_then_v4_route(rng, hashed, scoring):
    """The same graph's two forms: V4_GATE and MUL_MAT (norm folded) then V4_ROUTE give the same
    routes (ids where the ranking is clear of both forms' rounding) and logits."""
    E, D, k = 64, 256, 6
    arrays, params = gate_inputs(rng, E, D, k, hashed, wdtype="bf16")
    params["scoring"] = scoring
    g = Graph()
    x, w, gw, *sel = (g.const(a) for a in arrays)
    g.output("fused", g.op("V4_GATE", x, w, gw, *sel, **params))
    g.output("fused_logits", g.scratch(v4_gate.LOGITS))
    lg = g.op("MUL_MAT", x, w, gw, rms_eps=EPS)
    g.output("logits", lg)
    g.output("apart", g.op("V4_ROUTE", lg, *sel, top_k=k, scoring=scoring, route_scale=1.5))
    cg = Executor().compile(g)
    res = cg.run()
    assert cg.check_guards() == []
    assert np.abs(res["fused_logits"] - res["logits"][0]).max() <= 1e-5 * np.abs(res["logits"]).max()
    check_routes(res["fused"], res["apart"], margin(res["logits"], arrays, params, scoring) > CLEAR)


@pytest.mark.parametrize("hashed", [False, True], ids=["bias", "hash"])
def test_one_program_replayed_with_new_inputs_routes_each_time(rng, hashed):
    """The ticket counter resets itself: the same program run 5 times with a new x (and a new token
    id) routes each time (a counter left at n would leave the last run's routes), and its zeroed
    pool is zero after every run."""
    E, D, k, V = 48, 128, 6, 40
    arrays, params = gate_inputs(rng, E, D, k, hashed, V=V)
    params["scoring"] = "sqrtsoftplus"
    g = Graph()
    x = g.input("x", (1, D))
    ids = g.input("ids", (1,), "i32") if hashed else None
    consts = [g.const(a) for a in arrays[1:4]]
    g.output("routes", g.op("V4_GATE", x, *consts, *([ids] if hashed else []), **params))
    g.output("counters", g.scratch(v4_gate.COUNTERS))
    cg = Executor().compile(g)
    seen = []
    for _ in range(5):
        xs = (rng.standard_normal((1, D)) * 3).astype(np.float32)
        feed = {"x": xs}
        if hashed:
            feed["ids"] = rng.integers(0, V, 1).astype(np.int32)
            arrays[4] = feed["ids"]
        res = cg.run(**feed)
        ref = get_op("V4_GATE").reference(xs, *arrays[1:], **params)
        ref_lg = reference_gate_logits(xs, arrays[1], arrays[2], EPS)
        check_routes(res["routes"], ref, margin(ref_lg, [xs] + arrays[1:], params, "sqrtsoftplus") > CLEAR)
        assert not res["counters"].any()
        seen.append(res["routes"][0, :k, 0].tolist())
    assert cg.check_guards() == [] and len({tuple(s) for s in seen}) > 1      # the routes changed


@pytest.mark.parametrize("rows,unroll,wg", [(1, 1, None), (3, 2, None), (8, 3, 256), (2, 8, 1)])
def test_v4_gate_launch_knobs(tune, rng, rows, unroll, wg):
    """Rows a workgroup (3 and 8: not dividing E = 100), vec4 steps loaded together (D/4 = 130 not a
    multiple) and the workgroup size (1: raised to the router's and the experts' own)."""
    tune({"v4_gate.rows": rows, "v4_gate.unroll": unroll, "v4_gate.wg": wg})
    arrays, params = gate_inputs(rng, 100, 520, 6, False)
    params["scoring"] = "sigmoid"
    g = Graph()
    g.op("V4_GATE", *(g.const(a) for a in arrays), **params)
    (launch,) = get_op("V4_GATE").lower(g.nodes[-1], default_device())
    assert launch.spec[1:] == (6, rows, unroll)
    own = v4_gate.route_workgroup(default_device(), 100)          # the router's workgroup; ranking: ≥ 128
    assert launch.spec[0] == max(wg or (own if default_device().caps.is_cpu else 256), own, 128)
    assert launch.grid[0] == -(-100 // rows)
    routes, logits, bad = run_gate(arrays, params)
    assert not bad
    ref_lg = reference_gate_logits(*arrays[:3], EPS)
    assert np.abs(logits - ref_lg[0]).max() <= 1e-5 * np.abs(ref_lg).max()
    check_routes(routes, get_op("V4_GATE").reference(*arrays, **params), margin(ref_lg, arrays, params, "sigmoid") > CLEAR)


def test_v4_gate_ties_and_nan_rank_as_v4_route(rng):
    """Equal ranking values go to the lower id and a NaN logit (a NaN in its gate row) ranks after
    every number, as in V4_ROUTE: four equal gate rows with the same large bias come first in id
    order, and the NaN expert is never picked, even with the largest bias."""
    E, D, k = 32, 16, 5
    arrays, params = gate_inputs(rng, E, D, k, False)
    w, bias = arrays[1], arrays[3]
    w[[3, 9, 20]] = w[30]                 # four equal logits
    bias[[3, 9, 20, 30]] = 100.0          # ranked first, in id order
    w[7, 5] = np.nan
    bias[7] = 1000.0
    params["scoring"] = "sqrtsoftplus"
    routes, logits, bad = run_gate(arrays, params)
    assert not bad and np.isnan(logits[7]) and routes[0, :4, 0].tolist() == [3, 9, 20, 30]
    with np.errstate(invalid="ignore"):
        ref = get_op("V4_GATE").reference(*arrays, **params)
    assert 7 not in routes[0, :, 0]
    check_routes(routes, ref, True)


def test_where_the_fused_router_runs(tune, monkeypatch):
    """gate_kernel's word: fused at one token up to 256 experts (any count hashed); else why not."""
    dev = default_device()
    assert gate_kernel(dev, 1, 256, False).kernel == "fused"
    assert gate_kernel(dev, 1, 1000, True).kernel == "fused"
    assert gate_kernel(dev, 2, 256, False).reason == "T = 2 tokens: V4_GATE routes one token (decode)"
    assert "more than the one-pass ranking takes" in gate_kernel(dev, 1, 257, False).reason
    assert gate_kernel(dev, 1, 16, False, "why not").reason == "why not"
    from dsv4_vk.ops import moe
    monkeypatch.setattr(moe, "route_workgroup", lambda device, n: None)
    monkeypatch.setattr(v4_gate, "route_workgroup", lambda device, n: None)
    assert "lacks the subgroup operations" in gate_kernel(dev, 1, 16, True).reason
    monkeypatch.undo()
    tune({"route_rank.on": False})
    assert gate_kernel(dev, 1, 16, False).reason == "route_rank.on is off"
    assert gate_kernel(dev, 1, 16, True).kernel == "fused"
    tune({"v4_gate.on": False})
    assert gate_kernel(dev, 1, 16, True).reason == "v4_gate.on is off"
    from dsv4_vk.cli.info import _human, report
    assert "V4_GATE       one token, 256 experts × 4096: MUL_MAT then V4_ROUTE — v4_gate.on is off" in _human(report(dev))
    tune({"v4_gate.on": True, "route_rank.on": True})
    assert "V4_GATE       one token, 256 experts × 4096: one dispatch, " in _human(report(dev))


def _build(arrays, params, offset=0):
    g = Graph()
    ts = [g.const(a) for a in arrays]
    if offset:
        x = g.const(np.zeros(arrays[0].size + offset, np.float32))
        ts[0] = x[offset:].reshape(*arrays[0].shape)
    g.op("V4_GATE", *ts, **params)
    return g


def z(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


@pytest.mark.parametrize("arrays,params,msg", [
    ([z(2, 8), z(4, 8), z(4)], {"top_k": 2}, r"x \(input 0, \[1, D\]: one token\) must be f32 \[1, \*\], got f32 \[2, 8\]"),
    ([z(1, 6), z(4, 6), z(4)], {"top_k": 2}, "D = 6 is not a multiple of 4"),
    ([z(1, 8), z(300, 8), z(300)], {"top_k": 2}, "the bias top-k ranks at most 256 experts, got 300"),
    ([z(1, 8), z(4, 8, dtype=np.int32), z(4)], {"top_k": 2}, r"w \(input 1\) must be one of .* got i32"),
    ([z(1, 8), z(4, 8), z(4)], {"top_k": 5}, r"top_k must be an integer in \[1, 4\]"),
    ([z(1, 8), z(4, 8), z(4)], {"top_k": 2, "scoring": "relu"}, "scoring must be one of"),
    ([z(1, 8), z(4, 8), z(8), z(4)], {"top_k": 2, "rms_eps": -1.0}, "rms_eps must be a finite number ≥ 0"),
    ([z(1, 8), z(4, 8), z(8), z(4)], {"top_k": 2}, r"4 inputs without rms_eps= are \(x, w, tid2eid, ids\); a norm weight g"),
    ([z(1, 8), z(4, 8), z(8), z(4), z(4)], {"top_k": 2}, r"takes \(x, w, bias\) or \(x, w, tid2eid, ids\) \(g: with rms_eps=\), got 5"),
    ([z(1, 8), z(4, 8), z(4, 2, dtype=np.int32), z(2, dtype=np.int32)], {"top_k": 2}, r"ids \(input 3, \[1\]\)"),
    ([z(1, 8), z(4, 8), z(4, 3, dtype=np.int32), z(1, dtype=np.int32)], {"top_k": 2}, r"tid2eid \(input 2, \[vocab, top_k\]\)"),
    ([z(1, 8), z(4, 8), z(4)], {"top_k": 2, "norm": True}, "norm"),
])
def test_bad_inputs_are_refused(arrays, params, msg):
    with pytest.raises(ValueError, match=msg):
        _build(arrays, params)


def test_misaligned_x_and_a_device_it_cannot_run_on_are_refused(tune):
    with pytest.raises(ValueError, match="x not at a multiple of 4 elements"):
        _build([z(1, 8), z(4, 8), z(4)], {"top_k": 2}, offset=1)
    tune({"route_rank.on": False})
    g = _build([z(1, 8), z(4, 8), z(4)], {"top_k": 2})
    with pytest.raises(ValueError, match=r"V4_GATE cannot run here: route_rank.on is off \(use MUL_MAT then V4_ROUTE\)"):
        Executor().compile(g)
    tune({"route_rank.on": True, "v4_gate.rows": 9})
    with pytest.raises(ValueError, match=r"'v4_gate.rows' must be None or an integer in \[1, 8\], got 9"):
        Executor().compile(_build([z(1, 8), z(4, 8), z(4)], {"top_k": 2}))


@pytest.mark.parametrize("op", ["V4_ROUTE", "V4_GATE"])
def test_sqrtsoftplus_of_very_negative_logits_keeps_its_precision(rng, op):
    """softplus(x) = log(1 + e^x) for x ≪ 0 is about e^x: formed as log(1 + e^x) in f32 it keeps
    only a few digits (1 + 4.5e-5 rounds to 1 ± 6e-8), and a hash layer, which picks whatever its
    table says, weights such experts by their ratio. Logits in [−16, −6]: weights within 1e-5."""
    E, D, k, V = 16, 8, 4, 8
    arrays, params = gate_inputs(rng, E, D, k, True, norm=False, V=V)
    x = np.full((1, D), 1.0, np.float32)
    w = np.zeros((E, D), np.float32)
    w[:, 0] = rng.uniform(-16, -6, E).astype(np.float32)         # logit e = w[e, 0] exactly
    params["scoring"] = "sqrtsoftplus"
    if op == "V4_GATE":
        routes, _, bad = run_gate([x, w] + arrays[2:], params)
    else:
        g = Graph()
        ts = [g.const(a) for a in [x @ w.T] + arrays[2:]]
        g.output("r", g.op("V4_ROUTE", *ts, **params))
        cg = Executor().compile(g)
        routes, bad = cg.run()["r"], cg.check_guards()
    assert not bad
    check_routes(routes, reference_v4_route(x @ w.T, *arrays[2:], top_k=k, scoring="sqrtsoftplus", route_scale=1.5),
                 True)
