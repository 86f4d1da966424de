"""How an op is declared: once, with its shape rule, its lowering to kernel launches, its numpy
float64 reference and, for a fused op, its decomposition into primitive ops.

The executor lowers nodes through `lower`; the tests and the eval harness take `reference`
from the same declaration; a fused op's fallback is its `decompose`.
"""
from dataclasses import dataclass, field

import numpy as np

from ..tensor import Tensor

REGISTRY = {}
WORKGROUP = 256
MAX_GROUPS = 65535


@dataclass
class Launch:
    """One kernel dispatch. args are bound at 0..n-1; indices in `writes` are outputs."""
    shader: str
    args: list
    writes: tuple
    push: bytes
    grid: tuple
    defines: dict = field(default_factory=dict)
    spec: tuple = (WORKGROUP,)
    subgroup_size: int = None       # required subgroup size, when the kernel depends on it
    full_subgroups: bool = False
    label: str = ""


class OpDef:
    """Base of every op declaration. Subclasses set `name` and implement the hooks."""
    name = None
    n_inputs = None            # None: variadic
    dtypes = ("f32",)          # accepted input dtypes (per op, checked for every input)

    def infer(self, inputs, params):
        """Validate inputs/params; return (output shape, output dtype)."""
        raise NotImplementedError

    def lower(self, node, device):
        """List of Launch for `node` on `device`."""
        raise NotImplementedError

    def reference(self, *arrays, **params):
        """numpy float64 result for the same inputs and params."""
        raise NotImplementedError

    def __repr__(self):
        return f"<op {self.name}>"


def register(cls):
    op = cls()
    REGISTRY[op.name] = op
    return cls


def get_op(name):
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(sorted(REGISTRY))}") from None


# --- helpers shared by declarations ---------------------------------------------------------------

def grid_1d(n_items, per_group=WORKGROUP):
    """Workgroup grid covering n_items (≥1 group), folded into y beyond the 65535 x-limit.
    Kernels recover the flat group index as gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x."""
    groups = max(1, -(-int(n_items) // per_group))
    gx = min(groups, MAX_GROUPS)
    gy = -(-groups // gx)
    if gy > MAX_GROUPS:
        raise ValueError(f"{n_items} items need {groups} workgroups, more than {MAX_GROUPS}² per dispatch")
    return (gx, gy, 1)


def tensor_push(t):
    """[offset, stride0..3] of a tensor padded to 4 dimensions (elements)."""
    _, strides = t.padded()
    return [t.offset, *strides]


def shape_push(t):
    shape, _ = t.padded()
    return list(shape)


def check_finite(name, value):
    v = float(value)
    if not np.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return v


def broadcast_shapes(op, *shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"{op}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def is_tensor(x):
    return isinstance(x, Tensor)
