"""Graph builder: inputs, constants, nodes (one primitive or fused kernel each) and outputs.

    g = Graph()
    x = g.input("x", (T, D))
    y = g.op("SCALE", x, a=2.0, b=1.0)
    g.output("y", y)
    Executor().run(g, x=array)       # -> {"y": array}
    prog = g.compile(device)         # or: a program you keep and call many times
    prog.run(x=array)                # -> {"y": array}; prog.replay(x=tensor, out={"y": tensor}) stays on the device

Composite ops (the HC ops) are graph functions that append either their fused node or their
unfused chain of primitive nodes; `g.paths` records which, and why.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Sequence
import math

import numpy as np

from ..vk import default_device
from .opdef import get_op
from .tuning import Tuning, current, tuned
from .tensor import DTYPES, GraphTensor, Storage, dtype_name
from ..vk.tensor import Tensor as DeviceTensor

if TYPE_CHECKING:
    from ..vk import Device
    from .executor import CompiledGraph


class Node:
    __slots__ = ("op", "inputs", "output", "params", "tag")

    def __init__(self, op, inputs, output, params, tag):
        self.op, self.inputs, self.output, self.params, self.tag = op, inputs, output, params, tag

    def __repr__(self):
        return f"Node({self.op.name}, {[t.shape for t in self.inputs]} -> {self.output.shape})"


class Graph:
    """tuning: the knobs this graph is built and lowered under (default: the tuning in effect here,
    `core.tuning.current()`); part of its signature, so a changed knob gives another program."""

    def __init__(self, tuning: Tuning | None = None) -> None:
        self.tuning = current() if tuning is None else tuning
        self.nodes: list[Node] = []
        self.inputs: dict[str, GraphTensor] = {}
        self.outputs: dict[str, GraphTensor] = {}
        self.storages: list[Storage] = []
        self.paths: list[tuple[str, str, str]] = []     # (composite op, path, reason) for every composite op built
        self.path_scopes: list[str] = []     # the scope each entry of paths was built in (Graph.scope; "" outside)
        self._tags: list[str] = []           # stack of tags (e.g. "HC_COMB/unfused") that label nodes
        self._scopes: list[str] = []
        self._scratch: dict[str, Storage] = {}  # the ops' working memory by pool name (OpDef.scratch)

    # --- leaves -----------------------------------------------------------------------------------
    def _storage(self, numel, dtype, kind, name=None, data=None):
        s = Storage(numel, dtype, kind, name, data)
        self.storages.append(s)
        return s

    def input(self, name: str, shape: Sequence[int], dtype: str = "f32") -> GraphTensor:
        if name in self.inputs:
            raise ValueError(f"graph input {name!r} declared twice")
        if dtype not in DTYPES:
            raise ValueError(f"input {name!r}: dtype {dtype!r} not supported; expected one of {list(DTYPES)}")
        t = GraphTensor(self, self._storage(math.prod(shape), dtype, "input", name), shape)
        self.inputs[name] = t
        return t

    def const(self, array: Any, name: str | None = None) -> GraphTensor:
        """A constant uploaded once when the graph is compiled (weights, eps tables...)."""
        a = np.asarray(array)
        dt = dtype_name(a.dtype) if a.dtype != np.float64 else "f32"
        a = np.ascontiguousarray(a, dtype=DTYPES[dt])
        return GraphTensor(self, self._storage(a.size, dt, "const", name, a), a.shape)

    def param(self, name: str, shape: Sequence[int], dtype: str = "f32") -> GraphTensor:
        """A named tensor that lives outside the graph, in the executor (`Executor.set_param`):
        weights shared by several graphs, KV caches that persist across replays."""
        for s in self.storages:
            if s.kind == "param" and s.name == name and s.data is None:
                if s.numel != math.prod(shape) or s.dtype != dtype:
                    raise ValueError(f"param {name!r} used with two shapes/dtypes")
                return GraphTensor(self, s, shape)
        return GraphTensor(self, self._storage(math.prod(shape), dtype, "param", name), shape)

    def bind(self, tensor: DeviceTensor, name: str | None = None) -> GraphTensor:
        """A device Tensor used by this graph in place (weights, caches, state: never copied);
        every program compiled from the graph reads and writes that tensor itself."""
        if not isinstance(tensor, DeviceTensor):
            raise ValueError(f"Graph.bind takes a dsv4_vk.Tensor, got {type(tensor).__name__}")
        for s in self.storages:
            if s.kind == "param" and s.data is tensor:
                return GraphTensor(self, s, tensor.shape)
        s = self._storage(tensor.numel, tensor.dtype_name, "param", name or f"bound#{len(self.storages)}", tensor)
        return GraphTensor(self, s, tensor.shape)

    def compile(self, device: Device | None = None, params: dict | None = None,
                timestamps: bool = False) -> CompiledGraph:
        """Record this graph on `device` (default: the process-wide device) into a program you keep:
        `run`/`replay`/`submit` it as often as needed. params: {name: dsv4_vk.Tensor} for `param` leaves."""
        from .executor import CompiledGraph
        return CompiledGraph(device or default_device(), self, timestamps, params)

    def empty(self, shape: Sequence[int], dtype: str = "f32", name: str | None = None) -> GraphTensor:
        return GraphTensor(self, self._storage(math.prod(shape), dtype, "temp", name), shape)

    def scratch(self, pool: str) -> GraphTensor:
        """The working memory `pool` of this graph's ops (OpDef.scratch), as one flat tensor."""
        if pool not in self._scratch:
            raise ValueError(f"no op of this graph asked for scratch pool {pool!r}; pools: {sorted(self._scratch)}")
        s = self._scratch[pool]
        return GraphTensor(self, s, (s.numel,))

    def _need_scratch(self, pool: str, numel: int, dtype: str, *how: str) -> None:
        if how not in ((), ("zeroed",)):
            raise ValueError(f"scratch pool {pool!r}: expected (elements, dtype) or (elements, dtype, 'zeroed'), "
                             f"got the extra {how!r}")
        zeroed = bool(how)
        s = self._scratch.get(pool)
        if s is None:
            s = self._storage(max(int(numel), 1), dtype, "temp", f"scratch:{pool}")
            s.zeroed = zeroed
            self._scratch[pool] = s
        elif s.dtype != dtype or s.zeroed != zeroed:
            raise ValueError(f"scratch pool {pool!r} asked for as {dtype}{' zeroed' * zeroed}, it is "
                             f"{s.dtype}{' zeroed' * s.zeroed}")
        else:
            s.numel = max(s.numel, int(numel))

    def output(self, name: str, tensor: GraphTensor) -> GraphTensor:
        if tensor.graph is not self:
            raise ValueError(f"output {name!r} belongs to another graph")
        self.outputs[name] = tensor
        return tensor

    # --- nodes ------------------------------------------------------------------------------------
    def op(self, name: str, *inputs: GraphTensor, out: GraphTensor | None = None, **params: Any) -> GraphTensor:
        """Append one node of op `name`; returns its output tensor (or `out`, a view written in place)."""
        op = get_op(name)
        if op.n_inputs is not None and len(inputs) != op.n_inputs:
            raise ValueError(f"{name} takes {op.n_inputs} input tensor(s), got {len(inputs)}")
        for i, t in enumerate(inputs):
            if not isinstance(t, GraphTensor):
                raise ValueError(f"{name}: input {i} must be a GraphTensor, got {type(t).__name__}")
            if t.graph is not self:
                raise ValueError(f"{name}: input {i} belongs to another graph")
            if t.dtype not in op.dtypes:
                raise ValueError(f"{name}: input {i} has dtype {t.dtype}; expected {' or '.join(op.dtypes)}")
        for i in op.written_inputs:
            if i < len(inputs) and inputs[i].storage.kind not in ("temp", "param"):
                raise ValueError(f"{name} writes its input {i}: pass a tensor made with Graph.empty (or a "
                                 f"param), got a {inputs[i].storage.kind} tensor")
        shape, dtype = op.infer(list(inputs), params)
        with tuned(self.tuning):
            for pool, (numel, sdtype, *how) in op.scratch(list(inputs), params).items():
                self._need_scratch(pool, numel, sdtype, *how)
        if out is None:
            out = self.empty(shape, dtype)
        elif tuple(out.shape) != tuple(shape) or out.dtype != dtype:
            raise ValueError(f"{name}: out has shape {out.shape} {out.dtype}, expected {tuple(shape)} {dtype}")
        self.nodes.append(Node(op, list(inputs), out, params, "/".join(self._tags)))
        return out

    class _Tag:
        def __init__(self, g, tag):
            self.g, self.tag = g, tag

        def __enter__(self):
            self.g._tags.append(self.tag)

        def __exit__(self, *exc):
            self.g._tags.pop()

    def tag(self, label: str) -> "Graph._Tag":
        """Context manager labelling the nodes built inside (used by profiling: GPU time per op)."""
        return Graph._Tag(self, label)

    def scope(self, label: str) -> "Graph._Scope":
        """Context manager naming the part of a model that the composite ops built inside belong to
        (a model's "layers.3.ffn"): path_scopes records it beside each entry of paths. Nodes' tags
        (and so profiles) are unchanged."""
        return Graph._Scope(self, label)

    class _Scope:
        def __init__(self, g, label):
            self.g, self.label = g, label

        def __enter__(self):
            self.g._scopes.append(self.label)

        def __exit__(self, *exc):
            self.g._scopes.pop()

    def record_path(self, op: str, path: str, reason: str) -> None:
        """Note which path a composite op took, and why, in the current scope (paths, path_scopes)."""
        self.paths.append((op, path, reason))
        self.path_scopes.append("/".join(self._scopes))

    # --- identity -----------------------------------------------------------------------------------
    def signature(self) -> str:
        """A key identifying the recorded command buffer this graph lowers to."""
        ids = {id(s): i for i, s in enumerate(self.storages)}
        h = hashlib.sha256(repr(self.tuning.key()).encode())

        def t(x):
            return (ids[id(x.storage)], x.shape, x.strides, x.offset, x.dtype)
        for s in self.storages:
            h.update(repr((s.kind, s.numel, s.dtype, s.name)).encode())
            if s.kind == "param" and s.data is not None:      # bound: the tensor is part of the identity
                h.update(repr(id(s.data)).encode())
            if s.kind == "const":
                h.update(hashlib.sha256(s.data.tobytes()).digest())
        for n in self.nodes:
            h.update(repr((n.op.name, [t(x) for x in n.inputs], t(n.output),
                           sorted(n.params.items()))).encode())
        h.update(repr(sorted((k, t(v)) for k, v in self.outputs.items())).encode())
        return h.hexdigest()
