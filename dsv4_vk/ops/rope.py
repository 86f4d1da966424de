"""Positions on the device: ROPE (partial, interleaved, the position read from a device buffer) and
STORE_ROWS (decode-cache rows written into a ring on the device), the RoPE tables and the checks and
push fields the attention, norm and compressor ops that rotate or store rows share.

Positions are never push constants: every op reads `pos` (i32 [1], the position of the chunk's
first token) from a buffer, so one recorded decode step serves every position.
"""
from __future__ import annotations

import numpy as np

from .base import (Launch, OpDef, check_flag, check_in_place, check_params, expect, grid_1d, nonempty, register, unit_last,
                   view_fields)

NAN = np.nan


def rope_table(freqs: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [capacity, len(freqs)] in float64: the angle of pair i at position p is p·freqs[i]."""
    ang = np.arange(capacity, dtype=np.float64)[:, None] * np.asarray(freqs, np.float64)[None, :]
    return np.cos(ang), np.sin(ang)


def reference_rope(x, positions, cos, sin, inverse=False):
    """x [T, H, n] with its trailing 2·half channels rotated by interleaved pairs at positions [T]."""
    x = np.array(x, np.float64)
    half = np.shape(cos)[1]
    cs = np.asarray(cos, np.float64)[positions][:, None, :]
    sn = np.asarray(sin, np.float64)[positions][:, None, :] * (-1.0 if inverse else 1.0)
    a, b = x[..., -2 * half::2].copy(), x[..., -2 * half + 1::2].copy()
    x[..., -2 * half::2] = a * cs - b * sn
    x[..., -2 * half + 1::2] = a * sn + b * cs
    return x


def positive_int(op: str, key: str, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{op}: {key} must be an integer ≥ 1, got {v!r}")
    return v


def positions(pos, T: int, capacity: int):
    """(the chunk's positions pos[0] + t, t < T; which of them lie in [0, capacity))."""
    p = int(np.asarray(pos).reshape(-1)[0]) + np.arange(T)
    return p, (p >= 0) & (p < capacity)


def check_rope_tables(op, pos, cos, sin, n):
    """pos [1] i32 and cos, sin [capacity, half] rotating the trailing 2·half of n channels."""
    expect(op, "pos (rope)", pos, (1,), "i32")
    expect(op, "cos (rope, [capacity, half])", cos, (None, None))
    expect(op, "sin (rope, like cos)", sin, cos.shape)
    for what, t in (("cos", cos), ("sin", sin)):
        unit_last(op, what, t)
    if cos.strides[0] != sin.strides[0]:
        raise ValueError(f"{op}: cos and sin must have the same row stride")
    if n % 2 or 2 * cos.shape[1] > n:
        raise ValueError(f"{op}: rows of {n} channels must be even and hold the {2 * cos.shape[1]} rotated ones")


def rope_fields(pos, cos, sin) -> dict[str, int]:
    """The push fields of a kernel that rotates as it writes (rope.glsl's tables): half, capacity,
    pos, cos and sin offsets, the tables' row stride."""
    return {"half_rd": cos.shape[1], "capacity": cos.shape[0], "pos_off": pos.offset, "cos_off": cos.offset,
            "sin_off": sin.offset, "tab_s0": cos.strides[0]}


@register
class Rope(OpDef):
    """ROPE(x [T,H,n], pos [1] i32, cos, sin [capacity, half], inverse=False) -> [T,H,n]: the
    trailing 2·half channels rotated at position pos[0]+t (inverse: by −p); the rest copied."""
    name, n_inputs = "ROPE", 4
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        x, pos, cos, sin = inputs
        nonempty(self.name, [x, cos])
        check_params(self.name, params, ("inverse",))
        expect(self.name, "x (input 0, [T, heads, n])", x, (None, None, None))
        unit_last(self.name, "x", x)
        check_rope_tables(self.name, pos, cos, sin, x.shape[2])
        check_flag(self.name, params, "inverse")
        return x.shape, "f32"

    def lower(self, node, device):
        x, pos, cos, sin = node.inputs
        out = node.output
        T, H, n = x.shape
        push = {"T": T, "H": H, "n2": n // 2, **view_fields("x", x.offset, x.strides[:2]),
                **view_fields("o", out.offset, out.strides[:2]), **rope_fields(pos, cos, sin)}
        defs = {"INVERSE": 1} if node.params.get("inverse") else {}
        return [Launch("rope", [x, pos, cos, sin, out], (4,), push, grid_1d(T * H * (n // 2)), defines=defs)]

    def reference(self, x, pos, cos, sin, inverse=False):
        x = np.asarray(x, np.float64)
        p, ok = positions(pos, x.shape[0], np.shape(cos)[0])
        out = np.full(x.shape, NAN)
        out[ok] = reference_rope(x[ok], p[ok], cos, sin, inverse)
        half = np.shape(cos)[1]
        out[~ok, :, :x.shape[2] - 2 * half] = x[~ok, :, :x.shape[2] - 2 * half]
        return out


@register
class StoreRows(OpDef):
    """STORE_ROWS(dst [rows, n], x [T, n], pos [1] i32, capacity=rows), IN PLACE (out=dst):
    dst[(pos[0]+t) % rows] = x[t] for positions in [0, capacity) (dst: a ring of the last rows)."""
    name, n_inputs = "STORE_ROWS", 3
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        dst, x, pos = inputs
        nonempty(self.name, [dst, x])
        check_params(self.name, params, ("capacity",))
        positive_int(self.name, "capacity", params.get("capacity", 1))
        expect(self.name, "dst (input 0, [rows, n])", dst, (None, None))
        expect(self.name, "x (input 1, [T, n])", x, (None, dst.shape[1]))
        expect(self.name, "pos (input 2)", pos, (1,), "i32")
        for what, t in (("dst", dst), ("x", x)):
            unit_last(self.name, what, t)
        return dst.shape, "f32"

    def lower(self, node, device):
        dst, x, pos = node.inputs
        out = node.output
        check_in_place(out, dst, "STORE_ROWS writes", "the tensor given as input 0")
        T, n = x.shape
        push = {"T": T, "n": n, "capacity": node.params.get("capacity", dst.shape[0]), "rows": dst.shape[0],
                **view_fields("x", x.offset, x.strides[:1]), **view_fields("d", out.offset, out.strides[:1]),
                "pos_off": pos.offset}
        return [Launch("store_rows", [x, pos, out], (2,), push, grid_1d(T * n))]

    def reference(self, dst, x, pos, capacity=None):
        out = np.array(dst, np.float64)
        p, ok = positions(pos, np.shape(x)[0], out.shape[0] if capacity is None else capacity)
        for t in np.flatnonzero(ok):                 # in order: a later row wins a shared slot
            out[p[t] % out.shape[0]] = np.asarray(x, np.float64)[t]
        return out
