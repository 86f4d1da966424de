"""How an op is declared: once, with its shape rule, its lowering to kernel launches, its numpy
float64 reference and, for a fused op, its decomposition into primitive ops.

The graph builder looks ops up here by name; the executor lowers nodes through `lower`; the tests
and the eval harness take `reference` from the same declaration. Op families live in `dsv4_vk.ops`
(and the hyper-connection ops in `dsv4_vk.hc`); importing them registers their declarations.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..vk.push import pack_fields

REGISTRY: dict[str, "OpDef"] = {}
WORKGROUP = 256


@dataclass
class Launch:
    """One kernel dispatch of `shaders/<shader>.comp`. args are bound at 0..n-1; indices in `writes`
    are outputs. `defines` pick a compile-time variant (only those the shader's header declares,
    so the wheel can ship them prebuilt); shape-dependent values go in `spec` or the push block."""
    shader: str
    args: list
    writes: tuple
    push: bytes | Mapping[str, Any]     # {field: value}: packed by name against the shader's push block (bytes then)
    grid: tuple
    defines: dict = field(default_factory=dict)
    spec: tuple = (WORKGROUP,)
    subgroup_size: int | None = None       # required subgroup size, when the kernel depends on it
    full_subgroups: bool = False
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.push, Mapping):
            self.push = pack_fields(self.shader, self.defines, self.push)


class OpDef:
    """Base of every op declaration. Subclasses set `name` and implement the hooks."""
    name: str = ""
    n_inputs: int | None = None            # None: variadic
    dtypes: tuple[str, ...] = ("f32",)     # accepted input dtypes (per op, checked for every input)
    # Indices of inputs the op also writes (a kernel with more than one result: the extra results
    # are empty tensors the caller made with Graph.empty, or params, passed in; its launches list
    # them in `writes`). The graph checks they are never graph inputs or constants.
    written_inputs: tuple[int, ...] = ()

    def infer(self, inputs: list, params: dict[str, Any]) -> tuple[tuple[int, ...], str]:
        """Validate inputs/params; return (output shape, output dtype)."""
        raise NotImplementedError

    def lower(self, node: Any, device: Any) -> list[Launch]:
        """List of Launch for `node` on `device`."""
        raise NotImplementedError

    def reference(self, *arrays: Any, **params: Any) -> Any:
        """numpy float64 result for the same inputs and params."""
        raise NotImplementedError

    def scratch(self, inputs: list, params: dict[str, Any]) -> dict[str, tuple]:
        """Working memory the op's launches need beside its output, {pool: (elements, dtype)} (none by
        default). A graph keeps one temp storage per pool name, as large as the largest request, shared
        by the nodes that ask for it (they run one after another, the recorder's barriers between
        them); `lower` reaches it with node.output.graph.scratch(pool). Asked under the graph's tuning.
        (elements, dtype, "zeroed"): the pool is zero when the program is built, and every launch
        that writes it must leave it zero when it ends (the "last workgroup" counters of
        shaders/last_group.glsl reset themselves), so each replay finds it zero again."""
        return {}

    def __repr__(self) -> str:
        return f"<op {self.name}>"


def register(cls: type[OpDef]) -> type[OpDef]:
    op = cls()
    REGISTRY[op.name] = op
    return cls


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(sorted(REGISTRY))}") from None
