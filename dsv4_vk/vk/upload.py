"""Streamed uploads: many buffers written from byte sources (checkpoint files), the reads overlapped
with the copies and with each other, in bounded host memory.

`Upload.write(buf, offset, nbytes, fill)` has `fill(view, start)` put bytes [start, start + view.size)
of the source into `view` (a uint8 array of at most `chunk` bytes), on `workers` threads at once
(file reads and numpy checks release the GIL). Where the buffer is mapped (lavapipe, integrated GPUs)
fill writes into it in place; elsewhere into a ring of `workers + 2` mapped staging slots of `chunk`
bytes (host-cached memory where there is some: fill may read back what it wrote to check it), each
copied by its own submit while the next ones fill: host memory stays at the ring's bytes whatever the
source's size. The copies are waited for when the Upload ends (`with Upload(device) as up:`), which
also holds the device as a counted call (close() waits for it).
"""
from __future__ import annotations

import collections
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from .memory import Buffer, StagingRing

STREAM_CHUNK = 32 << 20          # bytes one fill call writes at most (a staging slot's size)
WORKERS: int | None = None       # fill threads of an Upload made without `workers` (None: default_workers())


def default_workers() -> int:
    """WORKERS, else 4 threads (at most one a core)."""
    return WORKERS if WORKERS is not None else max(1, min(4, os.cpu_count() or 1))


class Upload:
    """A stream of writes into device buffers (module docstring); a context manager."""

    def __init__(self, device, workers: int | None = None, chunk: int = STREAM_CHUNK):
        if workers is None:
            workers = default_workers()
        if chunk < 4096 or chunk % 4096 or workers < 1:
            raise ValueError(f"Upload: chunk must be a positive multiple of 4096 bytes and workers ≥ 1, got "
                             f"chunk={chunk}, workers={workers}")
        self.device, self.workers, self.chunk = device, workers, chunk
        self._pool: ThreadPoolExecutor | None = None
        self._ring: StagingRing | None = None
        self._entered = False

    def __enter__(self) -> "Upload":
        self.device.begin_use()
        self._entered = True
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="dsv4_vk-upload")
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            if self._ring is not None:
                self._ring.destroy()        # (waits for the copies still running)
        finally:
            self._pool = self._ring = None
            if self._entered:
                self._entered = False
                self.device.end_use()

    def write(self, buf: Buffer, offset: int, nbytes: int, fill: Callable[[np.ndarray, int], None]) -> None:
        """Bytes [0, nbytes) of a source, put by fill, to buf's bytes [offset, offset + nbytes); returns
        when every fill has run (the last copies may still be running: the Upload's end waits for them).
        An exception of a fill is raised here, the first in byte order, after the others ended."""
        if self._pool is None:
            raise RuntimeError("Upload.write outside `with Upload(device) as up:`")
        buf._check()
        if offset < 0 or offset + nbytes > buf.nbytes:
            raise ValueError(f"write of {nbytes} bytes at {offset} exceeds buffer of {buf.nbytes} bytes")
        chunks = [(s, min(self.chunk, nbytes - s)) for s in range(0, nbytes, self.chunk)]
        if buf._view is not None:           # mapped: filled in place
            _results([self._pool.submit(fill, buf._view[offset + s:offset + s + n], s) for s, n in chunks])
            return
        if self._ring is None:
            self._ring = StagingRing(self.device, self.workers + 2, self.chunk, cached=True)
        ring, pending = self._ring, collections.deque[tuple]()
        try:
            for s, n in chunks:
                slot = ring.take()          # (its last copy has finished; at most `workers` slots fill)
                pending.append((self._pool.submit(fill, slot.view[:n], s), slot, s, n))
                if len(pending) >= self.workers:
                    self._send(pending.popleft(), buf, offset)
            while pending:
                self._send(pending.popleft(), buf, offset)
        except BaseException:
            _results([p[0] for p in pending], raise_first=False)     # no fill still writes a slot
            ring.finish()                   # nor a copy the buffer (its owner may free it now)
            raise

    def _send(self, item, buf, offset):
        fut, slot, s, n = item
        fut.result()
        self._ring.copy(slot, slot.buf, 0, buf, offset + s, n)


def _results(futures: list[Future], raise_first: bool = True) -> None:
    """Wait for every future; raise the first one's exception (in list order)."""
    first = None
    for f in futures:
        try:
            f.result()
        except BaseException as e:      # noqa: PERF203 (each is waited for before raising)
            if first is None:
                first = e
    if first is not None and raise_first:
        raise first
