"""Lowers a Graph to one recorded command buffer, caches it by graph signature and replays it.

The parts live beside it in `core`: `lowering` (nodes to launches under the graph's tuning),
`recording` (launches into one command buffer), `copysets` (the recorded copies around it, per set
of device-tensor arguments), `staging` (mapped buffers where device memory is not host-visible) and
`outputs` (small results handed out again once dropped). Calls into the device are counted with
`device.in_use` (Device.begin_use), which close() waits for.

Every storage gets its own pooled buffer laid out as [guard | data | guard]; the guards are filled
with a sentinel when the graph is compiled and `check_guards()` tells whether any kernel wrote
outside its tensor. Inputs are written into their buffers (host arrays) or copied into them on the
device (device Tensors) before each replay; outputs are read back, copied into device Tensors
(`out=`), or left on the device. No recording happens on replay: device-tensor copies go into small
command buffers submitted with the recording, in the same vkQueueSubmit.
"""
from __future__ import annotations

import collections
import functools
import threading
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np
from numpy.typing import ArrayLike

from . import profile
from .copysets import CopySets
from .outputs import OutputRecycler
from .recording import record_graph
from .staging import Staging
from .tensor import DTYPES, dtype_name, itemsize
from ..vk import Buffer, default_device
from ..vk.memory import GUARD, SENTINEL, guarded_buffer, guards_intact  # noqa: F401  (re-exported)
from ..vk.tensor import Tensor as DeviceTensor, TensorRows, data_bytes
from ..vk.upload import Upload

if TYPE_CHECKING:
    from ..vk import Device
    from .graph import Graph
    from .tensor import GraphTensor

_DEVICE_TYPES = (DeviceTensor, TensorRows)


def _merged_inputs(inputs, kw):
    """The inputs dict with keyword inputs added (submit/replay/run take both)."""
    return {**(inputs or {}), **kw} if kw else inputs


_NOTHING: frozenset = frozenset()
_NO_ARGS: dict = {}     # (never written)
_COPY_STATE = attrgetter("buffer", "byte_offset", "shape", "dtype_name")   # what a tensor's copy depends on (its
#                                                                     buffer belongs to its device)


def _counted(method):
    """`method` (of an object with a `device`) counted as a call inside the device (Device.begin_use):
    close() waits for it to return before it destroys anything, and refuses it once closing."""
    @functools.wraps(method)
    def counted(self, *args, **kw):
        with self.device.in_use:
            return method(self, *args, **kw)
    return counted


class RunStats:
    """What one run did: dispatches, barriers, submits, paths of composite ops, GPU time."""

    def __init__(self, compiled: CompiledGraph, gpu_ns: np.ndarray | None = None):
        self.dispatches = compiled.recording.n_dispatches
        self.barriers = compiled.recording.n_barriers
        self.submits = 1
        self.paths = list(compiled.graph.paths)
        self.labels = list(compiled.recording.labels)
        self.details = compiled.dispatch_details     # per dispatch: shader, variant, shapes (not copied)
        self.gpu_ns = gpu_ns           # per dispatch, when timestamps were recorded

    def per_label(self) -> dict[str, tuple[int, float]]:
        """{label: (dispatches, gpu ns)} aggregated over dispatch labels."""
        out: dict[str, tuple[int, float]] = collections.OrderedDict()
        for i, lab in enumerate(self.labels):
            n, t = out.get(lab, (0, 0.0))
            out[lab] = (n + 1, t + (float(self.gpu_ns[i]) if self.gpu_ns is not None else 0.0))
        return out

    def __repr__(self):
        return (f"RunStats(dispatches={self.dispatches}, barriers={self.barriers}, "
                f"paths={[(p[0], p[1]) for p in self.paths]})")


class Submission:
    """One submitted run of a compiled graph: `wait()` blocks until the GPU finished it (then its
    outputs can be read), `done()` polls. Holds the device tensors it copies until then."""

    def __init__(self, compiled: CompiledGraph, keep: Any):
        self.compiled, self._keep, self._waited = compiled, keep, False

    def done(self) -> bool:
        return self._waited or self.compiled._fence_signalled()

    def wait(self) -> None:
        if not self._waited:
            cg = self.compiled
            dev = cg.device
            with dev.in_use:        # close() destroys the fence only after this wait
                dev.wait(cg.recording.fence_arr)
            self._waited, self._keep = True, None
            if cg._pending is self:
                cg._pending = None
            cg._finished()


class CompiledGraph:
    """A graph recorded once on a device and run many times (a "program").

    `run(inputs)` → {output: numpy array}; `replay(inputs)` leaves the outputs on the device (`read`
    them, or give `out={name: Tensor}`); `submit(inputs)` returns a Submission at once, so the host
    can prepare the next step while the GPU runs. Inputs are numpy arrays or device Tensors (copied
    on the device). A compiled graph serves one caller at a time: run/replay hold its lock. Every
    call that touches the device's handles is counted (Device.begin_use): a close() in another
    thread waits for it, and once closing the call raises DeviceClosed."""

    def __init__(self, device: Device, graph: Graph, timestamps: bool = False,
                 params: Mapping[str, DeviceTensor] | None = None, repeat: int = 1):
        """repeat: record the graph's dispatches that many times back to back in the one command
        buffer (barriers between repetitions where one reads what another wrote). Benchmarks use it
        to share per-submit costs; multi-step decode to run K steps per submit: repetitions differ
        only through device state the graph itself advances (a position param moved on by
        STORE_AT's `advance`), so nothing is re-recorded and the host writes nothing between them."""
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise ValueError(f"repeat must be an integer ≥ 1, got {repeat!r}")
        device.check_open()
        self.device, self.graph, self.timestamps = device, graph, timestamps
        self.repeat = repeat
        self.buffers: dict[int, Buffer] = {}
        self._owned: list[Buffer] = []
        self._unguarded: set[int] = set()
        self._pinned: list[DeviceTensor] = []    # device tensors bound as params
        self._lock = threading.RLock()
        self._pending: Submission | None = None
        self._io = CopySets()                    # the recorded copies around the recording, per argument set
        self._stage: Staging | None = None       # made on first use where memory is not host-visible
        self._staged = _NOTHING                  # outputs of the last run waiting in the download buffer
        self._fast = None                        # (names, _COPY_STATE of each, VkSubmitInfo of the copies or
        #                                          None, the VkSubmitInfo submitted) of the last run's
        #                                          device tensors, when it had nothing else (_start)
        self.stats: RunStats | None = None
        self.dispatch_details: list = []         # per dispatch, for profiles: what ran (dispatch_detail)
        self._check_ranges()
        self._build(params)
        self.nbytes = sum(b.nbytes for b in self._owned)
        self._io_specs()

    @property
    def copy_recordings(self) -> int:
        """Copy sets recorded so far (a new key each: benchmarks watch it)."""
        return self._io.recorded

    @_counted
    def _build(self, params):
        """The storages' buffers and the recording; whatever was made goes back if any step fails."""
        device, graph = self.device, self.graph
        try:
            for s in graph.storages:
                if s.kind == "param":
                    self.buffers[id(s)] = self._param_buffer(s, params)
                    continue
                data = s.data if s.kind == "const" else np.zeros(s.numel, DTYPES[s.dtype]) if s.zeroed else None
                buf = guarded_buffer(device, s.numel, data, size=itemsize(s.dtype))
                self.buffers[id(s)] = buf
                self._owned.append(buf)
            self.recording, self.dispatch_details = record_graph(device, graph, self.buffers, self.timestamps,
                                                                 self.repeat)
        except BaseException:
            for buf in self._owned:
                device.pool.free(buf)
            self._owned = []
            self._unpin()
            raise

    def _check_ranges(self):
        """Refuse (before allocating anything) a storage that could not be bound whole."""
        limit = self.device.caps.limits.max_storage_buffer_range
        for i, s in enumerate(self.graph.storages):
            if s.nbytes > limit:
                raise ValueError(f"{s.kind} tensor {s.name or '#' + str(i)} of {s.nbytes} bytes exceeds this "
                                 f"device's maxStorageBufferRange of {limit} bytes ({self.device.name}): "
                                 "each tensor is bound whole, so split the work into smaller calls (fewer tokens, "
                                 "where the tensor holds one row per token)")

    def _param_buffer(self, s, params):
        p = s.data if s.data is not None else (params or {}).get(s.name)
        if p is None:
            raise ValueError(f"graph uses param {s.name!r} but the executor has none: "
                             "call Executor.set_param first (or bind a device Tensor with Graph.bind)")
        if not isinstance(p, DeviceTensor):
            raise ValueError(f"param {s.name!r} must be a dsv4_vk.Tensor, got {type(p).__name__}")
        if p.device is not self.device:
            raise ValueError(f"param {s.name!r} lives on {p.device!r}, the graph is compiled for {self.device!r}")
        if p.numel != s.numel or p.dtype_name != s.dtype:
            raise ValueError(f"param {s.name!r} holds {p.numel} {p.dtype_name}, graph wants {s.numel} {s.dtype}")
        if not p.guarded:
            self._unguarded.add(id(s))
        buf = p._buf()
        p._pins += 1                 # released while this program binds it: refused (Tensor.release)
        self._pinned.append(p)
        return buf

    # --- inputs and outputs ---------------------------------------------------------------------------
    def _input(self, name):
        t = self.graph.inputs.get(name)
        if t is None:
            raise ValueError(f"graph has no input {name!r}; inputs are {sorted(self.graph.inputs)}")
        return t

    def _host_input(self, name, array):
        t = self._input(name)
        a = np.asarray(array)
        want = DTYPES[t.dtype]
        if a.shape != t.shape:
            raise ValueError(f"input {name!r} has shape {a.shape}, expected {t.shape}")
        if a.dtype != want:
            if not (np.issubdtype(a.dtype, np.floating) and want == np.float32):
                raise ValueError(f"input {name!r} has dtype {a.dtype}, expected {np.dtype(want)}")
            a = a.astype(np.float32)
        return np.ascontiguousarray(a)

    @_counted
    def set_input(self, name: str, array: ArrayLike) -> None:
        """Write a host array into input `name` now (a staging copy where memory is not mapped)."""
        self._set_input(name, array)

    def _set_input(self, name, array):
        t = self._input(name)
        self.buffers[id(t.storage)].write(self._host_input(name, array), GUARD * 4)

    def _staging(self):
        """Mapped upload and download buffers for host arrays, on devices whose memory the host cannot
        map: numpy inputs and read-back outputs then travel in the run's own submit (the copies
        around the recording) instead of a staging submit each. Laid out once, made on first use."""
        if self._stage is None:
            self._stage = Staging.make(self.device, [(k, n) for k, (_, _, n, *_) in self._in_spec.items()],
                                       [(k, n) for k, (_, _, _, n, contiguous, *_) in self._out_spec.items() if contiguous])
            self.nbytes += self._stage.nbytes
        return self._stage

    def _io_specs(self):
        """Per input and output: what a device-tensor copy needs, computed once."""
        # (tensor, buffer, bytes, shape, dtype name) per input; outputs: (tensor, buffer, byte offset,
        # bytes, contiguous, shape, dtype name)
        self._in_spec = {k: (t, self.buffers[id(t.storage)], data_bytes(t.numel, t.dtype), t.shape, t.dtype)
                         for k, t in self.graph.inputs.items()}
        self._out_spec = {k: (t, self._buffer(t), GUARD * 4 + t.offset * itemsize(t.dtype), data_bytes(t.numel, t.dtype),
                              t.is_contiguous, t.shape, t.dtype) for k, t in self.graph.outputs.items()}
        self._outputs = OutputRecycler(self.device, [DeviceTensor.pooled_spec(self.device, t.shape, t.dtype, t.numel)
                                                     for t in self.graph.outputs.values()])
        self._out_tail = (None, *self._out_spec)                # the argument names' tail of execute_into

    def _copy_in(self, name, src):
        spec = self._in_spec.get(name)
        if spec is None:
            self._input(name)
        t, buf, nbytes, *_ = spec
        if src.device is not self.device:
            raise ValueError(f"input {name!r} lives on {src.device!r}, the graph runs on {self.device!r}")
        if src.shape != t.shape or src.dtype_name != t.dtype:
            raise ValueError(f"input {name!r} is a {src.dtype_name} Tensor of shape {src.shape}, "
                             f"expected {t.dtype} {t.shape}")
        return (src._buf(), src.byte_offset, buf, GUARD * 4, nbytes)

    def _copy_out(self, name, dst):
        spec = self._out_spec.get(name)
        if spec is None:
            raise ValueError(f"graph has no output {name!r}; outputs are {sorted(self.graph.outputs)}")
        t, buf, off, nbytes, contiguous, *_ = spec
        if not isinstance(dst, (DeviceTensor, TensorRows)) or dst.device is not self.device:
            raise ValueError(f"out[{name!r}] must be a dsv4_vk.Tensor on {self.device!r}, got {dst!r}")
        if dst.shape != t.shape or dst.dtype_name != t.dtype:
            raise ValueError(f"out[{name!r}] is a {dst.dtype_name} Tensor of shape {dst.shape}, "
                             f"expected {t.dtype} {t.shape}")
        if not contiguous:
            raise ValueError(f"output {name!r} is a strided view: add g.op('CONT', ...) to copy it out")
        return (buf, off, dst._buf(), dst.byte_offset, nbytes)

    def new_outputs(self) -> dict[str, DeviceTensor]:
        """{output name: a device Tensor of its shape} (to pass as `out`) that nobody else holds.

        Where the outputs are small (≤ HOLD_BYTES in all: decode sizes), the program keeps the
        tensors it handed out last and hands the same ones out again once their reference count says
        the caller dropped them (no weak references either): a decode loop then gets its outputs
        with no pool round trip, and the same buffers keep the recorded copies' key. A tensor still
        held anywhere is left alone and a new one is taken from the pool in its place."""
        return dict(zip(self._out_spec, self._new_outputs()))

    def _new_outputs(self):
        """new_outputs() as a list in output order (the held list itself: callers copy it, never change it)."""
        outputs = self._outputs
        if outputs.held is None and outputs.hold:
            self.nbytes += outputs.hold     # the outputs it keeps from now on, counted in the cache's budget
        return outputs.take()

    def execute_into(self, inputs: dict, out: tuple[DeviceTensor | TensorRows | None, ...] | None = None) -> tuple:
        """execute(inputs, out) for the library's device-tensor calls: `out` a tuple of Tensors for the
        outputs in order (None entries, or out=None: new ones, as new_outputs); returns the output
        tensors as a tuple. One method for what took new_outputs, a dict of them and execute."""
        dev = self.device
        with dev.in_use:
            if out is None:
                outs = self._new_outputs()          # (the held list itself: only read here)
            elif None in out:
                outs = list(self._new_outputs())    # (a copy: the held list is the program's)
                for i, o in enumerate(out[:len(outs)]):
                    if o is not None:
                        outs[i] = o
            else:
                outs = out
                if len(out) > len(self._out_spec):
                    raise ValueError(f"out holds {len(out)} tensors, the program has {len(self._out_spec)} "
                                     f"output(s): {list(self._out_spec)}")
            with self._lock:
                # _start's first step, the argument set of the last run again, without building the out
                # dict; _start does everything else (a pending run, a released program, new arguments)
                if self._pending is not None or self.recording.cmd is None or \
                        not self._submit_fast((*inputs, *self._out_tail), (*inputs.values(), *outs)):
                    self._start(inputs, dict(zip(self._out_spec, outs)), ())
                dev.wait(self.recording.fence_arr)     # (inputs and outs keep the tensors alive until here)
                if self.timestamps or profile.active():
                    self._finished()
                else:
                    self.stats = None           # (_finished, inlined for the usual case)
            return tuple(outs)

    def submit(self, inputs: dict | None = None, out: dict | None = None, read_back: Iterable[str] = (),
               **kw: Any) -> Submission:
        """Start a run: write host inputs, copy device-tensor inputs in and the outputs named in
        `out` ({name: Tensor}) out, in one submit. Returns a Submission; a run still in flight on
        this graph is waited for first. read_back: output names `read` will ask for after the run
        (where the host cannot map device memory they come back in the same submit)."""
        with self.device.in_use, self._lock:
            self._pending = Submission(self, self._start(_merged_inputs(inputs, kw), out, read_back))
            return self._pending

    def execute(self, inputs: dict | None = None, out: dict | None = None, read_back: Iterable[str] = ()) -> None:
        """submit(...).wait() without the Submission: the library's synchronous calls."""
        dev = self.device
        with dev.in_use, self._lock:
            keep = self._start(inputs, out, read_back)     # noqa: F841  (alive until the wait)
            dev.wait(self.recording.fence_arr)
            self._finished()

    def _start(self, inputs, out, read_back):
        """Copies and submit of one run (holding _lock); returns the device tensors it copies.

        The per-call path of every library call. Each device tensor is checked against its slot
        with a few attribute reads and contributes (name, buffer serial, offset) to the key of the
        recorded copies; the copies themselves are listed (and recorded) only when the key is new.
        A run whose arguments are all device tensors leaves their state behind (`_fast`): the next
        run with the same names and the same state skips the checks and the key (a decode loop)."""
        if self._pending is not None:
            self._pending.wait()
        rec = self.recording
        if rec.cmd is None:
            self.device.check_open()
            raise ValueError("this compiled graph was released")
        # the argument set of the last run again (device tensors only: same names, and each the same
        # buffer (on the same device), offset, shape and dtype, so the same checks pass and the same
        # copies apply)
        if self._fast is not None and not read_back:
            ins, outs = inputs or _NO_ARGS, out or _NO_ARGS
            vals = (*ins.values(), *outs.values())
            if self._submit_fast((*ins, None, *outs), vals):
                return vals
        dev = self.device
        stage = None if dev.is_host_visible else self._staging()
        key, keep, staged, host = [], [], None, False
        if inputs:
            in_spec = self._in_spec
            for k, v in inputs.items():
                if isinstance(v, _DEVICE_TYPES):
                    spec = in_spec.get(k)
                    if spec is None or v.device is not dev or v.shape != spec[3] or v.dtype_name != spec[4] \
                            or v.buffer is None:
                        self._copy_in(k, v)              # raises, naming what is wrong
                    keep.append(v)
                    if spec[2]:
                        key.append((k, v.buffer.serial, v.byte_offset))
                elif stage is None:
                    self._set_input(k, v)
                    host = True
                else:
                    host = True
                    a = self._host_input(k, v)
                    stage.write(k, a)
                    if a.nbytes:
                        key.append((k, None, 0))
        if out:
            for k, v in out.items():
                spec = self._out_spec.get(k)
                if spec is None or not isinstance(v, _DEVICE_TYPES) or v.device is not dev or not spec[4] \
                        or v.shape != spec[5] or v.dtype_name != spec[6] or v.buffer is None:
                    self._copy_out(k, v)                 # raises, naming what is wrong
                keep.append(v)
                if spec[3]:
                    key.append((k, True, v.buffer.serial, v.byte_offset))
        if stage is not None:
            staged = set()
            for k in read_back:
                if k in stage.down_at and k not in (out or {}):
                    if self._out_spec[k][3]:
                        key.append((k, False))
                    staged.add(k)
            self._staged = staged
        info = None
        if key:
            key = tuple(key)
            info = self._io.get(key)
            if info is None:
                info = self._record_io(key, inputs, out, staged, stage)
        self.last_submit_info = info if info is not None else self.recording.submit_info   # (benchmarks)
        if not host and not staged:         # checked above: the next run with this argument set skips it all
            self._fast = ((*(inputs or ()), None, *(out or ())), list(map(_COPY_STATE, keep)), info,
                          self.last_submit_info)
        self.recording.start(info)
        return keep

    def _submit_fast(self, names, vals):
        """Submit what the last run submitted when it had the same argument names (inputs, None,
        outputs) and `vals`, its device tensors in that order, are in the same state; True if so.
        Called holding _lock, with no run pending and the recording alive (_start checks both)."""
        fast = self._fast
        if fast is None or names != fast[0]:
            return False
        try:
            if list(map(_COPY_STATE, vals)) != fast[1]:
                return False
        except AttributeError:          # a host array among them
            return False
        self._staged = _NOTHING
        self.last_submit_info = info = fast[3]
        rec = self.recording
        self.device.submit(info, rec.fence_arr)     # rec.start(fast[2]), inlined: the caller checked rec.cmd
        rec.n_submits += 1
        return True

    def _record_io(self, key, inputs, out, staged, stage):
        """Record the copies of a new key (checked by _start) around the recording; its VkSubmitInfo."""
        copies_in, copies_out = [], []
        for k, v in (inputs or {}).items():
            if isinstance(v, _DEVICE_TYPES):
                c = self._copy_in(k, v)
            elif stage is not None:
                n = self._in_spec[k][2]
                c = (stage.up, stage.up_at[k], self._in_spec[k][1], GUARD * 4, n)
            else:
                continue
            if c[4]:
                copies_in.append(c)
        for k, v in (out or {}).items():
            c = self._copy_out(k, v)
            if c[4]:
                copies_out.append(c)
        for k in staged or ():
            _, buf, off, n, *_ = self._out_spec[k]
            if n:
                copies_out.append((buf, off, stage.down, stage.down_at[k], n))
        self._fast = None                   # its copies may be in the command buffers reused
        return self._io.record(self.recording, key, copies_in, copies_out)

    @_counted
    def _fence_signalled(self):
        from ..vk.binding import lib
        return lib.vkGetFenceStatus(self.device.device, self.recording.fence) == 0

    def _finished(self):
        if self.timestamps or profile.active():
            self.stats = RunStats(self, self.recording.timings() if self.timestamps else None)
            profile.notify(self.stats)
        else:
            self.stats = None

    def run_stats(self) -> RunStats:
        """RunStats of the last run (built on request when nothing was profiled)."""
        return self.stats if self.stats is not None else RunStats(self)

    def _buffer(self, t):
        """Buffer of a tensor of this graph, or of an equal graph (same signature) built again."""
        buf = self.buffers.get(id(t.storage))
        if buf is None:
            buf = self.buffers[id(self.graph.storages[t.graph.storages.index(t.storage)])]
        return buf

    @_counted
    def read(self, t: str | GraphTensor) -> np.ndarray:
        """numpy copy of any graph tensor view, or of the output named `t` (after a run)."""
        return self._read(t)

    def _read(self, t):
        if isinstance(t, str):
            if t not in self.graph.outputs:
                raise ValueError(f"graph has no output {t!r}; outputs are {sorted(self.graph.outputs)}")
            if t in self._staged:                 # copied into the mapped download buffer by the run
                o = self.graph.outputs[t]
                return self._stage.read(t, o.shape, DTYPES[o.dtype])
            t = self.graph.outputs[t]
        buf = self._buffer(t)
        if t.numel == 0:
            return np.zeros(t.shape, DTYPES[t.dtype])
        if t.is_contiguous:
            sz = itemsize(t.dtype)
            return buf.read(GUARD * 4 + t.offset * sz, t.numel * sz).view(DTYPES[t.dtype]).reshape(t.shape)
        sz = itemsize(t.dtype)
        raw = buf.read(GUARD * 4, t.storage.numel * sz).view(DTYPES[t.dtype])
        view = np.lib.stride_tricks.as_strided(raw[t.offset:], t.shape, [s * sz for s in t.strides])
        return np.array(view)

    def replay(self, inputs: dict | None = None, out: dict | None = None, **kw: Any) -> None:
        """Write the given inputs (others keep their last values), submit the recorded command buffer
        once and wait; outputs stay on the device (`read` them, or read params, or pass `out`). The
        cheap path of a decode loop: no recording, no read-back."""
        self.execute(_merged_inputs(inputs, kw), out)

    def run(self, inputs: dict | None = None, out: dict | None = None, **kw: Any) -> dict:
        """Write inputs, replay the recorded command buffer, return {output name: array} (outputs
        copied into `out` tensors are not read back)."""
        with self._lock:
            names = [k for k in self.graph.outputs if k not in (out or {})]
            self.execute(_merged_inputs(inputs, kw), out, names)
            self.stats = self.run_stats()
            return {k: self.read(k) for k in names}

    @_counted
    def check_guards(self) -> list[str]:
        """Names of storages whose guard regions were overwritten (empty list: all intact)."""
        return [s.name or f"{s.kind}#{i}" for i, s in enumerate(self.graph.storages)
                if id(s) not in self._unguarded and not guards_intact(self.buffers[id(s)], s.numel, itemsize(s.dtype))]

    def release(self) -> None:
        with self._lock:
            live = self.device.try_begin_use()      # else close() destroys everything
            try:
                if live and self._pending is not None:
                    self._pending.wait()
                self.recording.destroy()
                if live:
                    for buf in self._owned:
                        self.device.pool.free(buf)
                    for buf in self._stage.buffers if self._stage else ():
                        buf.destroy()
            finally:
                if live:
                    self.device.end_use()
            self.buffers, self._owned, self._stage = {}, [], None
            self._io.clear()
            self._outputs.drop()
            self._fast = None
            self._unpin()

    def _unpin(self):
        for p in self._pinned:
            p._pins -= 1
        self._pinned = []

    def __del__(self):
        # a finalizer may run on any thread at any time: no locks, buffers queued for the pool
        try:
            self._unpin()
            if self.device.closed or self.recording.cmd is None or not self.device.try_begin_use():
                return      # (closing: the recording's own finalizer hands it to close())
            try:
                if self._pending is not None:
                    self.device.wait(self.recording.fence_arr)
                self.recording.destroy()
                for buf in self._owned + list(self._stage.buffers if self._stage else ()):
                    self.device.pool.free_later(buf)    # the mapped staging pair is destroyed, not pooled
                self._owned = []
            finally:
                self.device.end_use()
        except Exception:
            pass


class Param(DeviceTensor):
    """A named device tensor owned by an executor and shared by its graphs (weights, KV caches)."""

    def __init__(self, device, name, array, host_visible=False, host_memory=False):
        a = np.asarray(array)
        super().__init__(device, a.shape, a.dtype, host_visible=host_visible, fill_guards=True,
                         host_memory=host_memory)
        self.name = name
        self.host_memory = host_memory      # placed in the device's host heap (where it has one)
        self.write(a)

    @classmethod
    def streamed(cls, device, name, shape, dtype, fill, upload, host_memory=False) -> "Param":
        """A param whose bytes fill(view, start) puts through `upload` (vk.upload.Upload), in chunks
        (into the buffer itself where it is mapped: host memory)."""
        p = cls.__new__(cls)
        DeviceTensor.__init__(p, device, shape, dtype, fill_guards=True, host_memory=host_memory)
        p.name, p.host_memory = name, host_memory
        upload.write(p._buf(), GUARD * 4, p.nbytes, fill)
        return p

    def read(self):
        return self.numpy().copy()

    def write(self, array, start=0):
        """Overwrite elements [start, start + array.size) in place (same dtype), e.g. one per-step value."""
        a = np.ascontiguousarray(array, dtype=DTYPES[self.dtype_name]).reshape(-1)
        if start < 0 or start + a.size > self.numel:
            raise ValueError(f"param {self.name!r}: writing {a.size} element(s) at {start} overruns its {self.numel}")
        super().write(a, start)


class Executor:
    """Compiles graphs once per signature and replays them (up to `cache_size` graphs and the
    device's byte budget; the least recently used are dropped). Thread-safe: a graph run by two
    threads at once runs twice in turn."""

    def __init__(self, device: Device | None = None, timestamps: bool = False, cache_size: int = 64):
        self.device = device or default_device()
        self.device.check_open()
        self.timestamps = timestamps
        self._lock = threading.RLock()
        self._cache: collections.OrderedDict[tuple, CompiledGraph] = collections.OrderedDict()
        self.cache_size = cache_size
        self.params: dict[str, Param] = {}
        self.last: CompiledGraph | None = None

    def set_param(self, name: str, array: ArrayLike, host_visible: bool = False,
                  host_memory: bool = False) -> DeviceTensor:
        """Upload (or overwrite in place) the param `name`; graphs see it through Graph.param.
        host_visible=True on a new param: host reads/writes skip the staging copy (per-step values).
        host_memory=True: placed in the device's host heap (system memory a discrete GPU reads over
        its bus: weights that do not fit its own memory; vk.Buffer); a param placed elsewhere is
        made anew there."""
        a = np.ascontiguousarray(array)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        with self._lock:
            return self._set_param(name, a, host_visible, host_memory)

    def stream_param(self, name: str, shape: tuple, dtype: Any, fill: Callable[[np.ndarray, int], None],
                     upload: Upload, host_memory: bool = False) -> DeviceTensor:
        """Upload the new param `name` (shape, dtype) from a byte source the host need not hold whole
        (checkpoint files): fill(view, start) puts its bytes [start, start + view.size) into view, on
        `upload`'s threads (vk.upload.Upload). host_memory: as set_param's."""
        with self._lock:
            p = self.params.get(name)
            if p is not None:
                self._drop_graphs_using(name)
                p.release()
            self.params[name] = p = Param.streamed(self.device, name, tuple(shape), dtype, fill, upload,
                                                   host_memory)
            return p

    def _set_param(self, name, a, host_visible, host_memory=False):
        p = self.params.get(name)
        if p is not None and p.numel == a.size and p.dtype_name == dtype_name(a.dtype) and \
                p.host_memory == host_memory:
            p.write(a)
            p.shape = a.shape
        else:
            if p is not None:
                self._drop_graphs_using(name)
                p.release()
            self.params[name] = Param(self.device, name, a, host_visible, host_memory)
        return self.params[name]

    def _drop_graphs_using(self, name):
        for key in [k for k, cg in self._cache.items()
                    if any(s.kind == "param" and s.name == name for s in cg.graph.storages)]:
            self._cache.pop(key).release()

    def compile(self, graph: Graph, repeat: int = 1) -> CompiledGraph:
        """The CompiledGraph of `graph` (recorded `repeat` times back to back), cached by signature."""
        timestamps = self.timestamps or profile.active()
        key = (graph.signature(), timestamps, repeat)
        with self._lock:
            cg = self._cache.get(key)
            if cg is None:
                cg = CompiledGraph(self.device, graph, timestamps, self.params, repeat)
                self._cache[key] = cg
                # past cache_size graphs or the device's byte budget the least recently used is
                # dropped: freed as soon as nobody holds it (a caller keeping it, e.g. a model's
                # decode graph, keeps it working)
                while len(self._cache) > 1 and (len(self._cache) > self.cache_size or
                                                sum(c.nbytes for c in self._cache.values()) > self.device.cache_bytes):
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
            return cg

    def run(self, graph: Graph, inputs: dict | None = None, **kw: Any) -> dict:
        cg = self.compile(graph)
        out = cg.run(inputs, **kw)
        self.last = cg
        return out
