"""Command-buffer recording with hazard-tracked barriers and optional per-dispatch timestamps.

Every vkCmd* goes through the raw cffi `lib` with structs built once (the binding's wrappers cost
about 10x more per call). A barrier is recorded only where a dispatch reads what an earlier
dispatch wrote (RAW), or writes what an earlier one read or wrote (WAR/WAW) since the last
barrier, judged over byte ranges of buffers. A finished `Recording` can be submitted any number
of times without re-recording.
"""
import numpy as np

from .binding import check, ffi, lib, vk

_STAGE_COMPUTE = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
_STAGE_TRANSFER = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
_STAGE_HOST = vk.VK_PIPELINE_STAGE_HOST_BIT
_QUERY_CHUNK = 4096


def _overlap(ranges, lo, hi):
    return any(a < hi and lo < b for a, b in ranges)


def destroy_recording(vk_device, pool, fence, query_pools):
    """Destroy a command pool (every command buffer of it goes with it), a fence (or None) and query
    pools [(pool, count)]."""
    lib.vkDestroyCommandPool(vk_device, pool, ffi.NULL)
    if fence is not None:
        lib.vkDestroyFence(vk_device, fence, ffi.NULL)
    for qp, _ in query_pools:
        lib.vkDestroyQueryPool(vk_device, qp, ffi.NULL)


def _release(device, handles):
    """destroy_recording(*handles) now, or by close() when the device is closing: a finalizer may
    get here on any thread, while close() destroys the device or waits for the GPU to finish them."""
    if device._closed:
        return                  # (destroyed with the device)
    if not device.try_begin_use():
        device._orphans.append(handles)
        return
    try:
        destroy_recording(device.device, *handles)
    finally:
        device.end_use()


class Recording:
    """A finished command buffer: submit() replays it; timings() reads per-dispatch GPU times.

    It owns its command pool (so that recordings of different threads never share one) and its
    fence; one submission of it may be in flight at a time."""

    def __init__(self, device, pool, cmd, labels, n_barriers, query_pools, keepalive):
        self.device = device
        self.cmd = None             # (until it owns its handles, below: destroy() has nothing to do)
        self.pool = pool
        self.submit_info, self._cmd_arr = device.submit_info([cmd])
        self.labels = labels
        self.n_dispatches = len(labels)
        self.n_barriers = n_barriers
        self.query_pools = query_pools
        self.n_submits = 0
        self._keepalive = keepalive
        self.fence = device.create_fence()
        self.fence_arr = ffi.new("VkFence[]", [self.fence])
        self._handles = [(pool, self.fence, query_pools)]    # taken once by destroy() (list.pop is atomic)
        self.cmd = cmd
        device._recordings.add(self)

    def submit(self):
        """Run the recorded commands on the GPU and wait for them."""
        dev = self.device
        with dev.in_use:            # close() waits for the fence wait before destroying the fence
            self.start()
            dev.wait(self.fence_arr)

    def start(self, info=None):
        """Submit the recorded commands (or `info`: a VkSubmitInfo holding them among others) and
        return at once; device.wait(self.fence_arr) waits for them."""
        if self.cmd is None:
            self.device.check_open()
            raise ValueError("this recording was destroyed (its program was released)")
        self.device.submit(self.submit_info if info is None else info, self.fence_arr)
        self.n_submits += 1

    def allocate_command_buffer(self):
        """Another command buffer from this recording's pool (per-call copies around it)."""
        return self.device.allocate_command_buffer(self.pool)

    def timestamps_ns(self):
        """Raw timestamps in ns: one before the first dispatch and one after each (or, recorded with
        timestamps="ends", one after the last), or None."""
        if not self.query_pools:
            return None
        period = self.device.caps.timestamps.period_ns
        bits = self.device.caps.timestamps.valid_bits
        ts = np.array(self._query_results(), dtype=np.uint64)
        if bits and bits < 64:
            ts &= np.uint64((1 << bits) - 1)
        return ts.astype(np.float64) * period

    def _query_results(self):
        """The raw timestamp values of every query pool (counted: close() waits for the read)."""
        dev = self.device
        with dev.in_use:
            if self.cmd is None:
                raise ValueError("this recording was destroyed (its program was released)")
            vals = []
            for pool, count in self.query_pools:
                data = ffi.new("uint64_t[]", count)
                check(lib.vkGetQueryPoolResults(dev.device, pool, 0, count, 8 * count, data, 8,
                                                vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT),
                      "vkGetQueryPoolResults")
                vals.extend(data[i] for i in range(count))
            return vals

    def timings(self):
        """GPU ns per dispatch (time between its preceding and its own end-of-pipe timestamp)."""
        ts = self.timestamps_ns()
        return None if ts is None else np.diff(ts)

    def total_gpu_ns(self):
        ts = self.timestamps_ns()
        return None if ts is None else float(ts[-1] - ts[0])

    def destroy(self):
        """Destroy the command pool, fence and query pools (once: a finalizer and close() may both
        get here); the caller waited for its submissions, or the device is closing."""
        self.cmd = None
        try:
            handles = self._handles.pop()
        except (IndexError, AttributeError):        # destroyed already, or never made whole
            return
        _release(self.device, handles)

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass


class Recorder:
    """Records dispatches into one command buffer. Use `dispatch(...)` then `finish()`. Record inside a
    counted call (`with device.in_use:`, as the executor, the TCR probe and the floor measurements
    do): close() waits only for counted calls, so a recorder outside one may find its device's
    handles destroyed under it."""

    def __init__(self, device, timestamps=False):
        device.check_open()
        self.device = device
        self._barrier = ffi.new("VkMemoryBarrier*")
        self._barrier.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
        self._barrier.srcAccessMask = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
        self._barrier.dstAccessMask = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
                                       | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        self._host_barrier = ffi.new("VkMemoryBarrier*")
        self._host_barrier.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
        self._host_barrier.srcAccessMask = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
        self._host_barrier.dstAccessMask = vk.VK_ACCESS_HOST_READ_BIT
        self._push_buf = ffi.new("uint8_t[]", 128)
        self._set_buf = ffi.new("VkDescriptorSet[]", 1)
        self._copy = ffi.new("VkBufferCopy*")
        self._writes = {}   # buffer id -> [(lo, hi)] written since the last barrier
        self._reads = {}
        self._bound = None
        self.labels = []
        self.n_barriers = 0
        self._keep = []
        # timestamps=True: one before the first dispatch and one after each; "ends": one before and
        # one after everything (for totals: per-dispatch timestamps would serialise the work timed)
        can = device.caps.timestamps.valid_bits > 0
        self._ends_only = timestamps == "ends" and can
        self.timestamps = bool(timestamps) and not self._ends_only and can
        self._pools = []     # [pool, used]
        # Vulkan objects last: owned (and destroyed by discard() on failure) until finish() hands
        # them to the Recording
        self.cmd = None
        self.pool = device.create_command_pool()
        try:
            self.cmd = device.allocate_command_buffer(self.pool)
            begin = ffi.new("VkCommandBufferBeginInfo*")
            begin.sType = vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO
            check(lib.vkBeginCommandBuffer(self.cmd, begin), "vkBeginCommandBuffer")
            if self.timestamps or self._ends_only:
                self._timestamp(vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT)
        except BaseException:
            self.discard()
            raise

    # --- synchronisation --------------------------------------------------------------------
    def _hazard(self, reads, writes):
        for b, lo, hi in reads:
            if _overlap(self._writes.get(id(b), ()), lo, hi):
                return True
        for b, lo, hi in writes:
            if _overlap(self._writes.get(id(b), ()), lo, hi) or _overlap(self._reads.get(id(b), ()), lo, hi):
                return True
        return False

    def barrier(self):
        """A full compute/transfer -> compute/transfer memory barrier."""
        stages = _STAGE_COMPUTE | _STAGE_TRANSFER
        lib.vkCmdPipelineBarrier(self.cmd, stages, stages, 0, 1, self._barrier, 0, ffi.NULL, 0, ffi.NULL)
        self._writes.clear()
        self._reads.clear()
        self.n_barriers += 1

    def _track(self, reads, writes):
        if self._hazard(reads, writes):
            self.barrier()
        for b, lo, hi in reads:
            self._reads.setdefault(id(b), []).append((lo, hi))
        for b, lo, hi in writes:
            self._writes.setdefault(id(b), []).append((lo, hi))

    def _timestamp(self, stage):
        if not self._pools or self._pools[-1][1] == _QUERY_CHUNK:
            info = ffi.new("VkQueryPoolCreateInfo*")
            info.sType = vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO
            info.queryType = vk.VK_QUERY_TYPE_TIMESTAMP
            info.queryCount = _QUERY_CHUNK
            out = ffi.new("VkQueryPool*")
            check(lib.vkCreateQueryPool(self.device.device, info, ffi.NULL, out), "vkCreateQueryPool")
            lib.vkCmdResetQueryPool(self.cmd, out[0], 0, _QUERY_CHUNK)
            self._pools.append([out[0], 0])
        pool = self._pools[-1]
        lib.vkCmdWriteTimestamp(self.cmd, stage, pool[0], pool[1])
        pool[1] += 1

    # --- commands -----------------------------------------------------------------------------
    def dispatch(self, pipeline, buffers, push, grid, reads=(), writes=(), label=""):
        """Record one dispatch.

        buffers: Buffers (or (Buffer, byte offset)) bound at 0..n-1; push: bytes; grid: (x, y, z) workgroups;
        reads / writes: (buffer, byte_lo, byte_hi) ranges this dispatch touches (for barriers).
        """
        self._track(reads, writes)
        if self._bound is not pipeline.handle:
            lib.vkCmdBindPipeline(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            self._bound = pipeline.handle
        self._set_buf[0] = self.device.pipelines.descriptor_set(pipeline, buffers)
        lib.vkCmdBindDescriptorSets(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1,
                                    self._set_buf, 0, ffi.NULL)
        if push:
            n = (len(push) + 3) // 4 * 4
            ffi.memmove(self._push_buf, push, len(push))
            lib.vkCmdPushConstants(self.cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, n, self._push_buf)
        gx, gy, gz = grid
        lib.vkCmdDispatch(self.cmd, gx, gy, gz)
        self.labels.append(label)
        if self.timestamps:
            self._timestamp(vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT)

    def copy(self, src, src_off, dst, dst_off, nbytes, label="copy"):
        """Buffer-to-buffer copy, tracked like a dispatch."""
        self._track([(src, src_off, src_off + nbytes)], [(dst, dst_off, dst_off + nbytes)])
        self._copy.srcOffset, self._copy.dstOffset, self._copy.size = src_off, dst_off, nbytes
        lib.vkCmdCopyBuffer(self.cmd, src.handle, dst.handle, 1, self._copy)
        self.labels.append(label)
        if self.timestamps:
            self._timestamp(vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT)

    def finish(self):
        """End recording; writes become visible to the host after each submit."""
        if self._ends_only:
            self._timestamp(vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT)
        lib.vkCmdPipelineBarrier(self.cmd, _STAGE_COMPUTE | _STAGE_TRANSFER, _STAGE_HOST, 0, 1,
                                 self._host_barrier, 0, ffi.NULL, 0, ffi.NULL)
        check(lib.vkEndCommandBuffer(self.cmd), "vkEndCommandBuffer")
        pools = [(p, used) for p, used in self._pools]
        rec = Recording(self.device, self.pool, self.cmd, self.labels, self.n_barriers, pools, self._keep)
        self.cmd, self.pool, self._pools = None, None, []      # the Recording owns them now
        if self.device.validation:
            self.device.check_validation("recording a command buffer")
        return rec

    def discard(self):
        """Destroy what an unfinished recording made (its command pool and query pools): a recording
        that failed part way, e.g. at a dispatch whose arguments could not be packed."""
        pool, self.pool, self.cmd = self.pool, None, None
        if pool is not None:
            _release(self.device, (pool, None, [(p, used) for p, used in self._pools]))
        self._pools = []

    def __del__(self):
        try:
            self.discard()          # dropped unfinished (an exception its owner did not catch)
        except Exception:
            pass


def begin_transfer(cmd, one_time=False):
    """(Re-)begin `cmd` with a barrier after all earlier work of the queue, for transfers: earlier
    submissions may still write what it copies (record_copies, Device.one_shot)."""
    check(lib.vkResetCommandBuffer(cmd, 0), "vkResetCommandBuffer")
    begin = ffi.new("VkCommandBufferBeginInfo*")
    begin.sType = vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO
    if one_time:
        begin.flags = vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT
    check(lib.vkBeginCommandBuffer(cmd, begin), "vkBeginCommandBuffer")
    bar = ffi.new("VkMemoryBarrier*")
    bar.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
    bar.srcAccessMask = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
    bar.dstAccessMask = vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
    lib.vkCmdPipelineBarrier(cmd, _STAGE_COMPUTE | _STAGE_TRANSFER, _STAGE_TRANSFER, 0, 1, bar, 0, ffi.NULL,
                             0, ffi.NULL)
    return bar


def record_copies(cmd, copies):
    """(Re-)record `cmd` as: a barrier after all earlier work of the queue, the buffer copies
    (src, src_offset, dst, dst_offset, nbytes), a barrier before all later work. A compiled program
    submits such a command buffer before and after its recording to take device tensors in and out."""
    bar = begin_transfer(cmd)
    region = ffi.new("VkBufferCopy*")
    for src, src_off, dst, dst_off, n in copies:
        region.srcOffset, region.dstOffset, region.size = src_off, dst_off, n
        lib.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1, region)
    bar.srcAccessMask = vk.VK_ACCESS_TRANSFER_WRITE_BIT
    bar.dstAccessMask = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
                         | vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_HOST_READ_BIT)
    lib.vkCmdPipelineBarrier(cmd, _STAGE_TRANSFER, _STAGE_COMPUTE | _STAGE_TRANSFER | _STAGE_HOST, 0, 1, bar,
                             0, ffi.NULL, 0, ffi.NULL)
    check(lib.vkEndCommandBuffer(cmd), "vkEndCommandBuffer")
