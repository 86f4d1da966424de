"""Staging for devices whose memory the host cannot map: one mapped upload and one mapped download
buffer per compiled graph, so that numpy inputs and read-back outputs travel in the run's own submit
(copies around the recording) instead of a staging submit each."""
from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np

from ..vk import Buffer, Device

ALIGN = 256         # bytes between the starts of two arrays in a staging buffer


class Staging(NamedTuple):
    up: Buffer                  # numpy inputs, written by the host
    up_at: dict[str, int]       # input name -> byte offset in `up`
    down: Buffer                # read-back outputs, copied there by the run
    down_at: dict[str, int]     # output name -> byte offset in `down`

    @classmethod
    def make(cls, device: Device, inputs: Iterable[tuple[str, int]], outputs: Iterable[tuple[str, int]]) -> Staging:
        """Buffers laid out for (name, bytes) of the inputs and the (contiguous) outputs."""
        def layout(sizes):
            offs, end = {}, 0
            for k, n in sizes:
                offs[k], end = end, end + -(-n // ALIGN) * ALIGN
            return offs, end
        up_at, up_bytes = layout(inputs)
        down_at, down_bytes = layout(outputs)
        up, down = (Buffer(device, max(4, b), host_visible=True) for b in (up_bytes, down_bytes))
        return cls(up, up_at, down, down_at)

    @property
    def buffers(self) -> tuple[Buffer, Buffer]:
        return self.up, self.down

    @property
    def nbytes(self) -> int:
        return self.up.nbytes + self.down.nbytes

    def write(self, name: str, a: np.ndarray) -> None:
        """Put a contiguous host input into its slot of the upload buffer."""
        off = self.up_at[name]
        self.up._view[off:off + a.nbytes] = a.view(np.uint8).reshape(-1)

    def read(self, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A copy of an output the run copied into the download buffer."""
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        off = self.down_at[name]
        return self.down._view[off:off + n].view(dtype).reshape(shape).copy()
