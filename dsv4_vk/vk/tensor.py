"""Device tensors: arrays that live on a device between calls (`dsv4_vk.Tensor`).

A tensor is one pooled buffer laid out like a graph storage, [guard | data | guard], so that
compiled programs can bind it directly (as a param) or copy it on the device (inputs, outputs)
without a host round trip. When the tensor is garbage collected (or `release()`d) its buffer goes
back to the device's pool.
"""
from __future__ import annotations

import math
import operator

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from .memory import GUARD, Buffer, guarded_buffer

if TYPE_CHECKING:
    from .device import Device

# f16 / bf16: weights kept in their checkpoint precision (the mat-vec and expert kernels read them);
# element offsets and strides stay in elements of the tensor's own dtype. numpy's bfloat16 comes
# from ml_dtypes (a dependency); without it everything but bf16 tensors still works.
DTYPES = {"f32": np.float32, "i32": np.int32, "f16": np.float16}
try:
    import ml_dtypes
    DTYPES["bf16"] = ml_dtypes.bfloat16
except ImportError:                     # pragma: no cover (a machine without the dependency)
    pass
_SUPPORTED = ("dtype {} is not supported: expected one of float32, int32, float16, bfloat16 "
              "(bfloat16 needs the ml_dtypes package)")


def dtype_name(dt) -> str:
    """'f32', 'i32', 'f16' or 'bf16' for a dtype given as a name, a numpy dtype or a type."""
    if isinstance(dt, str) and dt in DTYPES:
        return dt
    try:
        dt = np.dtype(dt)
    except TypeError:
        raise ValueError(_SUPPORTED.format(repr(dt))) from None
    for k, v in DTYPES.items():
        if dt == np.dtype(v):
            return k
    raise ValueError(_SUPPORTED.format(dt))


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name."""
    return np.dtype(DTYPES[dtype]).itemsize


def data_bytes(numel: int, dtype: str) -> int:
    """Bytes of `numel` elements, padded to a multiple of 4 (buffers hold whole 4-byte words)."""
    return -(-numel * itemsize(dtype) // 4) * 4


def _index(name, value) -> int:
    """An integer argument (int or numpy integer; not a float, not a bool), else a clear error."""
    if value.__class__ is int:
        return value
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _shape(shape) -> tuple[int, ...]:
    try:
        shape = tuple(_index("a dimension", s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    except ValueError:
        raise ValueError(f"shape must be a tuple of integers, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return shape


class Tensor:
    """An array on `device`: `.shape`, `.dtype`, `.numpy()`, `.write(array)`."""

    byte_offset = GUARD * 4         # where the data starts in the buffer (after the leading guard)
    # slots: every tensor has the same fixed layout, however it was made (__init__ or the pool's
    # per-call path), so the per-call attribute reads stay on the interpreter's fast path
    __slots__ = ("device", "shape", "dtype_name", "numel", "guarded", "buffer", "_pins", "__weakref__")

    def __init__(self, device: Device, shape: int | Sequence[int], dtype: DTypeLike = "f32", *,
                 host_visible: bool = False, fill_guards: bool = False, host_memory: bool = False):
        device.check_open()
        self._pins = 0                  # compiled programs binding this tensor in place
        self.buffer: Buffer | None = None
        self.device = device
        self.shape = _shape(shape)
        self.dtype_name = dtype_name(dtype)
        self.numel = math.prod(self.shape)
        heap = max((h.size for h in device.caps.memory_heaps), default=0)
        nbytes = data_bytes(self.numel, self.dtype_name)
        if heap and nbytes > heap:
            raise ValueError(f"a tensor of shape {self.shape} ({nbytes} bytes) is larger than {device.name}'s largest "
                             f"memory heap ({heap} bytes)")
        # guards get the sentinel only on request (executor params: guard checks then cover them);
        # a tensor made per call (op outputs) skips those writes
        self.guarded = fill_guards
        self.buffer = guarded_buffer(device, self.numel, None, host_visible, self.guarded,
                                     size=itemsize(self.dtype_name), host_memory=host_memory)

    @classmethod
    def _pooled_many(cls, device, specs) -> list["Tensor"]:
        """Output tensors from the pool with no checks, for (shape, dtype name, numel, pool bucket)
        specs known to be good (`pooled_spec`): the per-call path of compiled programs (one pool
        lock for all of them)."""
        bufs = device.pool.take([bucket for *_, bucket in specs])
        out = []
        for (shape, dtype_name, numel, _), buf in zip(specs, bufs):
            t = cls.__new__(cls)
            t.device, t.shape, t.dtype_name, t.numel, t.guarded, t.buffer, t._pins = \
                device, shape, dtype_name, numel, False, buf, 0
            out.append(t)
        return out

    @staticmethod
    def pooled_spec(device: Device, shape: tuple[int, ...], dtype_name: str, numel: int) -> tuple[Any, ...]:
        """What _pooled_many needs for tensors of this shape and dtype (computed once per program)."""
        return shape, dtype_name, numel, device.pool.bucket(data_bytes(numel, dtype_name) + 2 * GUARD * 4)

    @classmethod
    def from_array(cls, device: Device, array: ArrayLike, dtype: DTypeLike | None = None) -> "Tensor":
        a = np.asarray(array)
        if dtype is None:
            dtype = np.float32 if a.dtype == np.float64 else a.dtype
        t = cls(device, a.shape, dtype)
        t.write(a)
        return t

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.dtype_name])

    @property
    def _np_dtype(self) -> np.dtype:      # (subclasses may name their dtype differently)
        return np.dtype(DTYPES[self.dtype_name])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype_name)

    def _buf(self) -> Buffer:
        if self.buffer is None:
            self.device.check_open()
            raise ValueError("this tensor was released")
        return self.buffer

    def numpy(self) -> np.ndarray:
        """A host copy."""
        with self.device.in_use:        # (a close() in another thread waits for the read: Device.begin_use)
            raw = self._buf().read(GUARD * 4, self.nbytes).view(self._np_dtype)
        return raw.reshape(self.shape)

    def write(self, array: ArrayLike, start: int | None = None) -> None:
        """Overwrite the whole tensor with `array` (same shape; float64 is rounded to float32) or, with
        `start`, the flat elements [start, start + array.size)."""
        buf = self._buf()
        a = np.asarray(array)
        if start is None and a.shape != self.shape:
            raise ValueError(f"write of shape {a.shape} into a tensor of shape {self.shape}")
        want = self._np_dtype
        if a.dtype != want:
            if not (np.issubdtype(a.dtype, np.floating) and self.dtype_name == "f32") and \
                    not (np.issubdtype(a.dtype, np.integer) and self.dtype_name == "i32"):
                raise ValueError(f"write of dtype {a.dtype} into a {want} tensor")
            if self.dtype_name == "i32" and a.size and (a.min() < -2 ** 31 or a.max() >= 2 ** 31):
                raise ValueError(f"write of values outside int32's range into an i32 tensor "
                                 f"(from {a.min()} to {a.max()})")
            a = a.astype(want)
        start = 0 if start is None else _index("start", start)
        if start < 0 or start + a.size > self.numel:
            raise ValueError(f"writing {a.size} element(s) at {start} overruns the tensor's {self.numel}")
        with self.device.in_use:
            buf.write(np.ascontiguousarray(a), GUARD * 4 + start * itemsize(self.dtype_name))

    def read_at(self, start: int, count: int = 1) -> np.ndarray:
        """Elements [start, start + count) of the flat tensor (a few values without reading the rest)."""
        start, count = _index("start", start), _index("count", count)
        if start < 0 or count < 0 or start + count > self.numel:
            raise ValueError(f"reading {count} element(s) at {start} overruns the tensor's {self.numel}")
        size = itemsize(self.dtype_name)
        with self.device.in_use:
            return self._buf().read(GUARD * 4 + start * size, count * size).view(self._np_dtype).copy()

    def rows(self, start: int, stop: int) -> "TensorRows":
        """Rows [start, stop) of the first axis, as a copy source or destination for programs
        (an input, or an entry of `out=`): no data is copied until a program runs."""
        return TensorRows(self, start, stop)

    def release(self) -> None:
        """Give the buffer back now (it is also given back when the tensor is garbage collected).
        Refused while a compiled program binds the tensor: it would go on using the memory."""
        if self._pins:
            raise ValueError(f"{self!r} is bound in {self._pins} compiled program(s): release them (or drop "
                             "them) first")
        buf, self.buffer = self.buffer, None
        if buf is not None and not self.device.closed:
            self.device.pool.free(buf)

    def __del__(self):
        buf = getattr(self, "buffer", None)
        if buf is not None and not self.device._closed:
            self.device.pool.free_later(buf)     # no lock in a finalizer: the pool takes it back later

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """`np.asarray(tensor)`: a host copy of the data (as numpy() gives). The data lives on the device,
        so every conversion copies: copy=False (numpy 2: "never copy") is refused."""
        if copy is False:
            raise ValueError("a dsv4_vk.Tensor lives on a device: converting it to a numpy array always copies "
                             "(use np.asarray(t) or t.numpy(), not copy=False)")
        a = self.numpy()
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)

    def __repr__(self) -> str:
        # never raises: also for a tensor whose device was closed or whose construction failed half-way
        device = getattr(self, "device", None)
        name = getattr(getattr(device, "caps", None), "name", "?")
        dtype = DTYPES.get(getattr(self, "dtype_name", ""))
        state = ""
        if getattr(self, "buffer", None) is None:
            state = ", released"
        elif getattr(device, "_closed", False):
            state = ", device closed"
        return (f"<dsv4_vk.Tensor {getattr(self, 'shape', '?')} {np.dtype(dtype) if dtype else '?'} "
                f"on Device #{getattr(device, 'serial', '?')} {name!r}{state}>")


class TensorRows:
    """Rows [start, stop) of a device tensor's first axis (see Tensor.rows): programs copy from or
    into them on the device, e.g. to run a call too large for one binding in chunks of tokens."""

    def __init__(self, tensor: Tensor, start: int, stop: int):
        start, stop = _index("start", start), _index("stop", stop)
        if not tensor.shape or not 0 <= start <= stop <= tensor.shape[0]:
            raise ValueError(f"rows [{start}, {stop}) are not within the first axis of a tensor of shape {tensor.shape}")
        self.tensor, self.device, self.dtype_name = tensor, tensor.device, tensor.dtype_name
        self.shape = (stop - start,) + tensor.shape[1:]
        self.numel = math.prod(self.shape)
        self.byte_offset = tensor.byte_offset + start * math.prod(tensor.shape[1:]) * itemsize(tensor.dtype_name)

    @property
    def buffer(self) -> Buffer | None:
        return self.tensor.buffer

    def _buf(self) -> Buffer:
        return self.tensor._buf()

    def __repr__(self) -> str:
        return f"<rows {self.shape} of {self.tensor!r}>"
