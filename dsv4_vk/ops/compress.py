"""DeepSeek-V4's compressed attention: COMPRESS (the gated, position-biased softmax pooling of
HCA / CSA windows, with the entry's RMSNorm and RoPE), INDEX_SCORE (the lightning indexer's
ReLU scores, causal) and TOPK (exact top-k of any size, e.g. index_topk = 512).

COMPRESS reads the per-position projections from a state buffer and writes entry w when a chunk
token closes window w; given the chunk's projections as well, it stores them into the state itself
(a STORE_ROWS dispatch fewer). Prefill and decode run the same kernels, and the decode step's
command buffer, replayed, updates the open window and the entries on the device.
"""
from __future__ import annotations

import os

import numpy as np

from ..core.tuning import knob_table
from .base import (Launch, OpDef, check_finite, check_flag, check_in_place, check_params, cluster_lanes, expect,
                   grid_1d, nonempty, register, unit_last, view_fields, workgroup_pow2)
from .rope import StoreRows, positions, rope_fields

COMPRESS_WG = knob_table(
    "compress",
    wg=(256, "COMPRESS's workgroup: at most this many invocations (a power of two ≤ 256, part[] in "
             "compress.comp), fewer where the device allows fewer"))
INDEX_HEADS = knob_table(
    "index_score",
    heads=(None, "INDEX_SCORE heads per step with cluster sums (None: the SCATTER kernel where the device has "
                 "shuffles, else from channels per lane)"),
    gpu=("entry", "INDEX_SCORE's kernel on GPUs: entry (an invocation an entry, q staged in shared memory: "
                  "index_score.comp -D LANE_ENTRY, where it fits) or cluster (a cluster of lanes an entry)"),
    cpu=("cluster", "INDEX_SCORE's kernel on CPU devices (entry or cluster)"),
    entry_wg=(128, "INDEX_SCORE -D LANE_ENTRY: invocations (entries) a workgroup"))
# LANE_ENTRY keeps a sum per head in registers: at most this many heads
INDEX_ENTRY_MAX_HEADS = 128


def index_score_kernel(device, nh: int, hd: int, aligned: bool = True) -> tuple[bool, str]:
    """The one place that decides INDEX_SCORE's kernel: (whether it is the entry kernel, LANE_ENTRY,
    and why). The knob index_score.gpu / .cpu asks for it; it needs hd % 4 == 0 with q's and k's rows
    16-byte aligned (aligned), at most INDEX_ENTRY_MAX_HEADS heads, and q and wt in shared memory."""
    kind = "cpu" if device.caps.is_cpu else "gpu"
    choice = INDEX_HEADS[kind]
    if choice not in ("entry", "cluster"):
        raise ValueError(f"tuning knob 'index_score.{kind}' must be 'entry' or 'cluster', got {choice!r}")
    need, have = 16 * nh * (hd // 4) + 4 * nh + 64, device.caps.limits.max_shared_memory
    if choice == "cluster":
        return False, f"a cluster of lanes an entry (knob index_score.{kind})"
    if not aligned or hd % 4:
        return False, "a cluster of lanes an entry: the entry kernel needs hd % 4 == 0 and 16-byte aligned rows"
    if nh > INDEX_ENTRY_MAX_HEADS:
        return False, f"a cluster of lanes an entry: {nh} heads, past the entry kernel's {INDEX_ENTRY_MAX_HEADS}"
    if need > have:
        return False, f"a cluster of lanes an entry: q and wt need {need} B of shared memory, the device has {have} B"
    return True, f"an invocation an entry, q and wt staged in shared memory ({need} B; knob index_score.{kind})"


def _index_entry_kernel(device, q, k, hd: int, nh: int) -> bool:
    aligned = all(v % 4 == 0 for v in (q.offset, *q.strides[:2], k.offset, k.strides[0]))
    return index_score_kernel(device, nh, hd, aligned)[0]


# Workgroups per row of INDEX_SCORE and TOPK_TILES at most, looping over the row's blocks below its
# causal bound: the grid is recorded once for the cache's capacity, and an idle workgroup is not free
# (lavapipe: about 17 µs each, its threads one per core, at most 16); a GPU keeps thousands in flight.
ROW_GROUPS = knob_table(
    "row_groups",
    cpu=(min(os.cpu_count() or 2, 16), "INDEX_SCORE / TOPK_TILES workgroups per row at most on CPU devices"),
    gpu=(2048, "INDEX_SCORE / TOPK_TILES workgroups per row at most on GPUs"))


def row_groups(device, blocks: int) -> int:
    """Workgroups per row for `blocks` blocks of a row: all of them up to ROW_GROUPS's cap."""
    return max(1, min(int(blocks), int(ROW_GROUPS["cpu" if device.caps.is_cpu else "gpu"])))


def compress_workgroup(device) -> int:
    """COMPRESS's workgroup size on this device: the largest power of two ≤ COMPRESS_WG["wg"] (at most
    256) and the device's workgroup limits."""
    cap = min(int(COMPRESS_WG["wg"]), 256)
    if cap < 1:
        raise ValueError(f"tuning knob 'compress.wg' must be at least 1, got {COMPRESS_WG['wg']!r}")
    return workgroup_pow2(device, cap)


def reference_pool(c, z, norm_w, eps, overlap):
    """One entry: c, z [slots, W] (z already + ape); overlap: slots 0..m−1 are the previous window
    (first half of the channels, may be absent: z = −inf), m..2m−1 the current (second half)."""
    d = norm_w.shape[0]
    if overlap:
        m = c.shape[0] // 2
        c = np.concatenate([c[:m, :d], c[m:, d:]])
        z = np.concatenate([z[:m, :d], z[m:, d:]])
    p = np.exp(z - z.max(axis=0))
    p /= p.sum(axis=0)
    e = (p * c).sum(axis=0)
    return e / np.sqrt(np.mean(e * e) + eps) * norm_w


@register
class Compress(OpDef):
    """COMPRESS(out [n, d], state [rows, 2W], ape [rate, W], norm [d], pos [1] i32, cos, sin
    [capacity, half][, xs [T, 2W]], rate=, overlap=, eps=, tokens=T) IN PLACE on out (out=): entry
    w = (p+1)/rate − 1 for every one of the T chunk tokens p = pos[0]+t < capacity that closes a
    window; W = 2d with overlap (CSA), else d (HCA); state is a ring (position q in row q % rows).
    With xs, the chunk's projections: stored into the state first (as STORE_ROWS would, in the
    same dispatch; the state is then written too and must hold the (2 with overlap, else 1)·rate
    + T − 1 rows a chunk reads back or writes)."""
    name, n_inputs = "COMPRESS", None
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        if len(inputs) not in (7, 8):
            raise ValueError(f"{self.name} takes out, state, ape, norm, pos, cos, sin[, xs]; got {len(inputs)} inputs")
        out, st, ape, norm, pos, cos, sin = inputs[:7]
        nonempty(self.name, [out, st, ape, norm, cos])
        check_params(self.name, params, ("rate", "overlap", "eps", "tokens"))
        m, ov = params.get("rate"), check_flag(self.name, params, "overlap")
        for key in ("rate", "tokens"):
            v = params.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{self.name}: {key} must be an integer ≥ 1, got {v!r}")
        check_finite(f"{self.name} eps", params.get("eps", 1e-6))
        expect(self.name, "out (input 0, [entries, d])", out, (None, None))
        d = out.shape[1]
        W = 2 * d if ov else d
        if d % 2 or d > 4096:
            raise ValueError(f"{self.name}: entry width d must be even and ≤ 4096, got {d}")
        expect(self.name, f"state (input 1, [rows, 2·{W}])", st, (None, 2 * W))
        expect(self.name, f"ape (input 2, [rate, {W}])", ape, (m, W))
        expect(self.name, "norm (input 3, [d])", norm, (d,))
        expect(self.name, "pos (input 4)", pos, (1,), "i32")
        expect(self.name, "cos (input 5, [capacity, half])", cos, (None, None))
        if st.shape[0] < (2 if ov else 1) * m:
            raise ValueError(f"{self.name}: state has {st.shape[0]} rows, fewer than the {(2 if ov else 1) * m} "
                             "a window reads")
        expect(self.name, "sin (input 6, like cos)", sin, cos.shape)
        if 2 * cos.shape[1] > d or cos.strides[0] != sin.strides[0]:
            raise ValueError(f"{self.name}: the RoPE tables' {2 * cos.shape[1]} channels must fit in d = {d}, "
                             "with one row stride for cos and sin")
        for what, t in (("out", out), ("state", st), ("ape", ape), ("cos", cos), ("sin", sin)):
            unit_last(self.name, what, t)
        if len(inputs) == 8:
            T = params["tokens"]
            expect(self.name, f"xs (input 7, the chunk's projections [{T}, 2·{W}])", inputs[7], (T, 2 * W))
            unit_last(self.name, "xs", inputs[7])
            if st.storage.kind not in ("temp", "param"):
                raise ValueError(f"{self.name} with xs writes the state (input 1): pass a tensor made with "
                                 f"Graph.empty (or a param), got a {st.storage.kind} tensor")
            need = (2 if ov else 1) * m + T - 1
            if st.shape[0] < need:
                raise ValueError(f"{self.name}: with xs the state ring needs {need} rows (the {need - T + 1} a "
                                 f"window reads back and the {T} a chunk writes), got {st.shape[0]}")
        return out.shape, "f32"

    def lower(self, node, device):
        out, st, ape, norm, pos, cos, sin = node.inputs[:7]
        res = node.output
        check_in_place(res, out, "COMPRESS writes the entries", "the tensor given as input 0")
        prm = node.params
        n, d = out.shape
        defs = {"OVERLAP": 1} if prm.get("overlap") else {}
        T = prm["tokens"]
        push = {"T": T, "d": d, "n_out": n, "rows": st.shape[0], **view_fields("s", st.offset, st.strides[:1]),
                **view_fields("a", ape.offset, ape.strides[:1]), "n_off": norm.offset,
                **view_fields("o", out.offset, out.strides[:1]), **rope_fields(pos, cos, sin),
                "eps": float(prm.get("eps", 1e-6))}
        args, writes = [st, ape, norm, pos, cos, sin, res], (6,)
        if len(node.inputs) == 8:
            xs = node.inputs[7]
            defs["NEW_ROWS"] = 1
            args, writes = args + [xs], (6, 0)
            push |= view_fields("x", xs.offset, xs.strides[:1])
        return [Launch("compress", args, writes, push, grid_1d(T, 1), defines=defs,
                       spec=(compress_workgroup(device), prm["rate"], d))]

    @staticmethod
    def reference_state(st, xs, pos, cos):
        """float64 state after a COMPRESS given xs: xs's rows stored at their positions < capacity."""
        return StoreRows().reference(st, xs, pos, capacity=np.shape(cos)[0])

    def reference(self, out, st, ape, norm, pos, cos, sin, xs=None, rate=1, overlap=False, eps=1e-6, tokens=1):
        """The entries (with xs, after storing xs into the state: reference_state gives that)."""
        res = np.array(out, np.float64)
        if xs is not None:
            st = self.reference_state(st, xs, pos, cos)
        st, ape = np.asarray(st, np.float64), np.asarray(ape, np.float64)
        n, d = res.shape
        W = ape.shape[1]
        p, ok = positions(pos, tokens, np.shape(cos)[0])
        R = st.shape[0]
        for pp in p[ok]:
            if (pp + 1) % rate or (pp + 1) // rate - 1 >= n:
                continue
            w = (pp + 1) // rate - 1
            rows = st[np.arange(w * rate, (w + 1) * rate) % R]
            c, z = rows[:, :W], rows[:, W:] + ape
            if overlap:
                prev = st[np.arange((w - 1) * rate, w * rate) % R] if w > 0 else np.zeros((rate, 2 * W))
                pz = prev[:, W:] + ape if w > 0 else np.full((rate, W), -np.inf)
                c, z = np.concatenate([prev[:, :W], c]), np.concatenate([pz, z])
            e = reference_pool(c, z, np.asarray(norm, np.float64), eps, overlap)
            half = np.shape(cos)[1]
            a, b = e[d - 2 * half::2].copy(), e[d - 2 * half + 1::2].copy()
            cs, sn = np.asarray(cos, np.float64)[w * rate], np.asarray(sin, np.float64)[w * rate]
            e[d - 2 * half::2], e[d - 2 * half + 1::2] = a * cs - b * sn, a * sn + b * cs
            res[w] = e
        return res


def reference_index_score(q, wt, k, pos, rate, scale):
    """scores [T, n]: scale·Σ_h wt[t,h]·ReLU(q[t,h]·k[w]) for w < (p+1)//rate, else −inf."""
    q, wt, k = (np.asarray(a, np.float64) for a in (q, wt, k))
    T, n = q.shape[0], k.shape[0]
    p, ok = positions(pos, T, 1 << 30)
    s = np.einsum("th,thw->tw", wt, np.maximum(np.einsum("thd,wd->thw", q, k), 0.0)) * scale
    valid = ok[:, None] & (np.arange(n)[None, :] < ((p + 1) // rate)[:, None])
    return np.where(valid, s, -np.inf)


@register
class IndexScore(OpDef):
    """INDEX_SCORE(q [T,nh,hd], wt [T,nh], k [n,hd], pos [1] i32, rate=, scale=, capacity=) -> [T, n]:
    row t's scores of its closed entries w < min((p + 1) // rate, n), p = pos[0] + t in [0, capacity);
    the rest of the row is not written (TOPK with the same bound reads none of it), so the work
    follows the position. The reference gives −inf there."""
    name, n_inputs = "INDEX_SCORE", 4
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        q, wt, k, pos = inputs
        nonempty(self.name, inputs)
        check_params(self.name, params, ("rate", "scale", "capacity"))
        expect(self.name, "q (input 0, [T, heads, head_dim])", q, (None, None, None))
        T, nh, hd = q.shape
        expect(self.name, "wt (input 1, [T, heads])", wt, (T, nh))
        expect(self.name, "k (input 2, [entries, head_dim])", k, (None, hd))
        expect(self.name, "pos (input 3)", pos, (1,), "i32")
        for what, t in (("q", q), ("wt", wt), ("k", k)):
            unit_last(self.name, what, t)
        for key in ("rate", "capacity"):
            v = params.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{self.name}: {key} must be an integer ≥ 1, got {v!r}")
        check_finite(f"{self.name} scale", params.get("scale", 1.0))
        return (T, k.shape[0]), "f32"

    def lower(self, node, device):
        q, wt, k, pos = node.inputs
        out, prm = node.output, node.params
        T, nh, hd = q.shape
        n = k.shape[0]
        lanes, extra = cluster_lanes(device, hd, per_lane=4)
        push = {"T": T, "nh": nh, "hd": hd, "n": n, "capacity": prm["capacity"],
                **view_fields("q", q.offset, q.strides[:2]),
                **view_fields("w", wt.offset, wt.strides[:1]), **view_fields("k", k.offset, k.strides[:1]),
                **view_fields("o", out.offset, out.strides[:1]), "pos_off": pos.offset,
                "scale": float(prm.get("scale", 1.0))}
        if _index_entry_kernel(device, q, k, hd, nh):
            wg = workgroup_pow2(device, INDEX_HEADS["entry_wg"])
            push["groups"] = groups = row_groups(device, -(-n // wg))
            return [Launch("index_score", [q, wt, k, pos, out], (4,), push, grid_1d(T * groups, 1),
                           defines={"LANE_ENTRY": 1}, spec=(wg, prm["rate"], 1, 1, nh, hd // 4))]
        per_lane = -(-hd // lanes["LANES"])
        heads = INDEX_HEADS.get("heads") or (4 if per_lane <= 16 else 1)     # loads in flight per lane
        if INDEX_HEADS.get("heads") is None and 2 <= lanes["LANES"] <= 32 \
                and device.caps.subgroup.supports("basic", "shuffle"):
            lanes = {**lanes, "SCATTER": 1}            # LANES heads a step, a transposing reduction
        groups = row_groups(device, -(-n // (256 // lanes["LANES"])))   # workgroups per row
        push["groups"] = groups
        return [Launch("index_score", [q, wt, k, pos, out], (4,), push, grid_1d(T * groups, 1),
                       defines=lanes, spec=(256, prm["rate"], per_lane, heads), **extra)]

    def reference(self, q, wt, k, pos, rate=1, scale=1.0, capacity=1 << 30):
        s = reference_index_score(q, wt, k, pos, rate, scale)
        p, ok = positions(pos, np.shape(q)[0], capacity)
        s[~ok] = -np.inf
        return s


def reference_topk(scores, k, pos=None, rate=1, capacity=1 << 30, sorted=True):
    """idx [T, k] int: each row's k largest finite scores' entries (ties: lower index first), by
    descending score (sorted) or ascending entry, −1 padding; with pos, row t sees only entries
    w < min((p + 1) // rate, n) for p = pos[0] + t in [0, capacity) (none otherwise)."""
    s = np.asarray(scores, np.float64)
    T, n = s.shape
    bound = np.full(T, n)
    if pos is not None:
        p, ok = positions(pos, T, capacity)
        bound = np.where(ok, np.minimum((p + 1) // rate, n), 0)
    out = np.full((T, k), -1, np.int64)
    for t, row in enumerate(s):
        fin = np.flatnonzero(np.isfinite(row[:bound[t]]))
        order = fin[np.lexsort((fin, -row[fin]))][:k]
        out[t, :len(order)] = order if sorted else np.sort(order)
    return out


TOPK_TILE = knob_table(
    "topk_tile", entries=(8192, "TOPK_TILES: entries a workgroup selects from (then one merge per row)"))
# TOPK's workgroup and radix digit bits by device type: a GPU wants many loads in flight and few
# passes; a CPU device runs a workgroup's invocations in turn, every bin cleared and scanned each pass
TOPK_WG = knob_table(
    "topk_wg",
    gpu=(1024, "TOPK's workgroup on GPUs (at most: the device may allow fewer)"),
    cpu=(64, "TOPK's workgroup on CPU devices (at most: the device may allow fewer)"))
TOPK_BITS = knob_table(
    "topk_bits",
    gpu=(11, "TOPK's radix digit bits on GPUs (a 1 << bits bin histogram in shared memory; 4..16)"),
    cpu=(8, "TOPK's radix digit bits on CPU devices (4..16)"))
TOPK_STAGED = knob_table(
    "topk_staged", keys=(None, "the K-th bin's keys staged in shared memory at most (None: all the shared memory "
                               "left over holds, ≤ 8192)"))
TOPK_SCAN = knob_table(
    "topk_scan",
    gpu=("fused", "TOPK's bin scan on GPUs: groups (serial sums of bin groups in shared memory), subgroup "
                  "(a suffix sum with subgroup operations) or fused (subgroup with two histograms: fewer "
                  "barriers; on the H200 the fastest on the indexer's clustered scores, results/h200/topk_h200.txt)"),
    cpu=("groups", "TOPK's bin scan on CPU devices (groups, subgroup or fused)"))
# the defines of each bin scan; devices without subgroup arithmetic (or with more than 256 subgroups
# a workgroup) use "groups", and "fused" is "subgroup" where its two histograms do not fit beside k
TOPK_SCANS = {"groups": {}, "subgroup": {"SCAN_SUBGROUP": 1}, "fused": {"SCAN_FUSED": 1}}
TOPK_SPREAD = knob_table(
    "topk_spread",
    gpu=(False, "TOPK's first digit on GPUs: the key's top bits (False) or a linear map of the row's score range "
                "onto the bins (True: clustered scores spread over the bins; devices with subgroup arithmetic)"),
    cpu=(False, "TOPK's first digit on CPU devices (as topk_spread.gpu)"))


def topk_tiles(n: int, tile: int) -> int:
    """Tiles of `tile` entries covering n scores."""
    return max(1, -(-int(n) // int(tile)))


def topk(g, scores, k: int, pos=None, rate: int = 1, capacity: int | None = None, tile: int | None = None,
         sorted: bool = True):
    """The top k of each row of scores [T, n] (TOPK's order and bound; sorted=False: in entry order,
    cheaper): one TOPK where the row fits one tile, else TOPK_TILES (each tile's top k, a workgroup
    each) and TOPK merging them. With pos (i32 [1]), row t reads only its causal entries (TOPK): the
    cost follows the entries that exist."""
    tile = int(tile or TOPK_TILE["entries"])
    bound = [] if pos is None else [pos]
    prm = {"k": k} if pos is None else {"k": k, "rate": rate, "capacity": capacity or (1 << 30)}
    order = {} if sorted else {"sorted": False}
    if topk_tiles(scores.shape[1], tile) == 1:
        return g.op("TOPK", scores, *bound, **prm, **order)
    cand = g.op("TOPK_TILES", scores, *bound, tile=tile, **prm)
    return g.op("TOPK", scores, *bound, cand, tile=tile, **prm, **order)


def _topk_check(op, inputs, params, with_tile):
    """(scores, pos or None, rest, k, tile) of TOPK / TOPK_TILES after checking them."""
    nonempty(op, inputs[:1])
    check_params(op, params, ("k", "rate", "capacity", "tile") + (() if with_tile else ("sorted",)))
    if not isinstance(params.get("sorted", True), bool):
        raise ValueError(f"{op}: sorted must be True or False, got {params['sorted']!r}")
    s = inputs[0]
    expect(op, "scores (input 0, [T, n])", s, (None, None))
    unit_last(op, "scores", s)
    for key in ("k", "rate", "capacity", "tile"):
        v = params.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{op}: {key} must be an integer ≥ 1, got {v!r}")
    bounded = "rate" in params or "capacity" in params
    if bounded and not ("rate" in params and "capacity" in params):
        raise ValueError(f"{op}: a causal bound needs both rate= and capacity= (and pos as input 1)")
    pos = None
    if bounded:
        if len(inputs) < 2:
            raise ValueError(f"{op} with rate= and capacity= takes pos (i32 [1]) as input 1")
        pos = inputs[1]
        expect(op, "pos (input 1)", pos, (1,), "i32")
    if with_tile and "tile" not in params:
        raise ValueError(f"{op} needs tile=<entries per workgroup>")
    return s, pos, inputs[1 + bounded:], params["k"], params.get("tile")


def _topk_fields(s, pos, K, tiles, params, cand=None, out=None, groups=1):
    return {"T": s.shape[0], "n": s.shape[1], "K": K, "tiles": tiles, "groups": groups, "rate": params.get("rate", 1),
            "capacity": params.get("capacity", 1), "has_pos": int(pos is not None),
            **view_fields("s", s.offset, s.strides[:1]),
            "pos_off": pos.offset if pos is not None else 0,
            **(view_fields("c", cand.offset, cand.strides[:1]) if cand is not None else {"c_off": 0, "c_s0": 0}),
            **(view_fields("i", out.offset, out.strides[:1]) if out is not None else {"i_off": 0, "i_s0": 0})}


def _topk_scan(device, wg: int) -> tuple[dict, dict]:
    """The defines of TOPK's bin scan (TOPK_SCAN) on this device at workgroup wg, and the Launch's
    subgroup settings (the subgroup scan counts invocations in subgroup order: full subgroups)."""
    kind = "cpu" if device.caps.is_cpu else "gpu"
    scan = TOPK_SCAN[kind]
    if scan not in TOPK_SCANS:
        raise ValueError(f"tuning knob 'topk_scan.{kind}' must be one of {sorted(TOPK_SCANS)}, got {scan!r}")
    sg = device.caps.subgroup
    ops = sg.supports("basic", "arithmetic")
    if not ops or wg > 256 * sg.min_size:
        scan = "groups"
    spread = bool(TOPK_SPREAD[kind]) and ops
    full = (scan != "groups" or spread) and sg.full_subgroups and wg % max(1, sg.max_size) == 0
    return {**TOPK_SCANS[scan], **({"SPREAD": 1} if spread else {})}, ({"full_subgroups": True} if full else {})


def _topk_spec(op, device, K, tile, keys=True):
    """TOPK's spec constants (workgroup, K, tile, bits, staged keys), defines and Launch settings (the
    bin scan, _topk_scan); K's keys (TOPK; TOPK_TILES writes them out) and at least one staged key
    must fit the device's shared memory."""
    kind = "cpu" if device.caps.is_cpu else "gpu"
    bits = int(TOPK_BITS[kind])
    if not 4 <= bits <= 16:
        raise ValueError(f"tuning knob 'topk_bits.{kind}' must be in 4..16, got {bits!r}")
    wg = workgroup_pow2(device, TOPK_WG[kind])
    scan, extra = _topk_scan(device, wg)
    have = device.caps.limits.max_shared_memory

    def shared(scan):                   # histograms, scan sums, state, alignment; then K's keys
        hists = 2 if "SCAN_FUSED" in scan else 1
        subgroup = bool(set(scan) - {"SPREAD"})
        groups = 256 if subgroup else (1 << (bits - bits // 2)) + wg      # + the compaction's counts
        fixed = 4 * (hists * (1 << bits) + groups + 3 * hists + 8) + 64
        return fixed, 8 * K * keys + fixed + 8
    fixed, need = shared(scan)
    if need > have and "SCAN_FUSED" in scan:          # two histograms do not fit: one
        scan = {**TOPK_SCANS["subgroup"], **{k: v for k, v in scan.items() if k == "SPREAD"}}
        fixed, need = shared(scan)
    if need > have:
        raise ValueError(f"{op}: k = {K} stages {need} B of keys in shared memory (beside a {1 << bits}-bin "
                         f"histogram); {device.name} has {have} B (k at most {max(0, have - fixed - 8) // 8})")
    staged = (have - need) // 8 + 1
    if TOPK_STAGED["keys"] is not None:
        staged = max(1, min(staged, int(TOPK_STAGED["keys"])))
    return (wg, K, tile or 1, bits, min(staged, 8192)), scan, extra


@register
class TopKTiles(OpDef):
    """TOPK_TILES(scores [T, n][, pos [1] i32], k=, tile=[, rate=, capacity=]) -> cand [T, tiles·(2k+1)]
    i32: each tile's top k keys (count, then key pairs; shaders/topk.comp -D PART), for TOPK to merge.
    Tiles at or past the row's bound (TOPK) are not written."""
    name, n_inputs = "TOPK_TILES", None
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        s, pos, rest, k, tile = _topk_check(self.name, inputs, params, True)
        if rest:
            raise ValueError(f"{self.name} takes scores[, pos]; got {len(inputs)} inputs")
        return (s.shape[0], topk_tiles(s.shape[1], tile) * (2 * k + 1)), "i32"

    def lower(self, node, device):
        s, pos, _, K, tile = _topk_check(self.name, node.inputs, node.params, True)
        tiles = topk_tiles(s.shape[1], tile)
        groups = row_groups(device, tiles)
        push = _topk_fields(s, pos, K, tiles, node.params, cand=node.output, groups=groups)
        spec, scan, extra = _topk_spec(self.name, device, K, tile, keys=False)
        return [Launch("topk", [s, pos if pos is not None else s, node.output], (2,), push,
                       grid_1d(s.shape[0] * groups, 1), defines={"PART": 1, **scan}, spec=spec, **extra)]

    def reference(self, scores, pos=None, k=1, tile=1, rate=1, capacity=1 << 30):
        raise ValueError("TOPK_TILES's candidates are checked through the TOPK that merges them")


@register
class TopK(OpDef):
    """TOPK(scores [T, n][, pos [1] i32][, cand], k=[, rate=, capacity=][, tile=][, sorted=]) -> [T, k] i32
    (shaders/topk.comp): each row's top k scores' entries, ties to the lower index, by descending
    score (sorted=True, the default: torch.topk's order over the indexer's scores) or by ascending
    entry (sorted=False: no rank count, for consumers of the set such as sparse attention), −1 past
    the row's selectable entries. Only
    finite scores are selectable: NaN and ±inf rank after every finite one and are never selected.
    With rate= and capacity= (and pos), row t reads only entries w < min((p + 1) // rate, n) at
    p = pos[0] + t in [0, capacity) (none elsewhere): the indexer's causal bound, so the work follows
    the entries that exist, not n. With cand (TOPK_TILES's output for the same scores, tile=): the
    merge of the tiles' candidates. Any k ≥ 1 whose 8·k bytes fit the device's shared memory beside
    the radix histogram (compress.TOPK_BITS)."""
    name, n_inputs = "TOPK", None
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        s, pos, rest, k, tile = _topk_check(self.name, inputs, params, False)
        if len(rest) > 1:
            raise ValueError(f"{self.name} takes scores[, pos][, cand]; got {len(inputs)} inputs")
        if rest:
            if tile is None:
                raise ValueError(f"{self.name} with cand needs the tile= TOPK_TILES used")
            want = topk_tiles(s.shape[1], tile) * (2 * k + 1)
            expect(self.name, "cand (TOPK_TILES's output)", rest[0], (s.shape[0], want), "i32")
        return (s.shape[0], k), "i32"

    def lower(self, node, device):
        s, pos, rest, K, tile = _topk_check(self.name, node.inputs, node.params, False)
        out = node.output
        ordered = node.params.get("sorted", True)
        spec, scan, extra = _topk_spec(self.name, device, K, tile, keys=ordered)
        if ordered:
            scan = {**scan, "SORTED": 1}
        bound = pos if pos is not None else s
        if rest:
            push = _topk_fields(s, pos, K, topk_tiles(s.shape[1], tile), node.params, cand=rest[0], out=out)
            return [Launch("topk", [s, bound, rest[0], out], (3,), push, grid_1d(s.shape[0], 1),
                           defines={"MERGE": 1, **scan}, spec=spec, **extra)]
        push = _topk_fields(s, pos, K, 1, node.params, out=out)
        return [Launch("topk", [s, bound, out], (2,), push, grid_1d(s.shape[0], 1), defines=scan, spec=spec,
                       **extra)]

    def reference(self, scores, *rest, k=1, rate=None, capacity=None, tile=None, sorted=True):
        """(cand, when given, is the tiles' candidates for the same scores: the result is the rows' top k)"""
        pos = rest[0] if rate is not None else None
        return reference_topk(scores, k, pos, rate or 1, capacity or (1 << 30), sorted)


def describe(device, heads: int = 64, head_dim: int = 128, k: int = 512) -> dict:
    """What `info` prints of the indexer's kernels on `device` at DeepSeek-V4's widths: INDEX_SCORE's
    kernel and why, and TOPK's workgroup, digit width and bin scan."""
    entry, why = index_score_kernel(device, heads, head_dim)
    spec, scan, _ = _topk_spec("TOPK", device, k, None, keys=False)
    name = "fused" if "SCAN_FUSED" in scan else "subgroup" if "SCAN_SUBGROUP" in scan else "groups"
    return {"index_score": {"heads": heads, "head_dim": head_dim, "kernel": "entry" if entry else "cluster",
                            "reason": why},
            "topk": {"k": k, "workgroup": spec[0], "bits": spec[3], "scan": name + ("+spread" if "SPREAD" in scan else "")}}
