"""The model's own kernels: KV_WRITE (RoPE + cache write at a device-side position), ATTENTION
over the cache, MOE_ROUTE (top-k experts on the device), MUL_MAT_ID (products with the chosen
experts only) and SAMPLE (greedy / temperature + top-k on the device, seeded counter RNG).

Positions are never push constants: KV_WRITE and ATTENTION read `pos` (i32 [1], the position of
the first token of the chunk) from a buffer, so one recorded decode step serves every position.
Each op's float64 reference is here too; dsv4_vk.model.reference builds the whole model from them.
"""
import struct

import numpy as np

from .base import Launch, OpDef, check_finite, grid_1d, register
from .matmul import is_cpu
from .rows import check_params, cluster_lanes, nonempty

MAX_TOP_K = 64
ROUTERS = ("softmax", "sigmoid")
NAN = np.float32(np.nan)


def _push(ints, floats=()):
    """Push constants: uint32 values, then float32 values (the order of the shader's block)."""
    return struct.pack(f"<{len(ints)}I{len(floats)}f", *ints, *floats)


def _expect(op, what, t, shape, dtype="f32"):
    """ValueError unless t has `shape` (None: any size ≥ 1) and dtype."""
    ok = t.ndim == len(shape) and all(e is None or s == e for s, e in zip(t.shape, shape))
    if not ok or t.dtype != dtype:
        want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise ValueError(f"{op}: {what} must be {dtype} {want}, got {t.dtype} {list(t.shape)}")


def _unit_last(op, what, t):
    if t.shape[-1] > 1 and t.strides[-1] != 1:
        raise ValueError(f"{op}: {what} must have unit stride along its last axis (use CONT), got strides {t.strides}")


def _check_tables(op, cos, sin, capacity, half):
    for what, t in (("cos", cos), ("sin", sin)):
        _expect(op, f"{what} (RoPE table [capacity, head_dim/2])", t, (capacity, half))
        _unit_last(op, what, t)
    if cos.strides[0] != sin.strides[0]:
        raise ValueError(f"{op}: cos and sin must have the same row stride, got {cos.strides[0]} and {sin.strides[0]}")


# --- float64 references ------------------------------------------------------------------------

def rope_tables(head_dim, capacity, theta=10000.0):
    """(cos, sin) [capacity, head_dim/2]: angle of pair i at position p = p · θ^(−2i/head_dim)."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(capacity, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs (x[..., 2i], x[..., 2i+1]); cos/sin broadcast against x[..., ::2]."""
    x = np.asarray(x, np.float64)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def reference_attention(q, k, v, positions, scale):
    """q [T,H,hd] (already rotated) at `positions` [T]; k, v [n,H,hd]; token t sees keys j ≤ positions[t]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("thd,jhd->htj", q, k) * scale
    mask = np.arange(k.shape[0])[None, :] > np.asarray(positions)[:, None]
    s = np.where(mask[None], -np.inf, s)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return np.einsum("htj,jhd->thd", s, v)


def reference_route(logits, top_k, router="sigmoid", norm=True, route_scale=1.0, n_shared=0):
    """[T, top_k + n_shared, 2]: (expert id, weight); picks by logit (desc), ties to the lower id."""
    lg = np.asarray(logits, np.float64)
    T, E = lg.shape
    if router == "softmax":
        e = np.exp(lg - lg.max(axis=-1, keepdims=True))
        scores = e / e.sum(axis=-1, keepdims=True)
    else:
        scores = 1.0 / (1.0 + np.exp(-lg))
    out = np.zeros((T, top_k + n_shared, 2))
    order = np.argsort(-lg, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(scores, order, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    out[:, :top_k, 0], out[:, :top_k, 1] = order, w * route_scale
    out[:, top_k:, 0] = E + np.arange(n_shared)
    out[:, top_k:, 1] = 1.0
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def pcg(v):
    """The PCG hash of sample.comp on uint32 values (Python ints)."""
    s = (v * 747796405 + 2891336453) & 0xFFFFFFFF
    word = (((s >> ((s >> 28) + 4)) ^ s) * 277803737) & 0xFFFFFFFF
    return (word >> 22) ^ word


def sample_uniform(seed, counter):
    """The draw u ∈ [0, 1) of SAMPLE for state (seed, counter)."""
    return (pcg((seed & 0xFFFFFFFF) ^ pcg(counter & 0xFFFFFFFF)) >> 8) / 16777216.0


def sample_candidates(row, temperature, top_k):
    """(ids, probabilities) SAMPLE draws from for one row of logits (finite logits only)."""
    row = np.asarray(row, np.float64)
    k = 1 if not temperature > 0 else min(max(int(top_k), 1), MAX_TOP_K)
    finite = np.flatnonzero(np.isfinite(row))
    ids = finite[np.lexsort((finite, -row[finite]))][:k]
    if len(ids) <= 1:
        return ids, np.ones(len(ids))
    w = np.exp((row[ids] - row[ids[0]]) / temperature)
    return ids, w / w.sum()


def reference_sample(logits, temperature, top_k, seed, counter):
    """Tokens [T] (int) exactly as SAMPLE draws them, u of row r from (seed, counter + r)."""
    out = []
    for r, row in enumerate(np.asarray(logits, np.float64)):
        ids, p = sample_candidates(row, temperature, top_k)
        if len(ids) == 0:
            out.append(-1)
            continue
        u = sample_uniform(seed, counter + r)
        j = int(np.searchsorted(np.cumsum(p), u, side="right"))
        out.append(int(ids[min(j, len(ids) - 1)]))
    return np.array(out, np.int64)


# --- ops ----------------------------------------------------------------------------------------

@register
class KvWrite(OpDef):
    """KV_WRITE(cache [C,S,H,hd], x [T,S,H,hd], pos [1] i32, cos, sin [C,hd/2], rotate=r) writes
    x[t] (slots s < r RoPE-rotated) into cache row pos[0] + t, IN PLACE: use out=cache."""
    name, n_inputs = "KV_WRITE", 5
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        cache, x, pos, cos, sin = inputs
        nonempty(self.name, [cache, x])
        check_params(self.name, params, ("rotate",))
        _expect(self.name, "cache (input 0, [capacity, slots, heads, head_dim])", cache, (None,) * 4)
        C, S, H, hd = cache.shape
        _expect(self.name, "x (input 1, [T, slots, heads, head_dim] like the cache)", x, (None, S, H, hd))
        _expect(self.name, "pos (input 2)", pos, (1,), "i32")
        if hd % 2:
            raise ValueError(f"{self.name}: head_dim must be even (RoPE pairs), got {hd}")
        _check_tables(self.name, cos, sin, C, hd // 2)
        rot = params.get("rotate", 0)
        if isinstance(rot, bool) or not isinstance(rot, int) or not 0 <= rot <= S:
            raise ValueError(f"{self.name}: rotate must be an integer in [0, {S}] (slots to RoPE-rotate), got {rot!r}")
        return cache.shape, "f32"

    def lower(self, node, device):
        cache, x, pos, cos, sin = node.inputs
        out = node.output
        if out.storage is not cache.storage or out.offset != cache.offset or out.strides != cache.strides:
            raise ValueError("KV_WRITE writes the cache in place: pass out=<the cache tensor given as input 0>")
        C, S, H, hd = cache.shape
        T = x.shape[0]
        push = _push([T, S, H, hd // 2, x.offset, *x.strides, out.offset, *out.strides,
                      C, node.params.get("rotate", 0), pos.offset, cos.offset, sin.offset, cos.strides[0]])
        return [Launch("kv_write", [x, pos, cos, sin, out], (4,), push, grid_1d(T * S * H * (hd // 2)))]

    def reference(self, cache, x, pos, cos, sin, rotate=0):
        out = np.array(cache, np.float64)
        x = np.array(x, np.float64)
        p0 = int(np.asarray(pos).reshape(-1)[0])
        for t in range(x.shape[0]):
            p = p0 + t
            if 0 <= p < out.shape[0]:
                row = x[t].copy()
                row[:rotate] = apply_rope(row[:rotate], np.asarray(cos, np.float64)[p], np.asarray(sin, np.float64)[p])
                out[p] = row
        return out


@register
class Attention(OpDef):
    """ATTENTION(q [T,H,hd], k [C,H,hd], v [C,H,hd], pos [1] i32, cos, sin [C,hd/2], scale=, rope=True)
    -> [T,H,hd]: token t (position pos[0]+t, q RoPE-rotated there when rope) attends keys 0..pos[0]+t."""
    name, n_inputs = "ATTENTION", 6
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        q, k, v, pos, cos, sin = inputs
        nonempty(self.name, [q, k, v])
        check_params(self.name, params, ("scale", "rope"))
        _expect(self.name, "q (input 0, [T, heads, head_dim])", q, (None, None, None))
        T, H, hd = q.shape
        _expect(self.name, "k (input 1, [capacity, heads, head_dim])", k, (None, H, hd))
        _expect(self.name, "v (input 2, like k)", v, k.shape)
        _expect(self.name, "pos (input 3)", pos, (1,), "i32")
        if hd % 2:
            raise ValueError(f"{self.name}: head_dim must be even (RoPE pairs), got {hd}")
        _check_tables(self.name, cos, sin, k.shape[0], hd // 2)
        if "scale" not in params:
            raise ValueError(f"{self.name} needs scale=<finite number> (usually 1/sqrt(head_dim))")
        check_finite(f"{self.name} scale", params["scale"])
        if not isinstance(params.get("rope", True), bool):
            raise ValueError(f"{self.name}: rope must be True or False, got {params['rope']!r}")
        return (T, H, hd), "f32"

    def lower(self, node, device):
        q, k, v, pos, cos, sin = node.inputs
        out = node.output
        T, H, hd = q.shape
        half = hd // 2
        defs, extra = cluster_lanes(device, half, per_lane=2)
        defs["PAIRS"] = -(-half // defs["LANES"])
        if node.params.get("rope", True):
            defs["ROPE_Q"] = 1
        push = _push([T, H, half, k.shape[0], q.offset, *q.strides, k.offset, *k.strides,
                      v.offset, *v.strides, out.offset, *out.strides, pos.offset, cos.offset, sin.offset,
                      cos.strides[0]], [float(node.params["scale"])])
        return [Launch("attention", [q, pos, cos, sin, k, v, out], (6,), push,
                       grid_1d(T * H, 256 // defs["LANES"]), defines=defs, spec=(256,), **extra)]

    def reference(self, q, k, v, pos, cos, sin, scale, rope=True):
        q = np.asarray(q, np.float64)
        T, C = q.shape[0], np.asarray(k).shape[0]
        positions = int(np.asarray(pos).reshape(-1)[0]) + np.arange(T)
        out = np.full(q.shape, np.nan)
        ok = (positions >= 0) & (positions < C)
        if ok.any():
            qr = q[ok]
            if rope:
                cs, sn = np.asarray(cos, np.float64)[positions[ok]], np.asarray(sin, np.float64)[positions[ok]]
                qr = apply_rope(qr, cs[:, None, :], sn[:, None, :])
            out[ok] = reference_attention(qr, k, v, positions[ok], scale)
        return out


@register
class MoeRoute(OpDef):
    """MOE_ROUTE(logits [T,E], top_k=, router="softmax"|"sigmoid", norm=True, route_scale=1.0,
    n_shared=0) -> [T, top_k + n_shared, 2]: (expert id as an exact float, weight)."""
    name, n_inputs = "MOE_ROUTE", 1

    def infer(self, inputs, params):
        (lg,) = inputs
        nonempty(self.name, inputs)
        check_params(self.name, params, ("top_k", "router", "norm", "route_scale", "n_shared"))
        _expect(self.name, "logits (input 0, [T, experts])", lg, (None, None))
        E = lg.shape[1]
        k, s = params.get("top_k"), params.get("n_shared", 0)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(E, MAX_TOP_K):
            raise ValueError(f"{self.name}: top_k must be an integer in [1, {min(E, MAX_TOP_K)}] (experts: {E}), got {k!r}")
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_TOP_K:
            raise ValueError(f"{self.name}: n_shared must be an integer in [0, {MAX_TOP_K}], got {s!r}")
        if params.get("router", "sigmoid") not in ROUTERS:
            raise ValueError(f"{self.name}: router must be one of {ROUTERS}, got {params['router']!r}")
        if not isinstance(params.get("norm", True), bool):
            raise ValueError(f"{self.name}: norm must be True or False, got {params['norm']!r}")
        check_finite(f"{self.name} route_scale", params.get("route_scale", 1.0))
        return (lg.shape[0], k + s, 2), "f32"

    def lower(self, node, device):
        (lg,), out = node.inputs, node.output
        prm = node.params
        push = _push([lg.shape[0], lg.shape[1], lg.offset, *lg.strides, out.offset, *out.strides,
                      int(prm.get("norm", True))], [float(prm.get("route_scale", 1.0))])
        defs = {"TOP_K": prm["top_k"], "N_SHARED": prm.get("n_shared", 0),
                f"ROUTER_{prm.get('router', 'sigmoid').upper()}": 1}
        return [Launch("moe_route", [lg, out], (1,), push, grid_1d(lg.shape[0], 64), defines=defs, spec=(64,))]

    def reference(self, logits, top_k, router="sigmoid", norm=True, route_scale=1.0, n_shared=0):
        return reference_route(logits, top_k, router, norm, route_scale, n_shared)


@register
class MulMatId(OpDef):
    """MUL_MAT_ID(x, w [E,N,K], route [T,R,2][, add [T,N]], mode=):
    mode="swiglu": x [T, 1 or R, K], N = 2F -> [T,R,F] = silu(w[id,:F]·x)·(w[id,F:]·x);
    mode="sum":    x [T,R,K] -> [T,N] = Σ_r weight_r · w[id_r]·x[t,r] (+ add)."""
    name, n_inputs = "MUL_MAT_ID", None

    def infer(self, inputs, params):
        check_params(self.name, params, ("mode",))
        mode = params.get("mode")
        if mode not in ("swiglu", "sum"):
            raise ValueError(f"{self.name}: mode must be 'swiglu' or 'sum', got {mode!r}")
        if len(inputs) not in ((3,) if mode == "swiglu" else (3, 4)):
            raise ValueError(f"{self.name} mode={mode} takes x, w, route{', [add]' if mode == 'sum' else ''}; "
                             f"got {len(inputs)} inputs")
        nonempty(self.name, inputs)
        x, w, route = inputs[:3]
        _expect(self.name, "route (input 2, [T, routes, 2] from MOE_ROUTE)", route, (None, None, 2))
        T, R, _ = route.shape
        _expect(self.name, "w (input 1, [experts, N, K])", w, (None, None, None))
        E, N, K = w.shape
        _expect(self.name, f"x (input 0, [T, {'1 or ' if mode == 'swiglu' else ''}routes, K])", x, (T, None, K))
        if x.shape[1] not in ((1, R) if mode == "swiglu" else (R,)):
            raise ValueError(f"{self.name}: x has {x.shape[1]} rows per token, expected "
                             f"{'1 or ' if mode == 'swiglu' else ''}{R} (the routes)")
        for what, t in (("x", x), ("w", w)):
            _unit_last(self.name, what, t)
        if mode == "swiglu":
            if N % 2:
                raise ValueError(f"{self.name}: w [experts, 2F, K] needs an even N for gate and up rows, got {N}")
            return (T, R, N // 2), "f32"
        if len(inputs) == 4:
            _expect(self.name, "add (input 3, [T, N])", inputs[3], (T, N))
        return (T, N), "f32"

    def lower(self, node, device):
        x, w, route = node.inputs[:3]
        add = node.inputs[3] if len(node.inputs) == 4 else None
        out = node.output
        mode = node.params["mode"]
        T, R, _ = route.shape
        E, N, K = w.shape
        if x.shape[1] == 1:
            x = x.broadcast_to((T, R, K))
        cols = N // 2 if mode == "swiglu" else N
        lanes, extra = cluster_lanes(device, K, per_lane=8, max_lanes=1 if is_cpu(device) else None)
        defs = dict(lanes, **{f"MODE_{mode.upper()}": 1})
        aligned = [x.offset, x.strides[0], x.strides[1], w.offset, w.strides[0], w.strides[1], K]
        if all(a % 4 == 0 for a in aligned):
            defs["VEC4"] = 1
        o_strides = list(out.strides) if mode == "swiglu" else [out.strides[0], out.strides[1], 0]
        a = [add.offset, *add.strides] if add is not None else [0, 0, 0]
        push = _push([T, R, cols, K, E, x.offset, x.strides[0], x.strides[1], w.offset, w.strides[0],
                      w.strides[1], route.offset, *route.strides, out.offset, *o_strides, *a])
        args = [x, w, route] + ([add] if add is not None else []) + [out]
        if add is not None:
            defs["HAS_ADD"] = 1
        items = T * R * cols if mode == "swiglu" else T * cols
        return [Launch("mul_mat_id", args, (len(args) - 1,), push, grid_1d(items, 256 // defs["LANES"]),
                       defines=defs, spec=(256,), **extra)]

    def reference(self, x, w, route, add=None, mode=None):
        x, w, route = (np.asarray(a, np.float64) for a in (x, w, route))
        T, R, _ = route.shape
        ids = route[..., 0]
        valid = (ids >= 0) & (ids < w.shape[0]) & (ids == np.floor(ids))
        idx = np.where(valid, ids, 0).astype(np.int64)
        xb = np.broadcast_to(x, (T, R, x.shape[-1]))
        y = np.einsum("trnk,trk->trn", w[idx], xb)
        y[~valid] = np.nan
        if mode == "swiglu":
            F = w.shape[1] // 2
            return silu(y[..., :F]) * y[..., F:]
        out = np.einsum("tr,trn->tn", route[..., 1], y)
        return out if add is None else out + np.asarray(add, np.float64)


@register
class Sample(OpDef):
    """SAMPLE(logits [T,V], cfg [2] f32 = (temperature, top_k), state [2] i32 = (seed, counter)) -> [T] i32.
    Advances state's counter by T on the device (state is read and written)."""
    name, n_inputs = "SAMPLE", 3
    dtypes = ("f32", "i32")
    WORKGROUP = 64

    def infer(self, inputs, params):
        lg, cfg, state = inputs
        nonempty(self.name, [lg])
        check_params(self.name, params, ())
        _expect(self.name, "logits (input 0, [T, vocab])", lg, (None, None))
        _expect(self.name, "cfg (input 1, (temperature, top_k))", cfg, (2,))
        _expect(self.name, "state (input 2, (seed, counter))", state, (2,), "i32")
        if lg.shape[1] >= 1 << 24:
            raise ValueError(f"{self.name}: vocab {lg.shape[1]} must be < 2^24 (ids pass through exact floats)")
        return (lg.shape[0],), "i32"

    def lower(self, node, device):
        lg, cfg, state = node.inputs
        out = node.output
        defs, extra = cluster_lanes(device, lg.shape[1])
        defs["MAX_TOP_K"] = MAX_TOP_K
        push = _push([lg.shape[0], lg.shape[1], lg.offset, *lg.strides, cfg.offset, state.offset,
                      out.offset, out.strides[0]])
        return [Launch("sample", [lg, cfg, state, out], (2, 3), push, (1, 1, 1), defines=defs,
                       spec=(self.WORKGROUP,), **extra)]

    def reference(self, logits, cfg, state):
        cfg, state = np.asarray(cfg, np.float64), np.asarray(state).astype(np.int64)
        return reference_sample(logits, cfg[0], cfg[1], int(state[0]), int(state[1]))
