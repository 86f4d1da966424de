"""Lowers a Graph to one recorded command buffer, caches it by graph signature and replays it.

Every storage gets its own pooled buffer laid out as [guard | data | guard]; the guards are filled
with a sentinel when the graph is compiled and `check_guards()` tells whether any kernel wrote
outside its tensor. Inputs are written into their buffers before each replay; outputs are read
back after it. No recording happens on replay.
"""
import collections

import numpy as np

from . import profile
from .tensor import DTYPES, dtype_name, itemsize
from ..vk import Buffer, Recorder, default_device

GUARD = 64                      # elements before and after every storage (256 B: a legal bind offset)
SENTINEL = np.uint32(0x7FC0DEAD)  # a NaN with a payload no kernel produces


class RunStats:
    """What one run did: dispatches, barriers, submits, paths of composite ops, GPU time."""

    def __init__(self, compiled, gpu_ns=None):
        self.dispatches = compiled.recording.n_dispatches
        self.barriers = compiled.recording.n_barriers
        self.submits = 1
        self.paths = list(compiled.graph.paths)
        self.labels = list(compiled.recording.labels)
        self.gpu_ns = gpu_ns           # per dispatch, when timestamps were recorded

    def per_label(self):
        """{label: (dispatches, gpu ns)} aggregated over dispatch labels."""
        out = collections.OrderedDict()
        for i, lab in enumerate(self.labels):
            n, t = out.get(lab, (0, 0.0))
            out[lab] = (n + 1, t + (float(self.gpu_ns[i]) if self.gpu_ns is not None else 0.0))
        return out

    def __repr__(self):
        return (f"RunStats(dispatches={self.dispatches}, barriers={self.barriers}, "
                f"paths={[(p[0], p[1]) for p in self.paths]})")


def guarded_buffer(device, numel, data=None, host_visible=False, size=4):
    """A pooled buffer laid out [guard | numel elements of `size` bytes | guard], guards set to SENTINEL
    (guards are GUARD 4-byte words; the data region is padded to a multiple of 4 bytes).
    host_visible: mapped even where device memory is not (small values written/read every step)."""
    if host_visible and not device.is_host_visible:
        buf = Buffer(device, _data_bytes(numel, size) + 2 * GUARD * 4, host_visible=True)
    else:
        buf = device.pool.alloc(_data_bytes(numel, size) + 2 * GUARD * 4)
    guard = np.full(GUARD, SENTINEL, np.uint32)
    buf.write(guard, 0)
    buf.write(guard, GUARD * 4 + _data_bytes(numel, size))
    if data is not None:
        buf.write(data, GUARD * 4)
    return buf


def _data_bytes(numel, size):
    return -(-numel * size // 4) * 4


def guards_intact(buf, numel, size=4):
    head = buf.read(0, GUARD * 4).view(np.uint32)
    tail = buf.read(GUARD * 4 + _data_bytes(numel, size), GUARD * 4).view(np.uint32)
    return bool((head == SENTINEL).all() and (tail == SENTINEL).all())


class CompiledGraph:
    def __init__(self, device, graph, timestamps=False, params=None, repeat=1):
        """repeat: record the graph's dispatches that many times back to back in the one command
        buffer (barriers between repetitions where one reads what another wrote). Benchmarks use it
        to share per-submit costs; multi-step decode to run K steps per submit: repetitions differ
        only through device state the graph itself advances (a position param moved on by
        STORE_AT's `advance`), so nothing is re-recorded and the host writes nothing between them."""
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise ValueError(f"repeat must be an integer ≥ 1, got {repeat!r}")
        self.device, self.graph, self.timestamps = device, graph, timestamps
        self.repeat = repeat
        self.buffers = {}
        self._owned = []
        for s in graph.storages:
            if s.kind == "param":
                p = (params or {}).get(s.name)
                if p is None:
                    raise ValueError(f"graph uses param {s.name!r} but the executor has none: "
                                     "call Executor.set_param first")
                if p.numel != s.numel or p.dtype != s.dtype:
                    raise ValueError(f"param {s.name!r} holds {p.numel} {p.dtype}, graph wants {s.numel} {s.dtype}")
                self.buffers[id(s)] = p.buffer
                continue
            buf = guarded_buffer(device, s.numel, s.data if s.kind == "const" else None, size=itemsize(s.dtype))
            self.buffers[id(s)] = buf
            self._owned.append(buf)
        rec = Recorder(device, timestamps=timestamps)
        for node in [n for _ in range(repeat) for n in graph.nodes]:
            for launch in node.op.lower(node, device):
                self._record(rec, node, launch)
        self.recording = rec.finish()

    def _record(self, rec, node, launch):
        dev = self.device
        pipe = dev.pipelines.get(launch.shader, len(launch.args), launch.defines, launch.spec,
                                 launch.subgroup_size, launch.full_subgroups)
        bufs, reads, writes = [], [], []
        for i, t in enumerate(launch.args):
            buf = self.buffers[id(t.storage)]
            bufs.append((buf, GUARD * 4))
            lo, hi = t.extent()
            sz = itemsize(t.dtype)
            rng = (buf, GUARD * 4 + lo * sz, GUARD * 4 + -(-hi * sz // 4) * 4)
            (writes if i in launch.writes else reads).append(rng)
        # bound past the leading guard, so offsets in push constants are storage-relative
        label = launch.label or node.tag or node.op.name
        rec.dispatch(pipe, bufs, launch.push, launch.grid, reads, writes, label=label)

    def set_input(self, name, array):
        t = self.graph.inputs.get(name)
        if t is None:
            raise ValueError(f"graph has no input {name!r}; inputs are {sorted(self.graph.inputs)}")
        a = np.asarray(array)
        want = DTYPES[t.dtype]
        if a.shape != t.shape:
            raise ValueError(f"input {name!r} has shape {a.shape}, expected {t.shape}")
        if a.dtype != want:
            if not (np.issubdtype(a.dtype, np.floating) and want == np.float32):
                raise ValueError(f"input {name!r} has dtype {a.dtype}, expected {np.dtype(want)}")
            a = a.astype(np.float32)
        self.buffers[id(t.storage)].write(np.ascontiguousarray(a), GUARD * 4)

    def _buffer(self, t):
        """Buffer of a tensor of this graph, or of an equal graph (same signature) built again."""
        buf = self.buffers.get(id(t.storage))
        if buf is None:
            buf = self.buffers[id(self.graph.storages[t.graph.storages.index(t.storage)])]
        return buf

    def read(self, t):
        """numpy copy of any graph tensor view (after a run)."""
        buf = self._buffer(t)
        sz = itemsize(t.dtype)
        raw = buf.read(GUARD * 4, t.storage.numel * sz).view(DTYPES[t.dtype])
        if t.numel == 0:
            return np.zeros(t.shape, DTYPES[t.dtype])
        view = np.lib.stride_tricks.as_strided(raw[t.offset:], t.shape, [s * sz for s in t.strides])
        return np.array(view)

    def replay(self, inputs=None, **kw):
        """Write the given inputs (others keep their last values), submit the recorded command buffer
        once and wait; outputs stay on the device (`read` them, or read params). The cheap path of a
        decode loop: no recording, no read-back."""
        for k, v in {**(inputs or {}), **kw}.items():
            self.set_input(k, v)
        self.recording.submit()
        if self.timestamps or profile.active():
            self.stats = RunStats(self, self.recording.timings() if self.timestamps else None)
            profile.notify(self.stats)

    def run(self, inputs=None, **kw):
        """Write inputs, replay the recorded command buffer, return {output name: array}."""
        for k, v in {**(inputs or {}), **kw}.items():
            self.set_input(k, v)
        self.recording.submit()
        self.stats = RunStats(self, self.recording.timings() if self.timestamps else None)
        profile.notify(self.stats)
        return {k: self.read(t) for k, t in self.graph.outputs.items()}

    def check_guards(self):
        """Names of storages whose guard regions were overwritten (empty list: all intact)."""
        return [s.name or f"{s.kind}#{i}" for i, s in enumerate(self.graph.storages)
                if not guards_intact(self.buffers[id(s)], s.numel, itemsize(s.dtype))]

    def release(self):
        self.recording.destroy()
        for buf in self._owned:
            self.device.pool.free(buf)
        self.buffers, self._owned = {}, []


class Param:
    """A named device tensor owned by an executor and shared by its graphs (weights, KV caches)."""

    def __init__(self, device, name, array, host_visible=False):
        self.name, self.shape = name, array.shape
        self.dtype = dtype_name(array.dtype)
        self.numel = array.size
        self.buffer = guarded_buffer(device, self.numel, array, host_visible, size=array.dtype.itemsize)

    def release(self):
        """Return the buffer: to the pool, or (a host-visible one outside the pool) destroy it, so
        that no host-memory buffer is ever handed out for a device tensor."""
        if self.buffer.host_visible and not self.buffer.device.is_host_visible:
            self.buffer.destroy()
        else:
            self.buffer.device.pool.free(self.buffer)

    def read(self):
        raw = self.buffer.read(GUARD * 4, self.numel * itemsize(self.dtype)).view(DTYPES[self.dtype])
        return raw.reshape(self.shape).copy()

    def write(self, array, start=0):
        """Overwrite elements [start, start + array.size) in place (same dtype), e.g. one per-step value."""
        a = np.ascontiguousarray(array, dtype=DTYPES[self.dtype]).reshape(-1)
        if start < 0 or start + a.size > self.numel:
            raise ValueError(f"param {self.name!r}: writing {a.size} element(s) at {start} overruns its {self.numel}")
        self.buffer.write(a, (GUARD + start) * 4)

    def read_at(self, start, count=1):
        """Elements [start, start + count) as a numpy array (a few values without reading the rest)."""
        if start < 0 or count < 0 or start + count > self.numel:
            raise ValueError(f"param {self.name!r}: reading {count} element(s) at {start} overruns its {self.numel}")
        return self.buffer.read((GUARD + start) * 4, count * 4).view(DTYPES[self.dtype]).copy()


class Executor:
    """Compiles graphs once per signature and replays them."""

    def __init__(self, device=None, timestamps=False, cache_size=64):
        self.device = device or default_device()
        self.timestamps = timestamps
        self._cache = collections.OrderedDict()
        self.cache_size = cache_size
        self.params = {}
        self.last = None

    def set_param(self, name, array, host_visible=False):
        """Upload (or overwrite in place) the param `name`; graphs see it through Graph.param.
        host_visible=True on a new param: host reads/writes skip the staging copy (per-step values)."""
        a = np.ascontiguousarray(array)
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        p = self.params.get(name)
        if p is not None and p.numel == a.size and p.dtype == dtype_name(a.dtype):
            p.buffer.write(a, GUARD * 4)
            p.shape = a.shape
        else:
            if p is not None:
                self._drop_graphs_using(name)
                p.release()
            self.params[name] = Param(self.device, name, a, host_visible)
        return self.params[name]

    def _drop_graphs_using(self, name):
        for key in [k for k, cg in self._cache.items()
                    if any(s.kind == "param" and s.name == name for s in cg.graph.storages)]:
            self._cache.pop(key).release()

    def compile(self, graph, repeat=1):
        """The CompiledGraph of `graph` (recorded `repeat` times back to back), cached by signature."""
        timestamps = self.timestamps or profile.active()
        key = (graph.signature(), timestamps, repeat)
        cg = self._cache.get(key)
        if cg is None:
            cg = CompiledGraph(self.device, graph, timestamps, self.params, repeat)
            self._cache[key] = cg
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)[1].release()
        else:
            self._cache.move_to_end(key)
        return cg

    def run(self, graph, inputs=None, **kw):
        cg = self.compile(graph)
        out = cg.run(inputs, **kw)
        self.last = cg
        return out
