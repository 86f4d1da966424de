"""DeepSeek-V4 kernels against their float64 references, fresh random inputs each run: the cases
tests/test_v4_ops.py runs in-process (subgroup 8 here) and in subprocesses at subgroup sizes 4
and 16 (LP_NATIVE_VECTOR_WIDTH=128 / 512):

    LP_NATIVE_VECTOR_WIDTH=512 .venv/bin/python -m pytest -q tests/v4_ops_cases.py
"""
import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.ops import compress, get_op
from dsv4_vk.ops.rope import rope_table

NMSE_MAX = 1e-10


def nmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b * b), 1e-300))


def run(name, arrays, params, inplace=False):
    """Run op `name` on arrays (consts; int32 stay int32) in a graph; (device result, float64
    reference, guard-damaged storages). inplace: the op writes arrays[0] (out=)."""
    g = Graph()
    ts = [g.const(a) for a in arrays]
    out = g.op(name, *ts, out=ts[0] if inplace else None, **params)
    g.output("out", out)
    ex = Executor()
    cg = ex.compile(g)
    got = cg.run()["out"]
    ref = get_op(name).reference(*arrays, **params)
    return got, ref, cg.check_guards()


def check(got, ref, bad, nmse_max=NMSE_MAX, atol=1e-5):
    assert not bad, f"guards overwritten: {bad}"
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref)
    assert nmse(got[fin], ref[fin]) <= nmse_max
    assert np.abs(got[fin] - ref[fin]).max(initial=0.0) <= atol * max(1.0, np.abs(ref[fin]).max(initial=0.0))


@pytest.fixture
def rng():
    seed = np.random.SeedSequence().entropy % (2 ** 32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def tables(rng, capacity, half):
    cos, sin = rope_table(rng.uniform(0.01, 1.0, half), capacity)
    return cos.astype(np.float32), sin.astype(np.float32)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("T,H,n,half,p0", [(1, 1, 8, 4, 0), (5, 3, 32, 4, 7), (7, 2, 16, 8, 60), (3, 4, 10, 2, 62)])
def test_rope(rng, T, H, n, half, p0, inverse):
    cos, sin = tables(rng, 64, half)
    got, ref, bad = run("ROPE", [f32(rng, T, H, n), np.array([p0], np.int32), cos, sin], {"inverse": inverse})
    check(got, ref, bad)                         # p0 = 62, T = 3: the last row is past capacity -> NaN


@pytest.mark.parametrize("T,n,p0,rows,capacity", [(1, 8, 5, 32, 32), (9, 33, 0, 32, 32), (4, 16, 30, 32, 32),
                                                   (7, 8, 29, 10, 40), (3, 5, 38, 6, 40)])
def test_store_rows(rng, T, n, p0, rows, capacity):
    """rows < capacity: a ring (positions 29..35 wrap around 10 rows; 38..40 run past the capacity)."""
    arrays = [f32(rng, rows, n), f32(rng, T, n), np.array([p0], np.int32)]
    got, ref, bad = run("STORE_ROWS", arrays, {"capacity": capacity}, inplace=True)
    check(got, ref, bad, nmse_max=0, atol=0)
    assert (got != arrays[0]).any(axis=1).sum() == min(T, max(0, capacity - p0))


@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("T,n,half,p0,rows,capacity", [(1, 512, 32, 5, 143, 64), (7, 8, 2, 29, 10, 40),
                                                        (3, 300, 4, 38, 6, 40), (16, 64, 8, 0, 20, 48)])
def test_rms_norm_into_a_ring(rng, weight, T, n, half, p0, rows, capacity):
    """RMS_NORM rope=True ring=True: the normalised, rotated rows stored at their positions' rows of
    a ring (positions 29..35 wrap around 10 rows; 38..40 run past the capacity and are not stored),
    every other row untouched — against RMS_NORM then STORE_ROWS in float64. The tables are longer
    than the capacity, which alone bounds the stores; n = 512 at T = 1 takes a workgroup per row."""
    cos, sin = tables(rng, capacity + 4, half)
    dst = f32(rng, rows, n)
    ins = [f32(rng, T, n, scale=3.0)] + ([1 + 0.3 * f32(rng, n)] if weight else []) + [
        np.array([p0], np.int32), cos, sin, dst]
    prm = {"eps": 1e-6, "rope": True, "ring": True, "capacity": capacity}
    g = Graph()
    ts = [g.const(a) for a in ins]
    g.output("out", g.op("RMS_NORM", *ts, out=ts[-1], **prm))
    cg = Executor().compile(g)
    got = cg.run()["out"]
    check(got, get_op("RMS_NORM").reference(*ins, **prm), cg.check_guards())
    assert (got != dst).any(axis=1).sum() == min(T, max(0, capacity - p0))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("rate,d,half,T,p0,rows", [(4, 16, 4, 13, 0, 48), (4, 32, 8, 1, 11, 48), (8, 8, 2, 24, 5, 48),
                                                   (3, 130, 4, 7, 2, 48), (4, 16, 4, 6, 30, 13), (8, 8, 2, 1, 39, 16),
                                                   (4, 520, 8, 5, 3, 48)])
def test_compress(rng, overlap, rate, d, half, T, p0, rows):
    """rows < 48: the state is a ring of the last `rows` positions."""
    C = 48
    W = 2 * d if overlap else d
    cos, sin = tables(rng, C, half)
    ent = f32(rng, C // rate, d)
    arrays = [ent, f32(rng, rows, 2 * W), f32(rng, rate, W), (1 + 0.3 * f32(rng, d)), np.array([p0], np.int32), cos, sin]
    got, ref, bad = run("COMPRESS", arrays, {"rate": rate, "overlap": overlap, "eps": 1e-6, "tokens": T}, inplace=True)
    check(got, ref, bad)
    assert (got != ent).any(axis=1).sum() == sum((p + 1) % rate == 0 for p in range(p0, p0 + T))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("rate,d,half,T,p0,rows", [(4, 16, 4, 13, 0, 48), (4, 32, 8, 1, 11, 48), (8, 8, 2, 24, 5, 39),
                                                   (3, 130, 4, 7, 2, 12), (4, 16, 4, 6, 30, 13), (8, 8, 2, 1, 47, 16),
                                                   (4, 520, 8, 5, 3, 48)])
@pytest.mark.parametrize("wg", [256, 32, 1])
def test_compress_storing_the_chunk(tune, rng, monkeypatch, wg, overlap, rate, d, half, T, p0, rows):
    """COMPRESS given the chunk's projections xs: it stores them into the state ring (as STORE_ROWS,
    positions past the capacity not at all) and pools this chunk's positions from xs — the entries
    and the state against STORE_ROWS then COMPRESS in float64; rings of exactly the rows the
    overlap needs (39 = 2·8 + 24 − 1, 13 = 2·4 + 6 − 1: wrapping within the chunk). Workgroups of
    256 (d = 520: three channels a lane), 32 and 1 invocations (the cap COMPRESS_WG)."""
    tune({"compress.wg": wg})
    C = 48
    W = 2 * d if overlap else d
    cos, sin = tables(rng, C, half)
    ent, st, xs = f32(rng, C // rate, d), f32(rng, rows, 2 * W), f32(rng, T, 2 * W)
    consts = [ent, None, f32(rng, rate, W), (1 + 0.3 * f32(rng, d)), np.array([p0], np.int32), cos, sin, xs]
    prm = {"rate": rate, "overlap": overlap, "eps": 1e-6, "tokens": T}
    g = Graph()
    ts = [g.const(a) if a is not None else g.param("state", st.shape) for a in consts]
    g.output("out", g.op("COMPRESS", *ts, out=ts[0], **prm))
    ex = Executor()
    ex.set_param("state", st)
    cg = ex.compile(g)
    got = cg.run()["out"]
    op = get_op("COMPRESS")
    check(got, op.reference(ent, st, *consts[2:], **prm), cg.check_guards())
    check(ex.params["state"].read(), op.reference_state(st, xs, consts[4], cos), [], nmse_max=0, atol=0)
    assert (got != ent).any(axis=1).sum() == sum((p + 1) % rate == 0 for p in range(p0, min(p0 + T, C)))


def test_compress_workgroup_cap(tune, monkeypatch):
    """COMPRESS's workgroup: the largest power of two within the cap, 256 and the device's limits; a
    cap below 1 is refused by name."""
    dev = Executor().device
    for cap, want in ((256, 256), (300, 256), (100, 64), (1, 1)):
        tune({"compress.wg": cap})
        assert compress.compress_workgroup(dev) == min(want, dev.caps.limits.max_workgroup_invocations)
    tune({"compress.wg": 0})
    with pytest.raises(ValueError, match=r"tuning knob 'compress.wg' must be at least 1, got 0"):
        compress.compress_workgroup(dev)


def test_compress_storing_the_chunk_refuses_what_it_cannot_write():
    """With xs COMPRESS writes the state: a constant state, or a ring too small for a chunk's rows
    beside those its windows read back, is refused by name."""
    arrays = [np.zeros((12, 8), np.float32), np.zeros((11, 32), np.float32), np.zeros((4, 16), np.float32),
              np.ones(8, np.float32), np.zeros(1, np.int32), np.zeros((48, 2), np.float32),
              np.zeros((48, 2), np.float32), np.zeros((5, 32), np.float32)]
    prm = {"rate": 4, "overlap": True, "eps": 1e-6, "tokens": 5}
    with pytest.raises(ValueError, match=r"with xs writes the state \(input 1\): pass a tensor made with"):
        _graph_error("COMPRESS", arrays, prm, True)
    g = Graph()
    ts = [g.const(a) if i != 1 else g.param("state", a.shape) for i, a in enumerate(arrays)]
    with pytest.raises(ValueError, match=r"the state ring needs 12 rows \(the 8 a window reads back and the 5 a "
                                         r"chunk writes\), got 11"):
        g.op("COMPRESS", *ts, out=ts[0], **prm)


@pytest.mark.parametrize("kernel,heads", [("cluster", None), ("cluster", 1), ("cluster", 3), ("entry", None)])
@pytest.mark.parametrize("T,nh,hd,n,rate,p0", [(1, 16, 16, 9, 4, 37), (6, 4, 32, 12, 4, 3), (3, 64, 128, 300, 4, 1000),
                                               (2, 7, 20, 30, 4, 90), (1, 5, 8, 11, 4, 45), (2, 3, 18, 25, 4, 80),
                                               (1, 8, 64, 700, 2, 1203)])
def test_index_score(tune, rng, monkeypatch, kernel, heads, T, nh, hd, n, rate, p0):
    """kernel: a cluster of lanes an entry, or an invocation an entry with q staged in shared memory
    (LANE_ENTRY, where hd % 4 == 0 and q fits shared memory: hd = 18 falls back to the cluster
    kernel, and so does nh·hd = 8192 on lavapipe's 32 KB; n = 700 spans several workgroups of
    entries). heads: heads per step of the cluster-sum kernel (None: the default,
    SCATTER where the device has shuffles: LANES heads a step, e.g. 2 lanes at hd = 8 with 5 heads,
    the last step past the heads; 3: a last step past the heads)."""
    tune({"index_score.heads": heads, "index_score.cpu": kernel, "index_score.gpu": kernel})
    arrays = [f32(rng, T, nh, hd), f32(rng, T, nh), f32(rng, n, hd), np.array([p0], np.int32)]
    g = Graph()
    g.op("INDEX_SCORE", *(g.const(a) for a in arrays), rate=rate, scale=0.5, capacity=4096)
    dev = Executor().device
    (launch,) = g.nodes[-1].op.lower(g.nodes[-1], dev)
    fits = 4 * nh * hd + 4 * nh + 64 <= dev.caps.limits.max_shared_memory     # q and wt staged
    assert ("LANE_ENTRY" in launch.defines) == (kernel == "entry" and hd % 4 == 0 and fits)
    got, ref, bad = run("INDEX_SCORE", arrays, {"rate": rate, "scale": hd ** -0.5 * nh ** -0.5, "capacity": 4096})
    closed = np.isfinite(ref)                       # the rest of a row is left unwritten (TOPK never reads it)
    assert closed.sum() == sum(min((p0 + t + 1) // rate, n) for t in range(T))
    check(got[closed], ref[closed], bad)


@pytest.mark.parametrize("pad,entry", [(1, False), (4, True)])
def test_index_score_over_views(tune, rng, pad, entry):
    """q and k as views into larger storages, `pad` elements in: 1 (rows off 16 bytes: the cluster
    kernel) or 4 (16-byte aligned offsets and strides: the entry kernel reads them in place); against
    float64 over the closed entries."""
    tune({"index_score.cpu": "entry", "index_score.gpu": "entry"})
    T, nh, hd, n, rate, p0 = 2, 6, 16, 90, 2, 150
    q, wt, k = f32(rng, T, nh, hd + pad), f32(rng, T, nh), f32(rng, n, hd + pad)
    g = Graph()
    qv, kv = g.const(q)[:, :, pad:], g.const(k)[:, pad:]
    g.output("s", g.op("INDEX_SCORE", qv, g.const(wt), kv, g.const(np.array([p0], np.int32)), rate=rate, scale=0.5,
                       capacity=4096))
    (launch,) = g.nodes[-1].op.lower(g.nodes[-1], Executor().device)
    assert ("LANE_ENTRY" in launch.defines) == entry
    cg = Executor().compile(g)
    got = cg.run()["s"]
    ref = get_op("INDEX_SCORE").reference(q[:, :, pad:], wt, k[:, pad:], np.array([p0], np.int32), rate=rate,
                                          scale=0.5, capacity=4096)
    closed = np.isfinite(ref)
    assert closed.sum() == sum(min((p0 + t + 1) // rate, n) for t in range(T))
    check(got[closed], ref[closed], cg.check_guards())


# every TOPK bin scan (shaders/topk.comp), with the first digit of the key's bits or (+spread) of
# the row's score range: each case at each
# the three scans, and the spread first digit with one of them: every code path of the shader
SCANS = ["groups", "subgroup", "fused+spread"]


def topk_scan(scan):
    """The tuning with TOPK's bin scan (and first digit, "+spread") set to scan on every device type,
    as a context (hypothesis tests cannot take fixtures)."""
    name, _, spread = scan.partition("+")
    return tuned({"topk_scan.gpu": name, "topk_scan.cpu": name, "topk_spread.gpu": bool(spread),
                  "topk_spread.cpu": bool(spread)})


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("T,n,k", [(1, 9, 4), (5, 300, 100), (2, 70, 512), (3, 1000, 65), (2, 2500, 300)])
def test_topk(rng, scan, T, n, k):
    s = f32(rng, T, n)
    s[:, rng.integers(0, n, n // 5)] = -np.inf                     # masked entries
    s[0, :3] = s[0, 3]                                             # ties go to the lower index
    s[-1, rng.integers(0, n, 2)] = [np.nan, np.inf]                # never ranked, never ahead of a finite one
    with topk_scan(scan):
        got, ref, bad = run("TOPK", [s], {"k": k})
    assert not bad and np.array_equal(got, ref)


def topk_scores(rng, T, n, levels, specials):
    """Scores [T, n] with many ties (values from `levels` distinct ones, zeros among them as the
    indexer's ReLU sums give, −0 beside +0) and `specials` entries per row set to NaN, ±inf."""
    s = rng.integers(-levels, levels + 1, (T, n)).astype(np.float32) / 4
    s[s == 0] *= np.where(rng.random(int((s == 0).sum())) < 0.5, -1.0, 1.0).astype(np.float32)
    for t in range(T):
        w = rng.integers(0, n, specials)
        s[t, w] = rng.choice([np.nan, np.inf, -np.inf], specials)
    return s


def run_topk(s, k, pos=None, rate=1, capacity=None, tile=None, sorted=True):
    """compress.topk's device result for scores s (one TOPK, or TOPK_TILES + TOPK where s's rows span
    several tiles) and its guard-damaged storages."""
    g = Graph()
    bound = g.const(np.array([pos], np.int32)) if pos is not None else None
    g.output("i", compress.topk(g, g.const(s), k, pos=bound, rate=rate, capacity=capacity, tile=tile, sorted=sorted))
    cg = Executor().compile(g)
    return cg.run()["i"], cg.check_guards()


@pytest.mark.parametrize("scan", SCANS)
@settings(max_examples=5, deadline=None, database=None)
@given(T=st.integers(1, 5), n=st.integers(1, 700), k=st.integers(1, 300), tile=st.sampled_from([None, 1, 7, 64, 256]),
       levels=st.sampled_from([0, 2, 50, 10 ** 6]), specials=st.integers(0, 5), pos=st.integers(-3, 3000),
       rate=st.sampled_from([1, 2, 4, 128]), capacity=st.sampled_from([50, 1 << 20]), seed=st.integers(0, 2 ** 31),
       ordered=st.booleans())
def test_topk_over_each_rows_causal_entries_matches_float64(scan, T, n, k, tile, levels, specials, pos, rate, capacity,
                                                            seed, ordered):
    """The indexer's top-k: row t of a chunk at pos ranks only its closed entries w < (p + 1)/rate
    (none for p outside [0, capacity)); ties (levels 0: every score equal) go to the lower index, −0
    ties with +0, NaN and ±inf are never selected, k past the selectable entries pads −1. Rows one
    tile (one TOPK) or many (TOPK_TILES, then TOPK merging the tiles' candidates, tiles of 1 to 256
    entries), by descending score or (sorted=False) in entry order, against reference_topk."""
    rng = np.random.default_rng(seed)
    s = topk_scores(rng, T, n, levels, specials)
    with topk_scan(scan):
        got, bad = run_topk(s, k, pos, rate, capacity, tile, ordered)
    assert not bad
    np.testing.assert_array_equal(got, compress.reference_topk(s, k, np.array([pos]), rate, capacity, ordered))


@pytest.mark.parametrize("scan", SCANS)
@settings(max_examples=3, deadline=None, database=None)
@given(T=st.integers(1, 3), n=st.integers(1, 3000), k=st.sampled_from([1, 16, 512]), tile=st.sampled_from([None, 100, 512]),
       seed=st.integers(0, 2 ** 31))
def test_topk_without_a_bound_ranks_every_entry(scan, T, n, k, tile, seed):
    """Without pos every entry of the row is ranked (reference: NaN, ±inf never selected)."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((T, n)).astype(np.float32)
    s[:, rng.integers(0, n, n // 7)] = -np.inf
    s[:, rng.integers(0, n, n // 7)] = s[0, 0]                         # a tied value
    with topk_scan(scan):
        got, bad = run_topk(s, k, tile=tile)
    assert not bad
    np.testing.assert_array_equal(got, compress.reference_topk(s, k))


@pytest.mark.parametrize("wg,bits,staged,scan", [(64, 4, 1, s) for s in SCANS] + [(256, 11, 3, s) for s in SCANS] +
                         [(32, 12, 1, s) for s in SCANS] + [(1024, 11, None, s) for s in SCANS[1::2]] +
                         [(16, 8, None, "groups"), (128, 7, 50, "groups"), (16, 8, None, "fused+spread"), (8, 8, None, "fused"),
                          (128, 7, 50, "subgroup+spread")])
def test_topk_at_any_workgroup_digit_width_and_staging(tune, scan, wg, bits, staged):
    """TOPK's knobs: workgroups smaller and larger than k (ranks counted whole or in parts), digits
    of 4 to 12 bits (digits across the key's two words, the index's digits where scores tie), and
    the K-th bin's keys staged in shared memory or, past `staged` of them, selected by passes over
    the list itself; ties, NaN, ±inf and −1 padding, one tile or many."""
    tune({"topk_wg.cpu": wg, "topk_wg.gpu": wg, "topk_bits.cpu": bits, "topk_bits.gpu": bits, "topk_staged.keys": staged})
    rng = np.random.default_rng(bits)
    for levels, k, tile, ordered in ((3, 40, None, True), (10 ** 6, 100, 64, True), (0, 7, None, True),
                                     (3, 40, None, False), (10 ** 6, 100, 64, False)):
        s = topk_scores(rng, 3, 500, levels, 4)
        with topk_scan(scan):
            got, bad = run_topk(s, k, 1203, 4, 1 << 20, tile, ordered)      # rows see 301..301 of 500 entries
        assert not bad
        np.testing.assert_array_equal(got, compress.reference_topk(s, k, np.array([1203]), 4, 1 << 20, ordered))


@pytest.mark.parametrize("groups", [1, 3, 1000])
def test_index_score_and_topk_tiles_with_any_workgroups_per_row(tune, rng, monkeypatch, groups):
    """INDEX_SCORE's blocks and TOPK_TILES's tiles shared among `groups` workgroups per row (each
    looping over its blocks below the row's bound; 1000: one block each, as on a GPU)."""
    tune({"row_groups.cpu": groups})
    tune({"row_groups.gpu": groups})
    T, nh, hd, n, rate, p0 = 3, 8, 16, 700, 2, 900                     # rows see 450..451 of 700 entries
    arrays = [f32(rng, T, nh, hd), f32(rng, T, nh), f32(rng, n, hd), np.array([p0], np.int32)]
    got, ref, bad = run("INDEX_SCORE", arrays, {"rate": rate, "scale": 0.25, "capacity": 4096})
    closed = np.isfinite(ref)
    check(got[closed], ref[closed], bad)
    s = np.where(closed, ref, np.float32(1e30)).astype(np.float32)    # past the bound: never read
    got, bad = run_topk(s, 40, p0, rate, 4096, tile=16)
    assert not bad
    np.testing.assert_array_equal(got, compress.reference_topk(ref, 40, np.array([p0]), rate, 4096))


def test_the_grids_of_index_score_and_topk_tiles_do_not_grow_with_the_capacity():
    """Recorded once for the cache's capacity n, INDEX_SCORE and TOPK_TILES launch at most
    ROW_GROUPS workgroups per row (each looping over the blocks below its row's bound), so a
    thousand-fold larger cache launches no more workgroups; TOPK's merge, one per row."""
    dev = Executor().device
    cap = compress.ROW_GROUPS["cpu" if dev.caps.is_cpu else "gpu"]
    grids = {}
    for n in (1 << 24, 1 << 28):
        g = Graph()
        pos = g.const(np.array([5000], np.int32))
        s = g.op("INDEX_SCORE", g.const(np.zeros((3, 4, 16), np.float32)), g.const(np.zeros((3, 4), np.float32)),
                 g.param("keys", (n, 16)), pos, rate=4, scale=0.5, capacity=4 * n)
        compress.topk(g, s, 64, pos=pos, rate=4, capacity=4 * n)
        grids[n] = {node.op.name: [lc.grid[0] * lc.grid[1] * lc.grid[2] for lc in node.op.lower(node, dev)]
                    for node in g.nodes}
    assert grids[1 << 24] == grids[1 << 28]
    assert grids[1 << 28] == {"INDEX_SCORE": [3 * cap], "TOPK_TILES": [3 * cap], "TOPK": [3]}


def test_topk_reads_only_the_entries_that_exist():
    """Scores past every row's bound (the cache's capacity not yet filled) are never read: the
    highest scores placed there change nothing, in one tile or in many."""
    rng = np.random.default_rng(3)
    n, pos, rate = 4096, 1001, 4                                        # rows see 250..252 entries
    s = rng.standard_normal((3, n)).astype(np.float32)
    ref = compress.reference_topk(s, 64, np.array([pos]), rate, 1 << 20)
    s[:, 253:] = 1e30
    for tile in (None, 100):
        got, bad = run_topk(s, 64, pos, rate, 1 << 20, tile)
        assert not bad and np.array_equal(got, ref)


@pytest.mark.parametrize("mode,T,H,hd,p0,window,rate,splits,rows", [
    ("sliding", 5, 4, 32, 0, 8, 1, 1, 64), ("sliding", 1, 2, 64, 40, 8, 1, 1, 64), ("hca", 7, 3, 32, 30, 8, 8, 1, 64),
    ("csa", 4, 4, 16, 20, 6, 4, 1, 64), ("hca", 1, 4, 32, 60, 8, 4, 4, 64), ("csa", 1, 2, 48, 63, 8, 4, 3, 64),
    ("sliding", 1, 2, 16, 63, 128, 1, 5, 64), ("sliding", 6, 2, 16, 30, 8, 1, 1, 13), ("csa", 3, 2, 16, 61, 6, 4, 2, 8)])
@pytest.mark.parametrize("kernel,keys,tile,literal", [
    ("cluster", None, None, False), ("cluster", 1, None, False), ("cluster", 3, None, False),
    ("tiled", None, None, False), ("tiled", None, 3, False), ("cluster", 3, None, True), ("tiled", None, 3, True)])
def test_mqa_attention(tune, rng, monkeypatch, kernel, keys, tile, literal, mode, T, H, hd, p0, window, rate, splits, rows,
                       q_norm=False):
    """rows < 64: kv is a ring of the last `rows` positions (≥ window + T − 1); the last case runs
    past the capacity 64 (NaN rows). keys: keys per step of the cluster kernel (None: its default;
    3: a last step part past the list, CSA's −1 entries inside steps); tile: keys per staged tile of
    the tiled kernel (3: several tiles per split, a partial last one); literal: the per-lane arrays
    with literal sizes where they fit. q_norm: q as the projection wrote it (scaled up), normalised
    per head and rotated as it is loaded."""
    tune({"mqa.keys": keys})
    tune({"mqa_arrays.literal": literal})
    if tile is not None:
        tune({"mqa_tile.keys": tile})
    C = 64
    n_ent = C // rate
    arrays = [f32(rng, T, H, hd), f32(rng, rows, hd), np.array([p0], np.int32), f32(rng, H)]
    if mode != "sliding":
        arrays.append(f32(rng, n_ent, hd))
    if mode == "csa":
        idx = np.stack([rng.permutation(n_ent)[:6] for _ in range(T)]).astype(np.int32)
        idx[:, -2:] = -1
        idx[:, 0] = np.minimum(idx[:, 0], (p0 + 1) // rate - 1)
        arrays.append(idx)
    prm = {"scale": hd ** -0.5, "window": window, "mode": mode, "rate": rate, "capacity": C}
    if q_norm:
        arrays[0] *= 7.0
        arrays += list(tables(rng, C + 3, min(hd // 2, 6)))
        prm["q_norm_eps"] = 1e-6
    want = get_op("MQA_ATTENTION").reference(*arrays, **prm)
    g = Graph()
    ts = [g.const(a) for a in arrays]
    out = g.op("MQA_ATTENTION", *ts, splits=splits, kernel=kernel, **prm)
    if splits > 1:
        part = out
        out = g.op("MQA_COMBINE", part, ts[3], splits=splits)
        ang = rng.uniform(-np.pi, np.pi, (C, min(hd // 2, 5)))     # and with the output's RoPE removed
        out_tables = [np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)]
        g.output("rot", g.op("MQA_COMBINE", part, ts[3], ts[2], *map(g.const, out_tables), splits=splits, rope=True))
    g.output("out", out)
    cg = Executor().compile(g)
    got = cg.run()
    check(got["out"], want, cg.check_guards())
    if splits > 1:
        check(got["rot"], get_op("ROPE").reference(want, arrays[2], *out_tables, inverse=True), cg.check_guards())


@pytest.mark.parametrize("kernel,tile", [("cluster", None), ("tiled", None), ("tiled", 3)])
@pytest.mark.parametrize("case", [("csa", 1, 3, 48, 63, 8, 4, 3, 64), ("hca", 7, 3, 32, 30, 8, 8, 1, 64),
                                  ("sliding", 6, 2, 16, 30, 8, 1, 1, 13), ("sliding", 1, 2, 16, 63, 128, 1, 5, 64)])
def test_mqa_attention_normalises_and_rotates_q(tune, rng, monkeypatch, kernel, tile, case):
    """q_norm_eps: q's per-head RMS norm and RoPE as the attention loads it, against RMS_NORM then
    ROPE then the attention in float64 (split lists, a ring, positions past the capacity)."""
    test_mqa_attention(tune, rng, monkeypatch, kernel, None, tile, kernel == "tiled", *case, q_norm=True)


def mqa_case_arrays(rng, mode, T, H, hd, p0, rows, rate, C, tables_half):
    """Fresh inputs of one MQA_ATTENTION case: q (as the projection wrote it), kv, pos, sinks[, ent
    [, idx with −1 slots]], cos, sin."""
    n_ent = C // rate
    arrays = [f32(rng, T, H, hd, scale=7.0), f32(rng, rows, hd), np.array([p0], np.int32), f32(rng, H)]
    if mode != "sliding":
        arrays.append(f32(rng, n_ent, hd))
    if mode == "csa":
        idx = np.stack([rng.permutation(n_ent)[:6] for _ in range(T)]).astype(np.int32)
        idx[:, -2:] = -1
        idx[:, 0] = np.minimum(idx[:, 0], max((p0 + 1) // rate - 1, 0))
        arrays.append(idx)
    return arrays + list(tables(rng, C + 3, tables_half))


@pytest.mark.parametrize("kernel", ["tiled", "cluster"])
@pytest.mark.parametrize("mode,T,H,hd,p0,window,rate,splits,rows,q_norm,unrope,step", [
    ("csa", 1, 3, 48, 63, 8, 4, 3, 64, True, True, 16),      # CSA's −1 slots: a part may hold none
    ("hca", 2, 4, 32, 60, 8, 4, 4, 64, False, True, 16),
    ("sliding", 1, 2, 16, 63, 128, 1, 5, 64, True, False, 2),   # parts merged 2, 2, then 1 at a time
    ("sliding", 3, 5, 18, 1, 8, 1, 6, 64, True, True, 4),   # 2..4 keys in 6 parts: empty ones; hd + 2 = 20
    ("csa", 3, 2, 16, 61, 6, 4, 2, 8, False, False, 16),    # a ring of 8 rows
    ("sliding", 2, 3, 16, 63, 8, 1, 3, 64, True, True, 1),  # token 1 past the capacity: NaN
    ("hca", 2, 70, 16, 20, 8, 4, 3, 64, True, True, 16)])   # more heads than one workgroup's clusters
def test_mqa_attention_merges_its_splits_in_one_dispatch(tune, rng, kernel, mode, T, H, hd, p0, window, rate,
                                                          splits, rows, q_norm, unrope, step):
    """merge=True: the last workgroup of each token's head group merges the parts (inverse_rope:
    and removes V's RoPE), against the float64 reference and bitwise equal to MQA_ATTENTION's parts
    merged by MQA_COMBINE (one formula, shaders/mqa_merge.glsl), whatever the parts merged at a time
    (step). The same program replayed with fresh inputs (another position too) each time: the
    last-group counters reset themselves."""
    tune({"mqa_tile.keys": 3, "mqa_merge.step": step})
    C = 64
    prm = {"scale": hd ** -0.5, "window": window, "mode": mode, "rate": rate, "capacity": C}
    if q_norm:
        prm["q_norm_eps"] = 1e-6
    half = min(hd // 2, 5)
    shapes = mqa_case_arrays(rng, mode, T, H, hd, p0, rows, rate, C, half)
    g = Graph()
    ts = [g.input(f"a{i}", a.shape, "i32" if a.dtype == np.int32 else "f32") for i, a in enumerate(shapes)]
    core = ts if q_norm or unrope else ts[:-2]
    merged = g.op("MQA_ATTENTION", *core, splits=splits, kernel=kernel, merge=True, inverse_rope=unrope, **prm)
    assert merged.shape == (T, H, hd)
    g.output("merged", merged)
    part = g.op("MQA_ATTENTION", *(ts if q_norm else ts[:-2]), splits=splits, kernel=kernel, **prm)
    g.output("combined", g.op("MQA_COMBINE", part, ts[3], *(ts[2:3] + ts[-2:] if unrope else []), splits=splits,
                              rope=unrope))
    cg = Executor().compile(g)
    assert [lc.shader for n in g.nodes for lc in n.op.lower(n, cg.device)] == ["mqa_attention"] * 2 + ["mqa_combine"]
    for replay in range(3):
        arrays = mqa_case_arrays(rng, mode, T, H, hd, p0 - 3 * replay * (p0 > 8), rows, rate, C, half)
        got = cg.run({f"a{i}": a for i, a in enumerate(arrays)})
        want = get_op("MQA_ATTENTION").reference(*(arrays if q_norm or unrope else arrays[:-2]), splits=splits,
                                                 merge=True, inverse_rope=unrope, **prm)
        check(got["merged"], want, cg.check_guards())
        np.testing.assert_array_equal(got["merged"], got["combined"])


@pytest.mark.parametrize("kernel", ["tiled", "cluster"])
def test_mqa_merge_without_subgroup_operations(tune, rng, monkeypatch, kernel):
    """A device without subgroup operations: one lane a head (LANES = 1), so a lane merges all of
    its head's vec4s."""
    import dataclasses
    from dsv4_vk.vk import default_device
    dev = default_device()
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, subgroup=dataclasses.replace(dev.caps.subgroup,
                                                                                                 operations=())))
    test_mqa_attention_merges_its_splits_in_one_dispatch(tune, rng, kernel, "csa", 2, 3, 20, 63, 8, 4, 3, 64, True,
                                                         True, 2)


def test_mqa_merge_refuses_what_it_cannot_merge(tune):
    """merge=True needs splits ≥ 2 and a kernel that lays its workgroups out by head group;
    inverse_rope=True needs merge=True and the RoPE tables; the knob mqa_merge.step a count."""
    q, kv, pos, sk, tab = (np.zeros((1, 2, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros(1, np.int32),
                           np.zeros(2, np.float32), np.zeros((8, 2), np.float32))
    for arrays, params, msg in [
            ([q, kv, pos, sk], {"merge": True}, r"merge=True merges split key lists, so it needs splits ≥ 2"),
            ([q, kv, pos, sk], {"merge": True, "splits": 2, "kernel": "prefill"}, r"runs on kernel 'tiled' or 'cluster'"),
            ([q, kv, pos, sk, tab, tab], {"splits": 2, "inverse_rope": True}, r"inverse_rope=True .* needs merge=True"),
            ([q, kv, pos, sk], {"merge": True, "splits": 2, "inverse_rope": True},
             r"mode=sliding takes 6 inputs \(q, kv, pos, sinks\[, ent\[, idx\]\], cos, sin\), got 4"),
            ([q, kv, pos, sk], {"merge": 1, "splits": 2}, "merge must be True or False, got 1")]:
        with pytest.raises(ValueError, match=msg):
            _graph_error("MQA_ATTENTION", arrays, {"scale": 0.5, "window": 4, **params})
    tune({"mqa_merge.step": 0})
    with pytest.raises(ValueError, match="mqa_merge: step must be an integer ≥ 1, got 0"):
        _graph_error("MQA_ATTENTION", [q, kv, pos, sk], {"scale": 0.5, "window": 4, "merge": True, "splits": 2})


def test_mqa_literal_arrays_apply_where_they_fit(tune, monkeypatch):
    """-D LITERAL_ARRAYS only where every per-lane array fits its literal size (the decode shape:
    head_dim 512 on 32-lane clusters, 16 channels a lane), never on one-lane clusters."""
    import dataclasses
    from dsv4_vk.vk import default_device
    dev = default_device()
    tune({"mqa_arrays.literal": True})
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, type="discrete-gpu"))

    def defines(hd):
        g = Graph()
        q, kv = g.input("q", (1, 4, hd)), g.input("kv", (8, hd))
        out = g.op("MQA_ATTENTION", q, kv, g.input("p", (1,), "i32"), g.input("s", (4,)), scale=0.5, window=4)
        return get_op("MQA_ATTENTION").lower(g.nodes[-1], dev)[0].defines

    sg = dev.caps.subgroup.max_size
    assert "LITERAL_ARRAYS" in defines(16 * sg)
    assert "LITERAL_ARRAYS" not in defines(64 * sg)                 # 64 channels a lane: past 16
    no_ops = dataclasses.replace(dev.caps.subgroup, operations=())
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, subgroup=no_ops))
    assert "LITERAL_ARRAYS" not in defines(16)


@pytest.mark.parametrize("q_norm", [False, True])
@pytest.mark.parametrize("kernel", ["tiled", "cluster"])
@pytest.mark.parametrize("case", [("csa", 1, 3, 48, 63, 8, 4, 3, 64), ("sliding", 5, 4, 32, 0, 8, 1, 1, 64)])
def test_mqa_attention_without_subgroup_operations(tune, rng, monkeypatch, kernel, case, q_norm):
    """A device without subgroup operations: one lane per head (LANES = 1), no cluster sums."""
    import dataclasses
    from dsv4_vk.vk import default_device
    dev = default_device()
    no_ops = dataclasses.replace(dev.caps.subgroup, operations=())
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, subgroup=no_ops))
    test_mqa_attention(tune, rng, monkeypatch, kernel, None, 3 if kernel == "tiled" else None, False, *case, q_norm=q_norm)


def test_mqa_tiled_needs_shared_memory_for_a_key_row(tune, rng, monkeypatch):
    """A device whose shared memory cannot stage one key row: kernel="tiled" is refused by name,
    "auto" takes the cluster kernel, decode splits fall back to 128 keys each."""
    import dataclasses
    from dsv4_vk.ops import v4_attention
    from dsv4_vk.vk import default_device
    dev = default_device()
    small = dataclasses.replace(dev.caps.limits, max_shared_memory=256)
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, limits=small))
    monkeypatch.setattr(v4_attention, "is_cpu", lambda device: False)
    assert v4_attention.mqa_tile_keys(dev, 512) == 0 and v4_attention.mqa_decode_splits(dev, 512, 384) == 3
    with pytest.raises(ValueError, match=r"kernel='tiled' stages key rows of 512 floats in shared memory"):
        _graph_error("MQA_ATTENTION", [np.zeros((1, 2, 512), np.float32), np.zeros((8, 512), np.float32),
                                       np.zeros(1, np.int32), np.zeros(2, np.float32)],
                     {"scale": 0.5, "window": 4, "kernel": "tiled"}, False)
    test_mqa_attention(tune, rng, monkeypatch, "auto", None, None, False, "sliding", 1, 2, 64, 40, 8, 1, 2, 64)


def test_mqa_decode_splits_at_most_the_knob(tune, monkeypatch):
    """Decode splits are one tile of keys each (8 on a GPU) up to mqa_tile.max_splits: 640 keys make 64
    splits by default, fewer under the knob (the model's layers take it: model.build.decode_splits);
    values outside 1..64 are refused by name."""
    from dsv4_vk.model.build import decode_splits
    from dsv4_vk.model.config import CSA
    from dsv4_vk.ops import v4_attention
    from dsv4_vk.vk import default_device
    dev = default_device()
    monkeypatch.setattr(v4_attention, "is_cpu", lambda device: False)
    tile = v4_attention.mqa_tile_keys(dev, 512)
    assert tile == 8 and v4_attention.mqa_decode_splits(dev, 512, 640) == 64
    assert v4_attention.mqa_decode_splits(dev, 512, 20) == 3
    from dsv4_vk.model.config import HCA, V4Config
    cfg = V4Config(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16,
                   layer_types=["sliding_attention", CSA], mlp_layer_types=["moe", "moe"],
                   compress_rates={CSA: 4, HCA: 128}, max_ctx=256,
                   sliding_window=16, index_topk=40)
    csa = 1
    want = -(-(cfg.sliding_window + min(cfg.index_topk, cfg.max_ctx // cfg.rate(csa))) // tile)
    assert want > 2 and decode_splits(cfg, csa, dev) == want
    tune({"mqa_tile.max_splits": 2})
    assert v4_attention.mqa_decode_splits(dev, 512, 640) == 2 and decode_splits(cfg, csa, dev) == 2
    assert v4_attention.mqa_decode_splits(dev, 512, 5) == 1
    for bad in (0, 65, 2.0, True, "8"):
        tune({"mqa_tile.max_splits": bad})
        with pytest.raises(ValueError, match=r"'mqa_tile.max_splits' must be an integer from 1 to 64, got"):
            v4_attention.mqa_decode_splits(dev, 512, 640)


@pytest.mark.parametrize("hashed", [False, True])
@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize("T,E,k", [(1, 4, 2), (9, 16, 6), (3, 256, 8)])
def test_v4_route(rng, hashed, scoring, T, E, k):
    lg = f32(rng, T, E, scale=3.0)
    if hashed:
        V = 40
        arrays = [lg, np.stack([rng.permutation(E)[:k] for _ in range(V)]).astype(np.int32),
                  rng.integers(0, V, T).astype(np.int32)]
    else:
        arrays = [lg, f32(rng, E)]
    got, ref, bad = run("V4_ROUTE", arrays, {"top_k": k, "scoring": scoring, "route_scale": 1.5})
    assert np.array_equal(got[..., 0], ref[..., 0])
    check(got, ref, bad)


@pytest.mark.parametrize("kind", ["rank", "rounds", "serial"])
@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "softmax"])
@pytest.mark.parametrize("T,E,k", [(2, 1000, 6), (1, 2000, 8), (3, 7, 7), (65, 64, 3), (2, 256, 8), (1, 100, 6)])
def test_v4_route_selection(tune, rng, monkeypatch, kind, scoring, T, E, k):
    """The workgroup-per-token selections — one-pass ranking up to 256 experts, rounds of a
    butterfly past them (or when ranking is off), the serial scan of devices without subgroup
    shuffles — against a stable descending sort: experts past one workgroup's width, k = E, equal
    values (the lower id first) and NaN logits (after every number). A NaN goes into an extra last
    token, so that the T tokens of the case are all checked whatever the scoring."""
    from dsv4_vk.ops import moe
    from dsv4_vk.vk import default_device
    if kind == "serial":
        monkeypatch.setattr(moe, "route_workgroup", lambda device, n: None)
    else:                                                                 # lavapipe has the subgroup ops
        assert moe.route_workgroup(default_device(), E) in (64, 256)
        tune({"route_rank.on": kind == "rank"})
    assert moe.route_kernel(default_device(), E, False) == ("rounds" if kind == "rank" and E > 256 else kind)
    lg = f32(rng, T + 1, E, scale=3.0)
    lg[:, E // 3] = lg[:, E // 2] = lg[:, E - 1] = 2.5                   # ties: the lowest id wins
    lg[T, 1] = np.nan                                                     # ranks last
    bias = f32(rng, E, scale=0.1)
    bias[[E // 3, E // 2, E - 1]] = 0.25
    with np.errstate(invalid="ignore"):                                   # the reference meets the NaN too
        got, ref, bad = run("V4_ROUTE", [lg, bias], {"top_k": k, "scoring": scoring, "route_scale": 1.5})
    if scoring == "softmax":                                              # a NaN logit poisons softmax's Σ
        assert np.isnan(got[T, :k, 1]).all() and np.array_equal(got[:T, :, 0], ref[:T, :, 0])
        check(got[:T], ref[:T], bad)
        return
    assert np.array_equal(got[..., 0], ref[..., 0]), (got[..., 0], ref[..., 0])
    check(got, ref, bad)


@pytest.mark.parametrize("limit", [0.5, 3.0])
def test_clamped_swiglu(rng, limit):
    T, R, E, F, K = 3, 3, 5, 16, 32
    route = np.zeros((T, R, 2), np.float32)
    route[..., 0] = rng.integers(0, E, (T, R))
    route[..., 1] = rng.uniform(0, 1, (T, R))
    arrays = [f32(rng, T, 1, K), f32(rng, E, 2 * F, K), route]
    got, ref, bad = run("MUL_MAT_ID", arrays, {"mode": "swiglu", "limit": limit})
    check(got, ref, bad)
    unclamped = get_op("MUL_MAT_ID").reference(*arrays, mode="swiglu")
    assert np.abs(unclamped - ref).max() > 0.1         # pre-activations of std √K ≈ 5.7: the clamp acts


def _graph_error(name, arrays, params, inplace=False):
    g = Graph()
    ts = [g.const(a) for a in arrays]
    g.op(name, *ts, out=ts[0] if inplace else None, **params)
    Executor().compile(g)


@pytest.mark.parametrize("name,arrays,params,inplace,msg", [
    ("STORE_ROWS", [np.zeros((4, 3), np.float32), np.zeros((2, 3), np.float32), np.zeros(1, np.int32)], {}, False,
     "STORE_ROWS writes in place"),
    ("STORE_ROWS", [np.zeros((4, 3), np.float32), np.zeros((2, 4), np.float32), np.zeros(1, np.int32)], {}, True,
     r"x \(input 1, \[T, n\]\) must be f32 \[\*, 3\]"),
    ("RMS_NORM", [np.ones((2, 1, 8), np.float32), np.zeros(1, np.int32), np.zeros((4, 2), np.float32),
                  np.zeros((4, 2), np.float32)], {"eps": 1e-6, "rope": True}, True, "out must not be x"),
    ("ROPE", [np.zeros((2, 1, 6), np.float32), np.zeros(1, np.int32), np.zeros((4, 4), np.float32),
              np.zeros((4, 4), np.float32)], {}, False, "must be even and hold the 8 rotated ones"),
    ("MQA_ATTENTION", [np.zeros((1, 2, 4), np.float32), np.zeros((8, 4), np.float32), np.zeros(1, np.int32),
                       np.zeros(2, np.float32)], {"mode": "csa", "scale": 0.5, "window": 4}, False,
     r"mode=csa takes 6 inputs \(q, kv, pos, sinks\[, ent\[, idx\]\]\), got 4"),
    ("MQA_ATTENTION", [np.zeros((1, 2, 4), np.float32), np.zeros((8, 4), np.float32), np.zeros(1, np.int32),
                       np.zeros(2, np.float32)], {"scale": 0.5}, False, "needs window="),
    ("COMPRESS", [np.zeros((2, 4), np.float32), np.zeros((8, 8), np.float32), np.zeros((4, 4), np.float32),
                  np.zeros(4, np.float32), np.zeros(1, np.int32), np.zeros((8, 1), np.float32),
                  np.zeros((8, 1), np.float32)], {"rate": 4, "overlap": True, "tokens": 1}, True,
     r"state \(input 1, \[rows, 2·8\]\)"),
    ("COMPRESS", [np.zeros((2, 4), np.float32), np.zeros((8, 16), np.float32), np.zeros((4, 8), np.float32),
                  np.zeros(4, np.float32), np.zeros(1, np.int32), np.zeros((8, 1), np.float32),
                  np.zeros((8, 1), np.float32)], {"rate": 4, "overlap": True, "tokens": 1}, False,
     r"COMPRESS writes the entries in place: pass out=<the tensor given as input 0>"),
    ("TOPK", [np.zeros((2, 5), np.float32)], {"k": 0}, False, "k must be an integer ≥ 1"),
    ("TOPK", [np.zeros((2, 5), np.float32), np.zeros(1, np.int32)], {"k": 2, "rate": 4}, False,
     r"a causal bound needs both rate= and capacity="),
    ("TOPK", [np.zeros((2, 5), np.float32)], {"k": 2, "rate": 4, "capacity": 8}, False,
     r"takes pos \(i32 \[1\]\) as input 1"),
    ("TOPK", [np.zeros((2, 5), np.float32), np.zeros((2, 3), np.int32)], {"k": 2, "tile": 2}, False,
     r"cand \(TOPK_TILES's output\) must be i32 \[2, 15\]"),
    ("TOPK", [np.zeros((2, 5), np.float32)], {"k": 10 ** 6}, False, r"k = 1000000 stages 8\d+ B of keys in shared memory"),
    ("TOPK_TILES", [np.zeros((2, 5), np.float32)], {"k": 2}, False, r"needs tile="),
    ("TOPK", [np.zeros((2, 5), np.float32)], {"k": 2, "sorted": "yes"}, False, r"sorted must be True or False, got 'yes'"),
    ("TOPK_TILES", [np.zeros((2, 5), np.float32)], {"k": 2, "tile": 4, "sorted": False}, False, r"sorted"),
    ("V4_ROUTE", [np.zeros((2, 4), np.float32), np.zeros(4, np.float32)], {"top_k": 5}, False,
     r"top_k must be an integer in \[1, 4\]"),
    ("V4_ROUTE", [np.zeros((2, 4), np.float32), np.zeros(4, np.float32)], {"top_k": 2, "scoring": "relu"}, False,
     "scoring must be one of"),
    ("MUL_MAT_ID", [np.zeros((2, 1, 4), np.float32), np.zeros((3, 8, 4), np.float32), np.zeros((2, 1, 2), np.float32)],
     {"mode": "sum", "limit": 1.0}, False, "limit .* with mode='swiglu'"),
    ("RMS_NORM", [np.ones((2, 8), np.float32), np.zeros(1, np.int32), np.zeros((4, 2), np.float32),
                  np.zeros((4, 2), np.float32), np.zeros((6, 8), np.float32)], {"eps": 1e-6, "rope": True, "ring": True},
     False, r"ring=True writes in place: pass out=<the ring given as the last input>"),
    ("RMS_NORM", [np.ones((2, 8), np.float32), np.zeros((6, 8), np.float32)], {"eps": 1e-6, "ring": True}, False,
     r"ring=True stores rows at their positions: it needs rope=True"),
    ("RMS_NORM", [np.ones((2, 8), np.float32), np.zeros(1, np.int32), np.zeros((4, 2), np.float32),
                  np.zeros((4, 2), np.float32), np.zeros((6, 4), np.float32)], {"eps": 1e-6, "rope": True, "ring": True},
     False, r"x must be \[T, n\] and dst \(the last input\) f32 \[rows, n\]; got x \(2, 8\), dst f32 \(6, 4\)"),
    ("RMS_NORM", [np.ones((2, 8), np.float32), np.zeros(1, np.int32), np.zeros((4, 2), np.float32),
                  np.zeros((4, 2), np.float32), np.zeros((6, 8), np.float32)],
     {"eps": 1e-6, "rope": True, "ring": True, "capacity": 5}, False, r"capacity must be an integer in \[1, 4\]"),
    ("MQA_ATTENTION", [np.zeros((1, 2, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros(1, np.int32),
                       np.zeros(2, np.float32), np.zeros((8, 2), np.float32), np.zeros((8, 2), np.float32)],
     {"scale": 0.5, "window": 4, "q_norm_eps": 0.0}, False, "q_norm_eps must be > 0"),
    ("MQA_ATTENTION", [np.zeros((1, 2, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros(1, np.int32),
                       np.zeros(2, np.float32)], {"scale": 0.5, "window": 4, "q_norm_eps": 1e-6}, False,
     r"mode=sliding takes 6 inputs \(q, kv, pos, sinks\[, ent\[, idx\]\], cos, sin\), got 4"),
    ("MQA_ATTENTION", [np.zeros((1, 2, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros(1, np.int32),
                       np.zeros(2, np.float32), np.zeros((4, 2), np.float32), np.zeros((4, 2), np.float32)],
     {"scale": 0.5, "window": 4, "q_norm_eps": 1e-6}, False, "the RoPE tables have 4 rows, fewer than the capacity 8"),
    ("MQA_ATTENTION", [np.zeros((1, 2, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros(1, np.int32),
                       np.zeros(2, np.float32), np.zeros((8, 2), np.float32), np.zeros((8, 2), np.float32)],
     {"scale": 0.5, "window": 4, "q_norm_eps": 1e-6, "capacity": "8"}, False,
     "capacity must be an integer ≥ 1, got '8'"),
])
def test_declaration_errors_name_the_argument(name, arrays, params, inplace, msg):
    with pytest.raises(ValueError, match=msg):
        _graph_error(name, arrays, params, inplace)
