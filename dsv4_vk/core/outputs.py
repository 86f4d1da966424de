"""Output recycling: the small result tensors a compiled graph hands out are handed out again once
their reference count says the caller dropped them (a decode loop then gets its outputs with no
pool round trip, and the same buffers keep the recorded copies' key)."""
from __future__ import annotations

import sys
from operator import attrgetter
from typing import Any
from weakref import getweakrefcount

from ..vk.tensor import Tensor

HOLD_BYTES = 1 << 20  # per compiled graph: outputs up to this size in all are kept and handed out again

_BUFFER = attrgetter("buffer")


def _refcounts(items):
    """The reference count of each of `items` (a list) as this function sees it."""
    return list(map(sys.getrefcount, items))


# reference counts tell whether a caller dropped a tensor only where they are exact: CPython with its
# GIL (not free-threaded builds, not interpreters without sys.getrefcount); elsewhere nothing is held
if hasattr(sys, "getrefcount") and getattr(sys, "_is_gil_enabled", lambda: True)():
    _SOLE = _refcounts([object()])[0]   # ... of an object nothing but that list refers to (calibrated
    #                                     here: the interpreter's own references differ between versions)
else:                                   # pragma: no cover
    HOLD_BYTES = 0
    _SOLE = None


class OutputRecycler:
    """New output tensors for one compiled graph (`alloc`: Tensor.pooled_spec of each), keeping the
    last ones where they are small in all (≤ HOLD_BYTES)."""

    def __init__(self, device: Any, alloc: list) -> None:
        self.device, self.alloc = device, alloc
        held = sum(spec[3] for spec in alloc)
        self.hold = held if 0 < held <= HOLD_BYTES else 0       # bytes of the outputs it keeps
        self.held: list | None = None                           # the tensors it handed out last
        self._sole = [_SOLE] * len(alloc)                       # their counts once nothing else holds them

    def take(self) -> list:
        """The outputs, in order: those handed out last where nothing refers to them any more (no
        variable, container or weak reference), new ones from the pool for the rest. The kept list
        itself: callers copy it, never change it."""
        held = self.held
        if held is None:
            outs = Tensor._pooled_many(self.device, self.alloc)
            if self.hold:
                self.held = outs
            return outs
        counts = _refcounts(held)
        if counts != self._sole or any(map(getweakrefcount, held)) or None in map(_BUFFER, held):
            for i, n in enumerate(counts):
                if n != _SOLE or held[i].buffer is None or getweakrefcount(held[i]):
                    held[i] = Tensor._pooled_many(self.device, self.alloc[i:i + 1])[0]
        return held

    def drop(self) -> None:
        self.held = None
