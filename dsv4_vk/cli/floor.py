"""The device floor: what the cheapest dispatch, barrier, submit and copy cost on this device.

Every HC kernel is judged against these numbers (`python -m dsv4_vk bench` prints them first):
a fused op at decode cannot beat one dependent dispatch, and a bandwidth-bound op at prefill cannot
beat a plain copy. GPU times come from two timestamp queries, before and after a chain
(`Recorder(timestamps="ends")`: no per-dispatch timestamp serialises what is measured), each the
median over replays of one recorded command buffer; host times from `time.perf_counter_ns`, also
medians.

    measure(device)        -> dict of all of them
    format_floor(result)   -> the human-readable block
"""
import contextlib
import json
import statistics
from pathlib import Path
import time

import numpy as np

from ..ops.base import grid_1d
from . import apply_device, parser
from ..vk import Buffer, Recorder, default_device
from ..vk.push import pack_fields

COPY_WORKGROUP = 256
CPU_COPY_BYTES = 16 << 20       # lavapipe: ~1 GB/s, keep each replay short
GPU_COPY_BYTES = 1 << 30        # far beyond any GPU's L2, so the copy reads DRAM


@contextlib.contextmanager
def _scratch(device, nbytes, fill=None):
    """A buffer that lives for the measurement only (its cached descriptor sets go with it). The
    measurement is a counted call (device.in_use): close() waits for it before destroying the
    recorder's command pool under it, and a measurement that close() overtakes raises DeviceClosed."""
    with device.in_use:
        buf = Buffer(device, nbytes)
        try:
            if fill is not None:
                buf.write(fill)
            yield buf
        finally:
            device.pipelines.forget_buffer(buf)
            buf.destroy()


@contextlib.contextmanager
def _recording(rec):
    r = rec.finish()
    try:
        yield r
    finally:
        r.destroy()


def _warm(warm):
    """Run the clock warm-up (a ClockWarmer or any callable) right before the timed replays."""
    if warm is not None:
        warm()


def _replay_spans_ns(r, replays, warm):
    """GPU ns between the first and last timestamp of each of `replays` submits of recording r, after
    one untimed submit (shader JIT on lavapipe, first touch of the pages) and the clock warm-up."""
    r.submit()
    _warm(warm)
    spans = []
    for _ in range(replays):
        r.submit()
        ts = r.timestamps_ns()
        spans.append(ts[-1] - ts[0])
    return spans


STEP, COPY, READ, FLOAT = {"OP_STEP": 1}, {"OP_COPY": 1}, {"OP_READ": 1}, {"OP_FLOAT": 1}     # floor.comp's kernels


def _step_pipeline(device):
    return device.pipelines.get("floor", 1, STEP, (1,))


def _check_timestamps(device):
    if not device.caps.timestamps.valid_bits:
        raise RuntimeError(f"{device.name} has no timestamp queries: GPU times cannot be measured")


def dispatch_chain_us(device, n=256, barriers=True, replays=10, warm=None):
    """GPU µs per dispatch in a chain of `n` tiny dispatches, dispatch i computing d[i+1] = d[i] + 1.

    barriers=True: each dispatch depends on the one before (the recorder puts a barrier between
    them) and the result is checked (d[n] == n). barriers=False: the same dispatches with no
    barrier, i.e. the launch cost alone (their results race by design and are not checked)."""
    if n < 1 or replays < 1:
        raise ValueError(f"dispatch chain needs n ≥ 1 and replays ≥ 1, got n={n}, replays={replays}")
    _check_timestamps(device)
    pipe = _step_pipeline(device)
    with _scratch(device, 4 * (n + 1), np.zeros(n + 1, np.float32)) as buf:
        rec = Recorder(device, timestamps="ends")
        for i in range(n):
            reads = [(buf, 4 * i, 4 * i + 4)] if barriers else ()
            writes = [(buf, 4 * i + 4, 4 * i + 8)] if barriers else ()
            rec.dispatch(pipe, [buf], pack_fields("floor", STEP, {"src": i, "dst": i + 1}), (1, 1, 1), reads, writes, label="step")
        with _recording(rec) as r:
            if barriers and r.n_barriers != n - 1:
                raise RuntimeError(f"dependent chain of {n} dispatches recorded {r.n_barriers} barriers, "
                                   f"expected {n - 1}")
            per = [span / n / 1e3 for span in _replay_spans_ns(r, replays, warm)]
        if barriers:
            last = float(buf.read(4 * n, 4).view(np.float32)[0])
            if last != float(n):
                raise RuntimeError(f"dependent dispatch chain computed {last}, expected {n}: "
                                   "dispatches ran out of order or not at all")
    return statistics.median(per)


def submit_roundtrip_us(device, replays=20, warm=None):
    """Host µs to submit one recorded tiny dispatch and wait for its fence."""
    pipe = _step_pipeline(device)
    with _scratch(device, 8, np.zeros(2, np.float32)) as buf:
        rec = Recorder(device)
        rec.dispatch(pipe, [buf], pack_fields("floor", STEP, {"src": 0, "dst": 1}), (1, 1, 1), [(buf, 0, 4)], [(buf, 4, 8)])
        with _recording(rec) as r:
            for _ in range(3):          # first submits JIT-compile the shader (lavapipe) and page in
                r.submit()
            _warm(warm)
            times = []
            for _ in range(replays):
                t0 = time.perf_counter_ns()
                r.submit()
                times.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(times)


def record_us_per_dispatch(device, n=1000, repeats=3):
    """Host µs per `Recorder.dispatch` call (bind + push + dispatch + hazard tracking and the
    barrier it implies), measured in Python over a dependent chain of `n` dispatches."""
    pipe = _step_pipeline(device)
    pushes = [pack_fields("floor", STEP, {"src": i, "dst": i + 1}) for i in range(n)]
    per = []
    with _scratch(device, 4 * (n + 1)) as buf:
        ranges = [([(buf, 4 * i, 4 * i + 4)], [(buf, 4 * i + 4, 4 * i + 8)]) for i in range(n)]
        for _ in range(repeats):
            rec = Recorder(device)
            t0 = time.perf_counter_ns()
            for i in range(n):
                rec.dispatch(pipe, [buf], pushes[i], (1, 1, 1), *ranges[i])
            per.append((time.perf_counter_ns() - t0) / n / 1e3)
            rec.finish().destroy()
    return statistics.median(per)


def _copies(device, src, dst, nbytes, copies, timestamps=False):
    """A recorder holding `copies` vec4 copies src → dst of `nbytes`; each rewrites dst, so the
    recorder orders them with barriers."""
    n4 = nbytes // 16
    pipe = device.pipelines.get("floor", 2, COPY, (COPY_WORKGROUP,))
    rec = Recorder(device, timestamps=timestamps)
    for _ in range(copies):
        rec.dispatch(pipe, [src, dst], pack_fields("floor", COPY, {"n4": n4}), grid_1d(n4, COPY_WORKGROUP),
                     [(src, 0, nbytes)], [(dst, 0, nbytes)])
    return rec


def default_copy_bytes(device):
    """1 GiB on GPUs (capped by the storage-buffer range), 16 MiB on CPU devices."""
    if device.caps.type == "cpu":
        return CPU_COPY_BYTES
    return min(GPU_COPY_BYTES, device.caps.limits.max_storage_buffer_range // 16 * 16)


def copy_gbps(device, nbytes=None, replays=10, copies=4, warm=None):
    """Copy bandwidth in GB/s (bytes read + bytes written, 10⁹ B/s) of an elementwise vec4 copy of
    `nbytes`; median over replays of `copies` back-to-back copies (the output is checked)."""
    nbytes = default_copy_bytes(device) if nbytes is None else int(nbytes)
    limit = device.caps.limits.max_storage_buffer_range
    if nbytes < 16 or nbytes % 16:
        raise ValueError(f"copy_bytes must be a positive multiple of 16, got {nbytes}")
    if nbytes > limit:
        raise ValueError(f"copy_bytes={nbytes} exceeds {device.name}'s maxStorageBufferRange ({limit} B)")
    _check_timestamps(device)
    src_data = np.arange(nbytes // 4, dtype=np.float32)
    with _scratch(device, nbytes, src_data) as src, _scratch(device, nbytes) as dst:
        with _recording(_copies(device, src, dst, nbytes, copies, timestamps="ends")) as r:
            rates = [2 * nbytes * copies / span for span in _replay_spans_ns(r, replays, warm)]   # B/ns == GB/s
        if not np.array_equal(dst.read().view(np.float32), src_data):
            raise RuntimeError("copy kernel produced wrong data: the bandwidth figure would be meaningless")
    return statistics.median(rates)


def read_us(device, nbytes, copies=1, replays=10, repeat=4, warm=None):
    """GPU µs to read `nbytes` once (floor.comp -D OP_READ: a vec4 an invocation, nothing written),
    the median over replays of a recording that reads `copies` disjoint copies in turn, `repeat` times
    (a barrier between reads, as between the decode step's mat-muls; copies spanning more than the
    GPU's L2 cache make every read come from device memory): the floor of a one-token GEMV over
    that many bytes, its dispatch's fill and drain included."""
    if nbytes < 16 or nbytes % 16 or copies < 1 or replays < 1 or repeat < 1:
        raise ValueError(f"read_us: nbytes must be a positive multiple of 16 and copies, replays, repeat ≥ 1, "
                         f"got {nbytes}, {copies}, {replays}, {repeat}")
    limit = device.caps.limits.max_storage_buffer_range
    if nbytes > limit:
        raise ValueError(f"read_us: {nbytes} B exceed {device.name}'s maxStorageBufferRange ({limit} B)")
    copies = min(copies, limit // nbytes)          # (all of them in one buffer)
    _check_timestamps(device)
    pipe = device.pipelines.get("floor", 2, READ, (COPY_WORKGROUP,))
    n4 = nbytes // 16
    with _scratch(device, nbytes * copies) as src, _scratch(device, 16, np.zeros(4, np.float32)) as dst:
        rec = Recorder(device, timestamps="ends")
        for _ in range(repeat):
            for c in range(copies):
                push = pack_fields("floor", READ, {"n4": n4, "s_off": c * n4, "never": float("nan")})
                rec.dispatch(pipe, [src, dst], push, grid_1d(n4, COPY_WORKGROUP),
                             [(src, c * nbytes, (c + 1) * nbytes)], [(dst, 0, 16)])
        with _recording(rec) as r:
            times = [span / 1e3 / (repeat * copies) for span in _replay_spans_ns(r, replays, warm)]
        if dst.read().view(np.float32).any():
            raise RuntimeError("read kernel wrote its output: the comparison with NaN held, so it was compiled "
                               "wrongly and its time would be meaningless")
    return statistics.median(times)


# floor.comp -D OP_FLOAT: (name, operand values, result index, the exact result, the result where the
# device flushes). The operands are written as float32; index 5 holds the bits 0x00000001 (fp16's
# smallest subnormal as unpackHalf2x16 reads it).
_FLOAT_OPERANDS = np.array([2.0 ** -126, 0.5, 2.0 ** -140, 2.0 ** 24, 2.0 ** -20, 0.0, 0.0, 0.0], np.float32)
_FLOAT_OPERANDS[5:6].view(np.uint32)[0] = 1
_FLOAT_EDGES = (
    ("f32_subnormal_results", 8, 2.0 ** -127, 0.0),         # 2^-126 · 0.5
    ("f32_subnormal_operands", 9, 2.0 ** -116, 0.0),        # 2^-140 · 2^24
    ("f32_subnormal_addends", 10, 2.0 ** -126 + 2.0 ** -140, 2.0 ** -126),
    ("fp16_subnormals_from_f32", 11, 2.0 ** -20, 0.0),      # packHalf2x16(2^-20)
    ("fp16_subnormals_to_f32", 12, 2.0 ** -24, 0.0),        # unpackHalf2x16(1)
)


def float_edges(device) -> dict[str, str]:
    """What `device` does with subnormal numbers in a shader that sets no float-controls execution
    mode (every kernel here): {edge: "kept" | "flushed"} for f32 results, f32 operands of a product
    and of a sum, and fp16 subnormals made from f32 (packHalf2x16) and read as f32
    (unpackHalf2x16). The tensor-core kernels' range (docs/tensor_cores.md) depends on these.
    Raises RuntimeError for any other value: the arithmetic is not what IEEE 754 allows."""
    pipe = device.pipelines.get("floor", 1, FLOAT, (1,))
    with _scratch(device, 4 * 16, np.concatenate([_FLOAT_OPERANDS, np.full(8, np.nan, np.float32)])) as buf:
        rec = Recorder(device)
        rec.dispatch(pipe, [buf], pack_fields("floor", FLOAT, {"off": 0}), (1, 1, 1), [(buf, 0, 32)], [(buf, 32, 64)])
        with _recording(rec) as r:
            r.submit()
        got = buf.read().view(np.float32).astype(np.float64)
    out = {}
    for name, i, exact, flushed in _FLOAT_EDGES:
        if got[i] == exact:
            out[name] = "kept"
        elif got[i] == flushed:
            out[name] = "flushed"
        else:
            raise RuntimeError(f"floor.comp OP_FLOAT: {name} gave {got[i]!r}, expected {exact!r} (kept) or "
                               f"{flushed!r} (flushed)")
    return out


def default_warm_ms(device):
    """Clock warm-up before each GPU measurement: 500 ms on GPUs, none on CPU devices."""
    return 0 if device.caps.type == "cpu" else 500


class ClockWarmer:
    """Keeps the GPU busy for `ms` right before a measurement.

    GPUs lower their shader clock when idle and raise it only after sustained load: on the H200
    the SM clock sat at 345 MHz (throttle reason "GPU idle") while a benchmark submitted short
    bursts between host work, against 1980 MHz under load (`results/h200/clocks/`). Without a warm-up a timing measures
    the clock governor as much as the kernel. The load is a copy of 2 × `nbytes` scratch memory
    repeated back to back until `ms` have passed; ms = 0 does nothing."""

    def __init__(self, device, ms, nbytes=64 << 20, copies=8):
        self.device, self.ms, self._bufs, self._rec = device, float(ms), [], None
        if self.ms <= 0:
            return
        with device.in_use:             # (counted, as _scratch: the recorder's pool is made here)
            self._bufs = [Buffer(device, nbytes), Buffer(device, nbytes)]
            self._rec = _copies(device, *self._bufs, nbytes, copies).finish()

    def __call__(self):
        if self._rec is None:
            return
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            self._rec.submit()

    def close(self):
        if self._rec is not None:
            self._rec.destroy()
            self._rec = None
        for b in self._bufs:
            self.device.pipelines.forget_buffer(b)
            b.destroy()
        self._bufs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def measure(device=None, chain=256, copy_bytes=None, replays=10, record_n=1000, warm_ms=None):
    """All floor numbers for `device` (default device if None) as a JSON-ready dict; each GPU
    timing follows a clock warm-up of `warm_ms` (default: default_warm_ms)."""
    device = device or default_device()
    copy_bytes = default_copy_bytes(device) if copy_bytes is None else int(copy_bytes)
    warm_ms = default_warm_ms(device) if warm_ms is None else warm_ms
    with ClockWarmer(device, warm_ms) as warm:
        return {
            "device": device.name,
            "device_type": device.caps.type,
            "subgroup_size": device.subgroup_size,
            "chain": chain,
            "replays": replays,
            "warm_ms": warm_ms,
            "dispatch_barrier_us": dispatch_chain_us(device, chain, True, replays, warm),
            "dispatch_nobarrier_us": dispatch_chain_us(device, chain, False, replays, warm),
            "submit_wait_us": submit_roundtrip_us(device, max(replays, 10), warm),
            "record_us_per_dispatch": record_us_per_dispatch(device, record_n),
            "copy_bytes": copy_bytes,
            "copy_gbps": copy_gbps(device, copy_bytes, replays, warm=warm),
            "float_edges": float_edges(device),
        }


def format_floor(f):
    """The floor as a text block (one measurement per line)."""
    return "\n".join([
        f"device                      {f['device']} ({f['device_type']}), subgroup {f['subgroup_size']}",
        f"dependent dispatch+barrier  {f['dispatch_barrier_us']:10.2f} µs GPU   "
        f"(chain of {f['chain']}, median of {f['replays']} replays)",
        f"dispatch without barrier    {f['dispatch_nobarrier_us']:10.2f} µs GPU",
        f"submit + wait, 1 dispatch   {f['submit_wait_us']:10.1f} µs host",
        f"record one dispatch         {f['record_us_per_dispatch']:10.2f} µs host (Python, raw vkCmd*)",
        f"copy bandwidth              {f['copy_gbps']:10.2f} GB/s read+write "
        f"({f['copy_bytes'] / 2**20:.0f} MiB copied)",
    ] + ([f"clock warm-up               {f['warm_ms']:10.0f} ms of load before each GPU timing"]
         if f.get("warm_ms") else []) + ([
        "subnormals (no float mode)  " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in f["float_edges"].items())]
        if f.get("float_edges") else []))


def main(argv=None):
    ap = parser("floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--chain", type=int, default=256, help="dispatches in the timed chain (default 256)")
    ap.add_argument("--copy-mib", type=float, default=None,
                    help="bytes copied, MiB (default: 1024 on GPUs, 16 on CPU devices)")
    ap.add_argument("--replays", type=int, default=10, help="replays per GPU measurement (median)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--out", help="also write the JSON to this file")
    args = ap.parse_args(argv)
    apply_device(args)
    if args.chain < 1 or args.replays < 1:
        ap.error("--chain and --replays must be ≥ 1")
    if args.copy_mib is not None and not 0 < args.copy_mib < float("inf"):
        ap.error(f"--copy-mib must be a number > 0, got {args.copy_mib}")
    copy_bytes = None if args.copy_mib is None else int(args.copy_mib * 2**20) // 16 * 16
    result = measure(default_device(), chain=args.chain, copy_bytes=copy_bytes, replays=args.replays)
    print(json.dumps(result, indent=2) if args.json else format_floor(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0
