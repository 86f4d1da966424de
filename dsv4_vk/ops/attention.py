"""Attention with a KV cache: KV_WRITE (RoPE + cache write at a device-side position) and ATTENTION
over the cache, with their float64 references and the RoPE tables.

Positions are never push constants: KV_WRITE and ATTENTION read `pos` (i32 [1], the position of
the first token of the chunk) from a buffer, so one recorded decode step serves every position.
"""
import numpy as np

from .base import (Launch, OpDef, check_finite, check_flag, check_in_place, check_params, cluster_lanes, expect,
                   grid_1d, nonempty, register, unit_last, view_fields)

def check_rope_tables(op, cos, sin, capacity, half):
    for what, t in (("cos", cos), ("sin", sin)):
        expect(op, f"{what} (RoPE table [capacity, head_dim/2])", t, (capacity, half))
        unit_last(op, what, t)
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
        expect(self.name, "cache (input 0, [capacity, slots, heads, head_dim])", cache, (None,) * 4)
        C, S, H, hd = cache.shape
        expect(self.name, "x (input 1, [T, slots, heads, head_dim] like the cache)", x, (None, S, H, hd))
        expect(self.name, "pos (input 2)", pos, (1,), "i32")
        if hd % 2:
            raise ValueError(f"{self.name}: head_dim must be even (RoPE pairs), got {hd}")
        check_rope_tables(self.name, cos, sin, C, hd // 2)
        rot = params.get("rotate", 0)
        if isinstance(rot, bool) or not isinstance(rot, int) or not 0 <= rot <= S:
            raise ValueError(f"{self.name}: rotate must be an integer in [0, {S}] (slots to RoPE-rotate), got {rot!r}")
        return cache.shape, "f32"

    def lower(self, node, device):
        cache, x, pos, cos, sin = node.inputs
        out = node.output
        check_in_place(out, cache, "KV_WRITE writes the cache", "the cache tensor given as input 0")
        C, S, H, hd = cache.shape
        T = x.shape[0]
        push = {"T": T, "S": S, "H": H, "half_dim": hd // 2, **view_fields("x", x.offset, x.strides),
                **view_fields("c", out.offset, out.strides), "capacity": C, "rotate": node.params.get("rotate", 0),
                "pos_off": pos.offset, "cos_off": cos.offset, "sin_off": sin.offset, "tab_s0": cos.strides[0]}
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
        expect(self.name, "q (input 0, [T, heads, head_dim])", q, (None, None, None))
        T, H, hd = q.shape
        expect(self.name, "k (input 1, [capacity, heads, head_dim])", k, (None, H, hd))
        expect(self.name, "v (input 2, like k)", v, k.shape)
        expect(self.name, "pos (input 3)", pos, (1,), "i32")
        if hd % 2:
            raise ValueError(f"{self.name}: head_dim must be even (RoPE pairs), got {hd}")
        check_rope_tables(self.name, cos, sin, k.shape[0], hd // 2)
        if "scale" not in params:
            raise ValueError(f"{self.name} needs scale=<finite number> (usually 1/sqrt(head_dim))")
        check_finite(f"{self.name} scale", params["scale"])
        check_flag(self.name, params, "rope", True)
        return (T, H, hd), "f32"

    def lower(self, node, device):
        q, k, v, pos, cos, sin = node.inputs
        out = node.output
        T, H, hd = q.shape
        half = hd // 2
        defs, extra = cluster_lanes(device, half, per_lane=2)
        pairs = -(-half // defs["LANES"])
        if node.params.get("rope", True):
            defs["ROPE_Q"] = 1
        push = {"T": T, "H": H, "half_dim": half, "capacity": k.shape[0], **view_fields("q", q.offset, q.strides),
                **view_fields("k", k.offset, k.strides), **view_fields("v", v.offset, v.strides),
                **view_fields("o", out.offset, out.strides), "pos_off": pos.offset, "cos_off": cos.offset,
                "sin_off": sin.offset, "tab_s0": cos.strides[0], "scale": float(node.params["scale"])}
        return [Launch("attention", [q, pos, cos, sin, k, v, out], (6,), push,
                       grid_1d(T * H, 256 // defs["LANES"]), defines=defs, spec=(256, pairs), **extra)]

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
