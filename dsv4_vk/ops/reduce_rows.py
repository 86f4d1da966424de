"""Ops over the last axis: SOFT_MAX, SUM_ROWS, RMS_NORM.

Each row is reduced by a cluster of subgroup lanes (shaders/lanes.glsl) sized by `cluster_lanes`
from the row length and the device's subgroup caps, down to one lane per row (no subgroup ops)
where a device has none — or, for few long rows (`row_workgroup`: decode, one token's D = 4096),
by a whole workgroup per row (subgroup sums + one shared-memory step), so that a row is spread
over WORKGROUP lanes instead of one subgroup's. Inputs are any strided views; outputs any views
of the right shape.
"""
import math

import numpy as np

from .base import (Launch, OpDef, check_finite, check_flag, check_in_place, check_params, cluster_lanes, grid_1d,
                   nonempty, register, shape_fields, shape_push, tensor_fields, view_fields, workgroup_cluster_max)
from .rope import Rope, StoreRows, check_rope_tables, rope_fields


def reference_rms_norm(x, w=None, eps=None):
    """float64 RMS_NORM of x's rows (last axis), times w when given."""
    x = np.asarray(x, np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * np.asarray(w, np.float64)


def reference_rope_rows(y, pos, cos, sin):
    """ROPE's float64 reference over y [T, ..., n] (token = first axis)."""
    y = np.asarray(y, np.float64)
    flat = y.reshape(y.shape[0], -1, y.shape[-1])
    return Rope().reference(flat, pos, cos, sin).reshape(y.shape)

WORKGROUP = 256    # a multiple of every subgroup size, so workgroups are whole subgroups
# A workgroup per row for rows at least this long when there are at most ROW_WG_MAX_ROWS of them:
# the cluster kernels put WORKGROUP / lanes rows in one workgroup, so few rows would keep only a
# few subgroups of the device busy, each walking its row serially.
ROW_WG_MIN_LEN = 256
ROW_WG_MAX_ROWS = 256


def row_workgroup(device, rows, n):
    """True when `rows` rows of n values are each reduced by a whole workgroup of WORKGROUP lanes
    (where the device can launch one: base.workgroup_cluster_max)."""
    return n >= ROW_WG_MIN_LEN and rows <= ROW_WG_MAX_ROWS and workgroup_cluster_max(device, WORKGROUP) == WORKGROUP


def row_launch(device, shader, x, out, w=None, scalar=0.0, op_define=None, rope=None, ring=False, scalar_name="eps"):
    """Launch of a per-row kernel: x rows (last axis) in, `out` (same leading shape, or with ring
    a ring of rows, ring_rows in the rope fields) written. rope: (inputs pos, cos, sin; their push
    fields) for RMS_NORM's rotation."""
    shape = shape_push(x)
    rows = shape[0] * shape[1] * shape[2]
    if row_workgroup(device, rows, shape[3]):
        defs, extra, per_group = {"LANES_WORKGROUP": 1}, {}, 1
    else:
        defs, extra = cluster_lanes(device, shape[3])
        per_group = WORKGROUP // defs["LANES"]
    if op_define:
        defs[op_define] = 1
    # both shaders: shape, x, out, their scalar (eps, softmax's scale), then (reduce_rows only) the weight view
    push = {**shape_fields(x), **tensor_fields("x", x), **tensor_fields("d", out), scalar_name: float(scalar)}
    if shader == "reduce_rows":
        push |= view_fields("w", w.offset, w.strides[:1], ("s",)) if w is not None else {"w_off": 0, "w_s": 0}
    push |= rope[1] if rope else {}
    if w is not None:
        defs["HAS_WEIGHT"] = 1
    args = [x] + ([w] if w is not None else []) + [out]
    if rope:
        defs["ROPE"] = 1
        args += rope[0]
    if ring:
        defs["RING"] = 1
    return Launch(shader, args, (len(args) - 1 - (3 if rope else 0),), push, grid_1d(rows, per_group),
                  defines=defs, spec=(WORKGROUP,), **extra)


@register
class SoftMax(OpDef):
    """softmax(x·scale) over the last axis, max-subtracted; same shape as x."""
    name, n_inputs = "SOFT_MAX", 1

    def infer(self, inputs, params):
        nonempty(self.name, inputs)
        check_params(self.name, params, ("scale",))
        check_finite("SOFT_MAX scale", params.get("scale", 1.0))
        return inputs[0].shape, "f32"

    def lower(self, node, device):
        return [row_launch(device, "softmax", node.inputs[0], node.output,
                           scalar=float(node.params.get("scale", 1.0)), scalar_name="scale")]

    def reference(self, x, scale=1.0):
        with np.errstate(invalid="ignore"):        # inf - inf in fully masked rows: NaN, as on the device
            z = np.asarray(x, np.float64) * scale
            e = np.exp(z - z.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)


@register
class SumRows(OpDef):
    """Σ over the last axis, keepdims: shape x.shape[:-1] + (1,)."""
    name, n_inputs = "SUM_ROWS", 1

    def infer(self, inputs, params):
        nonempty(self.name, inputs)
        check_params(self.name, params, ())
        x = inputs[0]
        if x.ndim == 0:
            raise ValueError("SUM_ROWS: input 0 is a scalar; expected at least one axis")
        return x.shape[:-1] + (1,), "f32"

    def lower(self, node, device):
        return [row_launch(device, "reduce_rows", node.inputs[0], node.output, op_define="OP_SUM_ROWS")]

    def reference(self, x):
        return np.asarray(x, np.float64).sum(axis=-1, keepdims=True)


@register
class RmsNorm(OpDef):
    """x / sqrt(mean(x², last axis) + eps), times w (shape (x.shape[-1],)) when given; eps required.
    rope=True: three more inputs pos [1] i32, cos, sin [capacity, half], and the result's trailing
    2·half channels rotated as ROPE does (token t = x's first axis at position pos[0] + t): DeepSeek-V4's
    q and kv norms and their RoPE in one dispatch.
    ring=True (with rope, x [T, n]): one more input, a ring dst [rows, n], and IN PLACE (out=dst):
    row t of the result is stored at dst row (pos[0] + t) % rows when its position is in [0,
    capacity=) (default: the tables' rows), as STORE_ROWS would store it — kv's norm, RoPE and cache
    write in one dispatch."""
    name, n_inputs = "RMS_NORM", None
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        check_params(self.name, params, ("eps", "rope", "ring", "capacity"))
        rope = check_flag(self.name, params, "rope")
        if check_flag(self.name, params, "ring"):
            return self._infer_ring(inputs, params, rope)
        if "capacity" in params:
            raise ValueError(f"{self.name}: capacity= is the ring's (ring=True), got it without a ring")
        n_rope = 3 if rope else 0
        if len(inputs) - n_rope not in (1, 2):
            raise ValueError(f"RMS_NORM takes x, optionally w{', then pos, cos, sin (rope=True)' if rope else ''}; "
                             f"got {len(inputs)} input tensors")
        nonempty(self.name, inputs)
        if "eps" not in params:
            raise ValueError("RMS_NORM needs eps=<finite number > 0>")
        eps = check_finite("RMS_NORM eps", params["eps"])
        if eps <= 0:
            raise ValueError(f"RMS_NORM eps must be > 0, got {params['eps']!r}")
        x = inputs[0]
        if x.ndim == 0:
            raise ValueError("RMS_NORM: input 0 (x) is a scalar; expected at least one axis")
        for i, t in enumerate(inputs[:len(inputs) - n_rope]):
            if t.dtype != "f32":
                raise ValueError(f"RMS_NORM: input {i} must be f32, got {t.dtype}")
        if len(inputs) - n_rope == 2 and tuple(inputs[1].shape) != (x.shape[-1],):
            raise ValueError(f"RMS_NORM: input 1 (w) has shape {inputs[1].shape}, expected ({x.shape[-1]},) "
                             "= the last dimension of x")
        if rope:
            if x.ndim < 2:
                raise ValueError(f"{self.name}: with rope, x must be [T, ..., n] (token first), got shape {x.shape}")
            check_rope_tables(self.name, *inputs[-3:], x.shape[-1])
        return x.shape, "f32"

    def _infer_ring(self, inputs, params, rope):
        if not rope:
            raise ValueError(f"{self.name}: ring=True stores rows at their positions: it needs rope=True (pos, cos, sin)")
        if len(inputs) not in (5, 6):
            raise ValueError(f"{self.name} ring=True takes x, optionally w, then pos, cos, sin, dst; "
                             f"got {len(inputs)} input tensors")
        x, dst = inputs[0], inputs[-1]
        self.infer(inputs[:-1], {k: v for k, v in params.items() if k in ("eps", "rope")})   # x, w, rope checks
        if x.ndim != 2 or dst.ndim != 2 or dst.shape[1] != x.shape[1] or dst.dtype != "f32":
            raise ValueError(f"{self.name} ring=True: x must be [T, n] and dst (the last input) f32 [rows, n]; "
                             f"got x {x.shape}, dst {dst.dtype} {dst.shape}")
        cap = params.get("capacity", inputs[-3].shape[0])
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= inputs[-3].shape[0]:
            raise ValueError(f"{self.name}: capacity must be an integer in [1, {inputs[-3].shape[0]}] (the RoPE "
                             f"tables' rows), got {cap!r}")
        return dst.shape, "f32"

    def lower(self, node, device):
        if node.params.get("ring"):
            return [self._lower_ring(node, device)]
        rope = node.params.get("rope", False)
        base = node.inputs[:len(node.inputs) - (3 if rope else 0)]
        w = base[1] if len(base) == 2 else None
        extra = None
        if rope:
            x, out = node.inputs[0], node.output
            if out.storage is x.storage:
                raise ValueError("RMS_NORM with rope=True reads x's rows back while it writes: out must not be x")
            tables = node.inputs[-3:]
            extra = (tables, {"rows_per_token": math.prod(x.shape[1:-1]), **rope_fields(*tables)})
        return [row_launch(device, "reduce_rows", node.inputs[0], node.output, w=w,
                           scalar=float(node.params["eps"]), op_define="OP_RMS_NORM", rope=extra)]

    def _lower_ring(self, node, device):
        x, dst, out = node.inputs[0], node.inputs[-1], node.output
        check_in_place(out, dst, "RMS_NORM ring=True writes", "the ring given as the last input")
        if out.storage is x.storage:
            raise ValueError("RMS_NORM ring=True reads x's rows back while it writes: the ring must not be x")
        tables = node.inputs[-4:-1]
        w = node.inputs[1] if len(node.inputs) == 6 else None
        push = rope_fields(*tables)
        push["capacity"] = node.params.get("capacity", push["capacity"])          # positions stored: [0, capacity)
        return row_launch(device, "reduce_rows", x, out, w=w, scalar=float(node.params["eps"]), op_define="OP_RMS_NORM",
                          rope=(tables, {"rows_per_token": 1, **push, "ring_rows": dst.shape[0]}), ring=True)

    def reference(self, x, *rest, eps=None, rope=False, ring=False, capacity=None):
        if ring:
            *rest, dst = rest
            y = self.reference(x, *rest, eps=eps, rope=True)
            cap = np.shape(rest[-2])[0] if capacity is None else capacity
            return StoreRows().reference(dst, y, rest[-3], capacity=cap)
        y = reference_rms_norm(x, rest[0] if len(rest) in (1, 4) else None, eps)
        if not rope:
            return y
        pos, cos, sin = rest[-3:]
        return reference_rope_rows(y, pos, cos, sin)
