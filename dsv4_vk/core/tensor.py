"""Graph tensors: (storage, element offset, shape, element strides, dtype) with zero-copy views.

`GraphTensor` is a symbolic view inside one Graph; the array that lives
on a device between calls is `dsv4_vk.Tensor` (vk/tensor.py).

A `Storage` is one allocation a graph will place in one device buffer (input, constant,
intermediate or output). Views (reshape, permute, slice, broadcast) share the storage and only
change offset/shape/strides; kernels take any strided layout through their push constants.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence, cast

import numpy as np

from ..vk.tensor import DTYPES, dtype_name, itemsize  # noqa: F401  (one dtype table for graphs and devices)

if TYPE_CHECKING:
    from .graph import Graph

MAX_DIMS = 4


class Storage:
    """Backing memory of one or more tensors; kind is input / const / temp / output. zeroed (temps):
    set to zero when a program is built from the graph (the ops' counters; OpDef.scratch)."""

    def __init__(self, numel, dtype, kind, name=None, data=None, zeroed=False):
        self.numel, self.dtype, self.kind, self.name, self.data = int(numel), dtype, kind, name, data
        self.zeroed = bool(zeroed)

    @property
    def nbytes(self):
        return self.numel * itemsize(self.dtype)

    def __repr__(self):
        return f"Storage({self.kind} {self.name or ''} {self.numel}×{self.dtype})"


def contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _dims(args: tuple[int | Sequence[int], ...]) -> tuple[int, ...]:
    """(2, 3) from f(2, 3) or f((2, 3)) (reshape, permute)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return cast("tuple[int, ...]", args)


class GraphTensor:
    """A view of a graph storage (not data: graph functions and ops take and return these)."""

    def __init__(self, graph: Graph, storage: Storage, shape: Sequence[int], strides: Sequence[int] | None = None,
                 offset: int = 0):
        shape = tuple(int(s) for s in shape)
        if len(shape) > MAX_DIMS:
            raise ValueError(f"tensors have at most {MAX_DIMS} dimensions, got shape {shape}")
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        self.graph, self.storage, self.shape = graph, storage, shape
        self.strides = tuple(strides) if strides is not None else contiguous_strides(shape)
        self.offset = int(offset)

    # --- properties -----------------------------------------------------------------------------
    @property
    def dtype(self) -> str:
        return self.storage.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_contiguous(self) -> bool:
        return all(st == cs for n, st, cs in zip(self.shape, self.strides, contiguous_strides(self.shape)) if n != 1)

    def extent(self) -> tuple[int, int]:
        """(first, last+1) element of the storage this view can touch."""
        if self.numel == 0:
            return self.offset, self.offset
        hi = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + 1
        return self.offset, hi

    def padded(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shape and strides padded on the left to 4 dimensions (what kernels receive)."""
        pad = MAX_DIMS - self.ndim
        return (1,) * pad + self.shape, (0,) * pad + self.strides

    # --- views --------------------------------------------------------------------------------
    def _view(self, shape, strides, offset=None):
        return GraphTensor(self.graph, self.storage, shape, strides, self.offset if offset is None else offset)

    def reshape(self, *dims: int | Sequence[int]) -> GraphTensor:
        shape = _dims(dims)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.numel // known if s == -1 else s for s in shape)
        if math.prod(shape) != self.numel:
            raise ValueError(f"cannot reshape {self.shape} ({self.numel} elements) to {shape}")
        if not self.is_contiguous:
            raise ValueError(f"reshape of a non-contiguous view {self.shape} strides {self.strides}: "
                             "materialise it with cont() first")
        return self._view(shape, contiguous_strides(shape))

    def permute(self, *order: int | Sequence[int]) -> GraphTensor:
        axes = _dims(order)
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"permute axes {axes} are not a permutation of {self.ndim} dimensions")
        return self._view(tuple(self.shape[a] for a in axes), tuple(self.strides[a] for a in axes))

    def transpose(self, a: int = -2, b: int = -1) -> GraphTensor:
        axes = list(range(self.ndim))
        axes[a], axes[b] = axes[b], axes[a]
        return self.permute(axes)

    def broadcast_to(self, shape: Sequence[int]) -> GraphTensor:
        shape = tuple(shape)
        if len(shape) < self.ndim:
            raise ValueError(f"cannot broadcast {self.shape} to fewer dimensions {shape}")
        pad = len(shape) - self.ndim
        src_shape, src_strides = (1,) * pad + self.shape, (0,) * pad + self.strides
        strides = []
        for n, sn, st in zip(shape, src_shape, src_strides):
            if sn == n:
                strides.append(st if n != 1 else 0)
            elif sn == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
        return self._view(shape, tuple(strides))

    def __getitem__(self, idx):
        if not isinstance(idx, tuple):
            idx = (idx,)
        if sum(i is not Ellipsis for i in idx) > self.ndim:
            raise IndexError(f"too many indices for shape {self.shape}")
        if Ellipsis in idx:
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (self.ndim - len(idx) + 1) + idx[k + 1:]
        idx = idx + (slice(None),) * (self.ndim - len(idx))
        offset, shape, strides = self.offset, [], []
        for i, (n, st) in zip(idx, zip(self.shape, self.strides)):
            if isinstance(i, (int, np.integer)):
                i = int(i) + n if i < 0 else int(i)
                if not 0 <= i < n:
                    raise IndexError(f"index {i} out of range for dimension of size {n}")
                offset += i * st
            elif isinstance(i, slice):
                start, stop, step = i.indices(n)
                if step <= 0:
                    raise IndexError("only positive slice steps are supported")
                count = max(0, (stop - start + step - 1) // step)
                offset += start * st if count else 0
                shape.append(count)
                strides.append(st * step)
            else:
                raise IndexError(f"unsupported index {i!r}")
        return self._view(tuple(shape), tuple(strides), offset)

    def __repr__(self):
        return f"GraphTensor({self.shape}, {self.dtype}, strides={self.strides}, off={self.offset}, {self.storage.kind})"


