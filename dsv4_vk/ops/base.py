"""What every op family shares: the declaration base (re-exported from `dsv4_vk.core.opdef`), push
fields of tensor views by name, grid and lane-cluster sizing, and argument checks with one shape format.

Declaring an op: subclass `OpDef`, decorate with `@register`, implement `infer` (shape rule and
argument checks), `lower` (kernel launches; the push block as {field: value}, packed by name against
the shader's own block, variants by `defines` the shader header declares) and `reference` (float64 numpy).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from ..core.opdef import REGISTRY, WORKGROUP, Launch, OpDef, get_op, register
from ..core.tensor import GraphTensor

__all__ = ["REGISTRY", "WORKGROUP", "MAX_GROUPS", "Launch", "OpDef", "get_op", "register",
           "grid_1d", "tensor_push", "shape_push", "view_fields", "tensor_fields", "shape_fields", "check_finite",
           "broadcast_shapes", "format_shape",
           "check_shape", "expect", "unit_last", "check_in_place", "nonempty", "check_params", "next_pow2",
           "cluster_lanes", "workgroup_pow2", "workgroup_cluster_max", "is_cpu", "weight_defines", "WEIGHT_DTYPES"]

WEIGHT_DTYPES = ("f32", "bf16", "f16")

MAX_GROUPS = 65535


# --- grids and push blocks ------------------------------------------------------------------------

def grid_1d(n_items: int, per_group: int = WORKGROUP) -> tuple[int, int, int]:
    """Workgroup grid covering n_items (≥1 group), folded into y beyond the 65535 x-limit.
    Kernels recover the flat group index as gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x."""
    groups = max(1, -(-int(n_items) // per_group))
    gx = min(groups, MAX_GROUPS)
    gy = -(-groups // gx)
    if gy > MAX_GROUPS:
        raise ValueError(f"{n_items} items need {groups} workgroups, more than {MAX_GROUPS}² per dispatch")
    return (gx, gy, 1)


def tensor_push(t: GraphTensor) -> list[int]:
    """[offset, stride0..3] of a tensor padded to 4 dimensions (elements)."""
    _, strides = t.padded()
    return [t.offset, *strides]


def shape_push(t: GraphTensor) -> list[int]:
    shape, _ = t.padded()
    return list(shape)


def view_fields(prefix: str, offset: int, strides: Sequence[int], names: Sequence[str] | None = None) -> dict[str, int]:
    """A view's push fields by name: {prefix_off: offset, prefix_<name>: stride, ...}; names default
    to s0, s1, ... (the shaders' convention for a tensor's strides)."""
    names = [f"s{i}" for i in range(len(strides))] if names is None else names
    if len(names) != len(strides):
        raise ValueError(f"view_fields({prefix!r}): {len(strides)} strides for the names {list(names)}")
    return {f"{prefix}_off": int(offset), **{f"{prefix}_{n}": int(s) for n, s in zip(names, strides)}}


def tensor_fields(prefix: str, t: GraphTensor) -> dict[str, int]:
    """{prefix_off, prefix_s0..s3} of a tensor padded to 4 dimensions (tensor_push by name)."""
    _, strides = t.padded()
    return view_fields(prefix, t.offset, strides)


def shape_fields(t: GraphTensor) -> dict[str, int]:
    """{ne0..ne3}: a tensor's shape padded to 4 dimensions (shape_push by name)."""
    return {f"ne{i}": n for i, n in enumerate(shape_push(t))}


# --- argument checks --------------------------------------------------------------------------------

def format_shape(expected: Iterable[int | None]) -> str:
    """The one way shapes are written in messages: [24, *, 4] (* = any size)."""
    return "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"


def check_shape(name: str, shape: Sequence[int], expected: Sequence[int | None]) -> None:
    """expected: ints, or None (any size ≥ 1); ValueError naming the argument."""
    shape = tuple(shape)
    want = format_shape(expected)
    if len(shape) != len(expected):
        raise ValueError(f"{name} must have rank {len(expected)} (shape {want}), got shape {shape}")
    for s, e in zip(shape, expected):
        if (e is None and s < 1) or (e is not None and s != e):
            raise ValueError(f"{name} must have shape {want} with every dimension ≥ 1, got {shape}")


def expect(op: str, what: str, t: GraphTensor, shape: Sequence[int | None], dtype: str = "f32") -> None:
    """ValueError unless t has `shape` (None: any size ≥ 1) and dtype."""
    ok = t.ndim == len(shape) and all(e is None or s == e for s, e in zip(t.shape, shape))
    if not ok or t.dtype != dtype:
        raise ValueError(f"{op}: {what} must be {dtype} {format_shape(shape)}, got {t.dtype} {list(t.shape)}")


def unit_last(op: str, what: str, t: GraphTensor) -> None:
    """Kernels that read rows need unit stride along the last axis."""
    if t.shape[-1] > 1 and t.strides[-1] != 1:
        raise ValueError(f"{op}: {what} must have unit stride along its last axis (use CONT), got strides {t.strides}")


def check_in_place(out: GraphTensor, dst: GraphTensor, writes: str, given: str) -> None:
    """An op that writes dst in place was given out=dst (the same view): else the error
    '<writes> in place: pass out=<given>', e.g. writes "STORE_ROWS writes", given "the tensor given
    as input 0"."""
    if out.storage is not dst.storage or out.offset != dst.offset or out.strides != dst.strides:
        raise ValueError(f"{writes} in place: pass out=<{given}>")


def nonempty(op: str, tensors: Sequence[GraphTensor]) -> None:
    for i, t in enumerate(tensors):
        if t.numel == 0:
            raise ValueError(f"{op}: input {i} is empty (shape {t.shape}); expected at least one element")


def check_params(op: str, params: dict[str, Any], accepted: Iterable[str]) -> None:
    extra = set(params) - set(accepted)
    if extra:
        raise ValueError(f"{op}: unknown parameter(s) {sorted(extra)}; accepted: {list(accepted)}")


def check_flag(op: str, params: dict[str, Any], key: str, default: bool = False) -> bool:
    """The boolean parameter `key` (default when absent); anything but True or False is an error."""
    v = params.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"{op}: {key} must be True or False, got {v!r}")
    return v


def check_finite(name: str, value: Any) -> float:
    v = float(value)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return v


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{op}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


# --- lanes ----------------------------------------------------------------------------------------------

def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def is_cpu(device: Any) -> bool:
    return device.caps.is_cpu


def workgroup_pow2(device: Any, cap: int) -> int:
    """The largest power of two ≤ cap (≥ 1) and the device's workgroup limits: a workgroup size for
    kernels whose shared-memory reductions halve it step by step."""
    lim = device.caps.limits
    return 1 << (min(cap, lim.max_workgroup_invocations, lim.max_workgroup_size[0]).bit_length() - 1)


def workgroup_cluster_max(device: Any, cap: int) -> int:
    """Lanes of the largest workgroup-wide cluster (lanes.glsl -D LANES_WORKGROUP) a kernel may
    launch on this device: workgroup_pow2(device, cap), or 0 where the device lacks what its
    reduction needs (wg_reduce.glsl: subgroup arithmetic, subgroups of ≥ 4 lanes)."""
    sg = device.caps.subgroup
    if not sg.supports("basic", "arithmetic") or sg.min_size < 4:
        return 0
    return workgroup_pow2(device, cap)


def cluster_lanes(device: Any, n: int, per_lane: int = 4, max_lanes: int | None = None) -> tuple[dict, dict]:
    """(defines, launch kwargs) for kernels that reduce n values per cluster with lanes.glsl.

    Lanes per cluster: enough for about `per_lane` values each, at most max_lanes and the smallest
    subgroup the device may launch. A whole-subgroup cluster uses subgroupAdd/Max (with the subgroup
    size pinned where the device may vary it); a smaller one a shuffle butterfly; without subgroup
    ops, one lane. LANES is the shader's specialization constant (one SPIR-V for every value); the
    other define picks the reduction, which gates a subgroup extension."""
    sg = device.caps.subgroup
    lanes = min(max(1, sg.min_size), next_pow2(-(-int(n) // per_lane)), max_lanes or 1 << 30)
    extra = {"full_subgroups": True} if sg.full_subgroups else {}
    if lanes > 1 and lanes == sg.min_size and sg.supports("basic", "arithmetic"):
        if sg.min_size == sg.max_size:
            return {"LANES": lanes, "LANES_SUBGROUP_OPS": 1}, extra
        if sg.size_control and sg.required_size_compute:
            return {"LANES": lanes, "LANES_SUBGROUP_OPS": 1}, {**extra, "subgroup_size": lanes}
    if lanes > 1 and sg.supports("basic", "shuffle"):
        return {"LANES": lanes, "LANES_SHUFFLE": 1}, extra
    return {"LANES": 1}, {}


def weight_defines(w: GraphTensor) -> dict:
    """The shader defines of weights.glsl for a weight tensor's dtype (f32: none)."""
    return {"bf16": {"W_BF16": 1}, "f16": {"W_F16": 1}}.get(w.dtype, {})


# The cooperative-matrix shape every matrix-unit kernel here uses (m, n, k and the A, B, C, D types):
# MUL_MAT's, the grouped experts' and the prefill attention's, all through coopmat_unavailable.
COOPMAT_SHAPE = (16, 16, 16, "f16", "f16", "f32", "f32")


def coopmat_unavailable(device) -> str | None:
    """Why the matrix-unit kernels cannot run on `device` (None: they can)."""
    if getattr(device, "coopmat_disabled", False):
        return "DSV4_VK_DISABLE_COOPMAT=1 leaves VK_NV_cooperative_matrix off"
    sgc = device.caps.subgroup
    if not any((c.m, c.n, c.k, c.a, c.b, c.c, c.d) == COOPMAT_SHAPE for c in device.caps.coopmat):
        return "the device has no VK_NV_cooperative_matrix 16 × 16 × 16 fp16·fp16+fp32 shape"
    if not (sgc.min_size == sgc.max_size == 32 and sgc.full_subgroups and sgc.supports("basic")):
        return f"the kernel needs full 32-lane subgroups, the device has {sgc.min_size}–{sgc.max_size} lanes"
    return None
