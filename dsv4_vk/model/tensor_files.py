"""Tensors of safetensors files as the loader keeps them before they reach the device: `FILES` reads
byte ranges of a file's tensor and checks the values as they are read (non-finite floats, NaN
codes and scales: `CheckpointError` naming the file's tensor); `Lazy` (not read yet: shape, dtype,
a reader, and its bytes as file ranges), `join` (stacked or concatenated without reading), `Stream`
(a param's bytes copied from the files straight into device memory) and `QuantWeight` (DeepSeek's
FP8 / FP4 codes and scale bytes, kept as published)."""
from __future__ import annotations

import json
import math
import os
import threading
from bisect import bisect_right
from typing import NamedTuple

import ml_dtypes
import numpy as np
from safetensors import SafetensorError

from ..ops.quant import QUANT, QuantFormat, dequantize, quant_arrays

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": BF16, "F64": np.float64}
SCALE_SUFFIXES = (".weight_scale_inv", ".scale")      # a scale tensor's name: its weight's module + one of these
NP_DTYPES = dict(FLOAT_DTYPES, I64=np.int64, I32=np.int32, I16=np.int16, U32=np.uint32, U16=np.uint16,
                 F8_E4M3=np.uint8, F8_E8M0=np.uint8, I8=np.uint8, U8=np.uint8)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not match its config."""


class _Files:
    """Reads byte ranges of a safetensors file's tensors into given arrays with plain reads (pread),
    not a memory map: the pages of a mapped file count in the process's resident memory while it
    stays mapped, so a mapped checkpoint would end up resident whole. Thread-safe; each range is
    checked as it is read (_check_bytes). Up to `keep` files stay open with their parsed headers (a
    file rewritten since is opened again); close() closes them."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self.open: dict = {}        # file -> [fd, (inode, size, mtime), data start, header, readers]
        self.lock = threading.Lock()

    def _acquire(self, fn):
        st = os.stat(fn)
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self.lock:
            f = self.open.get(fn)
            if f is not None and f[1] == ident:
                f[4] += 1
                return f
        fd = os.open(fn, os.O_RDONLY)
        try:
            head = os.pread(fd, 8, 0)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n <= 0 or n > st.st_size - 8:
                raise SafetensorError(f"header length {n} does not fit the file of {st.st_size} bytes")
            try:
                header = json.loads(os.pread(fd, n, 8))
            except ValueError as e:
                raise SafetensorError(f"unreadable header ({e})") from None
        except BaseException:
            os.close(fd)
            raise
        f = [fd, ident, 8 + n, header, 1]
        with self.lock:
            old = self.open.pop(fn, None)
            self.open[fn] = f
            if old is not None:
                self._drop(old)
            for k in [k for k, g in self.open.items() if g[4] == 0][:max(0, len(self.open) - self.keep)]:
                self._drop(self.open.pop(k))
        return f

    @staticmethod
    def _drop(f):
        """Close an entry's file once no reader uses it (the last reader closes it otherwise)."""
        f[1] = None                 # (not found again)
        if f[4] == 0 and f[0] is not None:
            os.close(f[0])
            f[0] = None

    def _release(self, f):
        with self.lock:
            f[4] -= 1
            if f[1] is None:
                self._drop(f)

    def read(self, fn: str, key: str, dt: str, lo: int, out: np.ndarray) -> np.ndarray:
        """Bytes [lo, lo + out.size) of tensor `key` (dtype dt) of file fn into `out` (uint8), checked."""
        try:
            f = self._acquire(fn)
            try:
                fd, _, start, header, _ = f
                info = header.get(key)
                if not isinstance(info, dict) or info.get("dtype") != dt:
                    raise SafetensorError(f"tensor {key!r} of dtype {dt} is not in the file (it changed since it "
                                          "was opened?)")
                t0, t1 = info["data_offsets"]
                size = np.dtype(NP_DTYPES[dt]).itemsize
                if t1 - t0 != math.prod(info["shape"]) * size or lo < 0 or lo + out.size > t1 - t0:
                    raise SafetensorError(f"tensor {key!r} is truncated")
                if lo % size or out.size % size:        # (the checks look at whole values)
                    raise ValueError(f"{key}: bytes [{lo}, {lo + out.size}) are not whole {dt} values")
                view, at = out.data.cast("B"), start + t0 + lo
                while view.nbytes:
                    n = os.preadv(fd, [view], at)
                    if n <= 0:
                        raise SafetensorError(f"tensor {key!r} is truncated")
                    view, at = view[n:], at + n
            finally:
                self._release(f)
        except SafetensorError as e:
            raise CheckpointError(f"{fn}: not a valid safetensors file ({e})") from None
        except OSError as e:
            raise CheckpointError(f"{fn}: cannot be read ({e.strerror or e})") from None
        _check_bytes(fn, key, dt, out)
        return out

    def get(self, fn, key, dt, shape):
        """The whole tensor (shape), read and checked."""
        dtype = np.dtype(NP_DTYPES[dt])
        a = np.empty(math.prod(shape) * dtype.itemsize, np.uint8)
        return self.read(fn, key, dt, 0, a).view(dtype).reshape(shape)

    def close(self) -> None:
        with self.lock:
            for f in self.open.values():
                self._drop(f)
            self.open.clear()


FILES = _Files()
CHECK_BLOCK = 1 << 20           # bytes checked at a time (in cache, one scratch array a thread)
_scratch = threading.local()
# non-finite: |bits| (sign masked off) at least the all-ones exponent's; as unsigned words
_NONFINITE = {"F32": (np.uint32, 0x7FFFFFFF, 0x7F800000), "F16": (np.uint16, 0x7FFF, 0x7C00),
              "BF16": (np.uint16, 0x7FFF, 0x7F80), "F64": (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)}


def _masked_max(a: np.ndarray, mask: int) -> int:
    """max(a & mask) over an unsigned array, a block at a time (no temporary of a's size)."""
    per = CHECK_BLOCK // a.itemsize
    tmp = getattr(_scratch, "buf", None)
    if tmp is None:
        tmp = _scratch.buf = np.empty(CHECK_BLOCK, np.uint8)
    tmp = tmp.view(a.dtype)
    top = 0
    for i in range(0, a.size, per):
        x = a[i:i + per]
        t = tmp[:x.size]
        np.bitwise_and(x, a.dtype.type(mask), out=t)
        top = max(top, int(t.max()))
    return top


def _check_bytes(fn, key, dt, raw: np.ndarray) -> None:
    """Refuse (naming the file's tensor) the bytes of a tensor, or of whole elements of it, holding a
    non-finite value, an E4M3 NaN code or an E8M0 NaN scale: one masked max a block, no widening."""
    if raw.size == 0:
        return
    if dt in _NONFINITE:
        word, mask, inf = _NONFINITE[dt]
        if _masked_max(raw.view(word), mask) >= inf:
            raise CheckpointError(f"{fn}: tensor {key!r} holds non-finite values")
    elif dt == "F8_E4M3" and _masked_max(raw, 0x7F) == 0x7F:
        raise CheckpointError(f"{fn}: tensor {key!r} holds E4M3 NaN codes (0x7F / 0xFF)")
    elif (dt == "F8_E8M0" or (dt == "U8" and key.endswith(SCALE_SUFFIXES))) and int(raw.max()) == 255:
        raise CheckpointError(f"{fn}: scale {key!r} holds the E8M0 NaN byte 255")


def checked(fn, key, dt, a):
    """The values of a tensor just read (eagerly), refused as _check_bytes does."""
    _check_bytes(fn, key, dt, np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return a


class Lazy:
    """An array not read yet: its shape and dtype, and how to get it (read from the checkpoint's
    files, or joined from other lazy arrays) when np.asarray(lazy) or .load() asks, and, where
    known, its bytes as file ranges (spans). Model.load keeps large tensors lazy and streams each
    param's bytes from the files into the device (Stream), checked as they are read (non-finite
    values, NaN codes or scales: CheckpointError naming the file's tensor), so the host never holds
    a param, let alone the checkpoint."""

    __slots__ = ("shape", "dtype", "_get", "spans")

    def __init__(self, shape, dtype, get, spans=None):
        self.shape, self.dtype, self._get = tuple(shape), np.dtype(dtype), get
        # its bytes in order, where known without reading them: file ranges (Span), arrays' bytes
        # and opaque Lazy parts (read when streamed: Stream); None: only load() knows them
        self.spans = spans

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def load(self) -> np.ndarray:
        a = self._get()
        if tuple(a.shape) != self.shape or a.dtype != self.dtype:
            raise CheckpointError(f"a tensor read as {a.dtype} {list(a.shape)}, expected {self.dtype} "
                                  f"{list(self.shape)} (the file changed since it was opened?)")
        return a

    def __array__(self, dtype=None, copy=None):
        a = self.load()
        return a if dtype is None else a.astype(dtype)

    def rows(self, lo: int, hi: int) -> "Lazy":
        """Entries lo..hi-1 of the first axis, still lazy (their bytes a range of this one's)."""
        per = self.nbytes // self.shape[0]
        spans = None if self.spans is None else _cut(self.spans, lo * per, hi * per)
        return Lazy((hi - lo,) + self.shape[1:], self.dtype, lambda: np.asarray(self)[lo:hi], spans)

    def __repr__(self):
        return f"Lazy({self.dtype} {list(self.shape)})"


class Span(NamedTuple):
    """Bytes [lo, lo + n) of tensor `key` (safetensors dtype `dt`) of file `fn`."""
    fn: str
    key: str
    dt: str
    lo: int
    n: int


def _part_bytes(p) -> int:
    return p.n if isinstance(p, Span) else int(p.nbytes)


def _spans_of(a) -> list:
    """The byte parts of an array (its bytes), a Lazy with spans (those) or without (itself)."""
    if isinstance(a, Lazy):
        return [a] if a.spans is None else a.spans
    return [np.ascontiguousarray(a).view(np.uint8).reshape(-1)]


def _cut(spans: list, lo: int, hi: int) -> list:
    """The parts covering bytes [lo, hi) of `spans` (an opaque Lazy cut along its first axis)."""
    out, at = [], 0
    for p in spans:
        n = _part_bytes(p)
        a, b = max(lo, at), min(hi, at + n)
        if a < b:
            if a == at and b == at + n:
                out.append(p)
            elif isinstance(p, Span):
                out.append(p._replace(lo=p.lo + a - at, n=b - a))
            elif isinstance(p, Lazy):
                per = n // p.shape[0]
                if (a - at) % per or (b - at) % per:
                    raise AssertionError("a cut through a tensor's entries")
                out.append(p.rows((a - at) // per, (b - at) // per))
            else:
                out.append(p[a - at:b - at])
        at += n
    return out


def join(parts: list, new_axis: bool):
    """np.stack (new_axis) or np.concatenate of arrays, lazily where any part is Lazy."""
    op = np.stack if new_axis else np.concatenate
    if not any(isinstance(p, Lazy) for p in parts):
        return op(parts)
    first = parts[0].shape
    shape = (len(parts),) + first if new_axis else (sum(p.shape[0] for p in parts),) + first[1:]
    dts = {np.dtype(p.dtype) for p in parts}
    if len(dts) > 1:
        raise CheckpointError(f"cannot join tensors of dtypes {sorted(map(str, dts))}")
    dtype = dts.pop()

    def joined():
        """Each part read into its place in one array (a part at a time beside it, not two copies)."""
        out = np.empty(shape, dtype)
        at = 0
        for p in parts:
            n = 1 if new_axis else p.shape[0]
            out[at:at + n] = np.asarray(p)[None] if new_axis else np.asarray(p)
            at += n
        return out
    return Lazy(shape, dtype, joined, [q for p in parts for q in _spans_of(p)])


class Stream:
    """A device array's bytes as parts (file ranges: Span; arrays' bytes; zeros padding it to `shape`)
    for a streamed upload (core.Executor.stream_param): fill(view, start) puts bytes [start, start +
    view.size) into view, each file range read straight into it and checked there (_Files.read), so
    an expert stack is never joined on the host. An opaque Lazy part is read when the Stream is made."""

    def __init__(self, shape, dtype, parts: list):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        parts = [np.ascontiguousarray(p.load()).view(np.uint8).reshape(-1) if isinstance(p, Lazy) else p
                 for p in parts]
        have, want = sum(_part_bytes(p) for p in parts), self.nbytes
        if have > want:
            raise AssertionError(f"{have} bytes streamed into an array of {want}")
        if have < want:
            parts.append(np.zeros(want - have, np.uint8))
        self.parts = [p for p in parts if _part_bytes(p)]
        self.starts = np.cumsum([0] + [_part_bytes(p) for p in self.parts])[:-1].tolist()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def array(self) -> np.ndarray:
        """The whole array, filled in one go (on the host)."""
        out = np.empty(self.nbytes, np.uint8)
        self.fill(out, 0)
        return out.view(self.dtype).reshape(self.shape)

    def fill(self, view: np.ndarray, start: int) -> None:
        """Bytes [start, start + view.size) into view; a file range read must hold whole values of its
        tensor (Upload's chunks do: their sizes are multiples of 4096, and every part holds whole ones)."""
        end, first = start + view.size, start
        i = bisect_right(self.starts, start) - 1
        while start < end:
            p, at = self.parts[i], self.starts[i]
            b = min(end, at + _part_bytes(p))
            dst = view[start - first:b - first]
            if isinstance(p, Span):
                FILES.read(p.fn, p.key, p.dt, p.lo + start - at, dst)
            else:
                dst[:] = p[start - at:b - at]
            start, i = b, i + 1


STREAM_BYTES = 16 << 20     # arrays in memory from this size are streamed too (copied by the upload's threads)
_STREAMED = (np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.int32))


def _streams(a) -> bool:
    return (isinstance(a, Lazy) and a.spans is not None) or (isinstance(a, np.ndarray) and a.nbytes >= STREAM_BYTES)


def stream_of(a) -> Stream | None:
    """The Stream of a Lazy array whose bytes are known without reading them, or of a large array
    in memory (of a dtype the device keeps), else None."""
    if not _streams(a) or np.dtype(a.dtype) not in _STREAMED:
        return None
    return Stream(a.shape, a.dtype, _spans_of(a))


class QuantWeight:
    """A linear weight in DeepSeek's published low-precision format, bytes as published.
    fmt "fp8": codes uint8 [..., N, K] (E4M3), one E8M0 scale byte per 128 × 128 block;
    fmt "fp4": codes uint8 [..., N, K / 2] (E2M1, element 2j in the low nibble), one per 32 inputs.
    scale: uint8 [..., grids, rows, cols], the scale grid of every `grid_rows` rows (one matrix as
    published; stacked experts, or gate and up rows, keep one grid each). np.asarray(w) gives the
    float64 weights (exact: w = code value · 2^(s − 127))."""

    __slots__ = ("fmt", "codes", "scale", "grid_rows")

    def __init__(self, fmt: str, codes: np.ndarray, scale: np.ndarray, grid_rows: int | None = None):
        self.fmt, self.codes, self.scale = fmt, codes, scale
        self.grid_rows = codes.shape[-2] if grid_rows is None else grid_rows

    @property
    def format(self) -> QuantFormat:
        return QUANT[self.fmt]

    @property
    def shape(self) -> tuple:
        return self.codes.shape[:-1] + (self.codes.shape[-1] * (8 // self.format.bits),)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1]))

    def device_arrays(self) -> tuple:
        """(codes as int32 words [..., N, words a row], scale bytes as int32 words [n]): what the
        kernels bind (ops.quant.quant_arrays)."""
        return quant_arrays(np.asarray(self.codes), np.asarray(self.scale))

    def streams(self) -> tuple[Stream, Stream] | None:
        """What device_arrays gives, as Streams (codes, scale) where a part is Lazy (or large) and the
        rows are whole words (no padding between them), else None."""
        if not (_streams(self.codes) or isinstance(self.scale, Lazy)) or self.codes.shape[-1] % 4:
            return None
        codes = Stream(self.codes.shape[:-1] + (self.codes.shape[-1] // 4,), np.int32, _spans_of(self.codes))
        n = math.prod(self.scale.shape)
        return codes, Stream((-(-n // 4),), np.int32, _spans_of(self.scale))

    def __array__(self, dtype=None, copy=None):
        words, scale = self.device_arrays()
        w = dequantize(self.fmt, words, scale, self.shape[-1], self.rows // self.grid_rows)
        return w if dtype is None else w.astype(dtype)

    def matrix(self, m: int) -> "QuantWeight":
        """The m-th grid's rows (grid_rows of them) with their scale grid, as published."""
        gr, K = self.grid_rows, self.shape[-1]
        sr, sc = self.format.grid(gr, K)
        codes = np.asarray(self.codes).reshape(-1, self.codes.shape[-1])[m * gr:(m + 1) * gr]
        scale = np.asarray(self.scale).reshape(-1)[m * sr * sc:(m + 1) * sr * sc].reshape(sr, sc)
        return QuantWeight(self.fmt, codes, scale)

    def __repr__(self):
        return f"QuantWeight({self.fmt}, shape={list(self.shape)}, grid_rows={self.grid_rows})"


def stack_quant(parts: list, axis_new: bool) -> "QuantWeight":
    """QuantWeights of one format and grid_rows stacked: along a new first axis (experts) or
    along rows (gate then up): the grids follow one another, as the rows do."""
    fmt, gr = parts[0].fmt, parts[0].grid_rows
    if any(p.fmt != fmt or p.grid_rows != gr for p in parts):
        raise CheckpointError(f"cannot stack quantised weights of formats/grids "
                              f"{sorted({(p.fmt, p.grid_rows) for p in parts})}")
    return QuantWeight(fmt, join([p.codes for p in parts], axis_new), join([p.scale for p in parts], axis_new), gr)


def is_quant(a) -> bool:
    return isinstance(a, QuantWeight)


def all_finite(a) -> bool:
    """All values finite, without widening (checkpoints of many GB)."""
    dt = {BF16: "BF16", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
          np.dtype(np.float64): "F64"}.get(np.dtype(a.dtype))
    if dt is None:
        return bool(np.isfinite(a).all())
    word, mask, inf = _NONFINITE[dt]
    return _masked_max(np.ascontiguousarray(a).reshape(-1).view(word), mask) < inf
