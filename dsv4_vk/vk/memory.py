"""Storage buffers, the memory blocks they live in, and a pool that reuses freed buffers by size.

Buffers are sub-allocated from 64 MiB blocks, first fit in their holes (larger ones get their own
allocation): drivers cap
the number of live allocations (NVIDIA: 4096), which an unfused graph of ~190 tensors per HC site
would otherwise exhaust. Where device-local memory is also host-visible (lavapipe, integrated GPUs) a buffer is mapped once
and read/written through a zero-copy numpy view; elsewhere uploads and downloads go through the
device's staging ring (two mapped slots, each with its copy command and fence: a slot is filled
while the copy from the other runs). A buffer made with `host_memory` lives in the device's host
heap (`Capabilities.host_heap`: system memory a discrete GPU reads over its bus), mapped: weights
the device's own memory does not hold; it is destroyed, not pooled, when freed.

Every buffer the graphs use is laid out [guard | data | guard] (`guarded_buffer`): kernels get it
bound past the leading guard, and a sentinel in the guards tells whether a kernel wrote outside.
The pool's free buffers count against the device's byte budget (`Device.cache_bytes`, shared with
the cached programs): past it the least recently freed ones are destroyed.
"""
import collections
import itertools

import numpy as np

from .binding import check, ffi, lib, vk
from .recorder import begin_transfer

_USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
          | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
_HOST = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
DEDICATED_FROM = None   # bytes from which buffers get a dedicated allocation (None: never)
BLOCK_BYTES = 64 << 20  # sub-allocation block; larger buffers get an allocation of their own
KEEP_BLOCKS = False     # keep the open block allocated when it empties (and reuse it) instead of freeing it
GUARD = 64                      # elements before and after every graph storage (256 B: a legal bind offset)
SENTINEL = np.uint32(0x7FC0DEAD)  # a NaN with a payload no kernel produces
_serials = itertools.count(1)


class _Block:
    """One VkDeviceMemory holding one or more buffers: first-fit placement in its holes (a freed
    buffer's range is reused, neighbouring holes merge); freed when no buffer is left."""

    def __init__(self, device, size, memory_type, host_visible, dedicated_for=None, shared=False):
        alloc = ffi.new("VkMemoryAllocateInfo*")
        alloc.sType = vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO
        alloc.allocationSize = size
        alloc.memoryTypeIndex = memory_type
        if dedicated_for is not None:   # its own allocation, which drivers may back with large pages
            ded = ffi.new("VkMemoryDedicatedAllocateInfo*")
            ded.sType = vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO
            ded.buffer = dedicated_for
            alloc.pNext = ded
        mem = ffi.new("VkDeviceMemory*")
        check(lib.vkAllocateMemory(device.device, alloc, ffi.NULL, mem), f"vkAllocateMemory({size} bytes)")
        self.device, self.memory, self.size, self.memory_type = device, mem[0], size, memory_type
        self.holes = [(0, size)]        # free (offset, size) ranges, by offset
        self.live = 0
        self.shared = shared            # a sub-allocation block (else one buffer's own allocation)
        self.host_visible = host_visible
        self.view = None
        if host_visible:
            ptr = ffi.new("void**")
            res = lib.vkMapMemory(device.device, self.memory, 0, size, 0, ptr)
            if res != vk.VK_SUCCESS:    # (the allocation is nobody's yet: give it back)
                lib.vkFreeMemory(device.device, self.memory, ffi.NULL)
                check(res, "vkMapMemory")
            self.view = np.frombuffer(ffi.buffer(ptr[0], size), dtype=np.uint8)

    def free(self):
        """Give the memory back whatever it holds (Device.close: the buffers in it are gone)."""
        self.view = None
        lib.vkFreeMemory(self.device.device, self.memory, ffi.NULL)

    def take(self, size, align):
        """Byte offset of `size` bytes aligned to `align` (the first hole that fits), or None."""
        for i, (off, n) in enumerate(self.holes):
            start = -(-off // align) * align
            if start + size <= off + n:
                rest = [(a, b) for a, b in ((off, start - off), (start + size, off + n - start - size)) if b > 0]
                self.holes[i:i + 1] = rest
                self.live += 1
                return start
        return None

    def release(self, arena, offset, size):
        """A buffer at [offset, offset + size) is gone: its range becomes a hole again."""
        self.live -= 1
        if self.live == 0 and not (KEEP_BLOCKS and self.shared):   # empty: give the memory back
            self.free()
            arena.forget(self)
            return
        holes = self.holes
        i = next((k for k, (o, _) in enumerate(holes) if o > offset), len(holes))
        holes.insert(i, (offset, size))
        if i + 1 < len(holes) and offset + size == holes[i + 1][0]:           # merge with the next hole
            holes[i:i + 2] = [(offset, size + holes[i + 1][1])]
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == holes[i][0]:        # and with the previous one
            holes[i - 1:i + 1] = [(holes[i - 1][0], holes[i - 1][1] + holes[i][1])]


class Arena:
    """Places buffers in blocks: small ones in shared blocks per (memory type, host-visible), first
    fit over the blocks there; large or dedicated ones in allocations of their own."""

    def __init__(self, device):
        self.device = device
        self.shared = {}        # (memory type, host-visible) -> [shared blocks]
        self.blocks = set()     # live VkDeviceMemory allocations

    def place(self, handle, req, memory_type, host_visible, dedicated):
        size, align = int(req.size), max(int(req.alignment), 256)
        key = (memory_type, host_visible)
        if dedicated or size > BLOCK_BYTES // 2:
            block = _Block(self.device, size, memory_type, host_visible, handle if dedicated else None)
        else:
            for block in self.shared.get(key, ()):
                off = block.take(size, align)
                if off is not None:
                    return block, off
            block = _Block(self.device, BLOCK_BYTES, memory_type, host_visible, shared=True)
            self.shared.setdefault(key, []).append(block)
        self.blocks.add(block)
        return block, block.take(size, align)

    def forget(self, block):
        self.blocks.discard(block)
        for blocks in self.shared.values():
            if block in blocks:
                blocks.remove(block)


class Buffer:
    """One VkBuffer placed in a memory block. `nbytes` is the usable size (a multiple of 4, ≥ 4)."""

    def __init__(self, device, nbytes, host_visible=None, dedicated=None, cached=False, host_memory=False):
        """host_memory: in the device's host heap (Capabilities.host_heap: system memory a discrete GPU
        reads over its bus; host-cached where it can be), mapped; on a device whose memory is the host's
        (is_host_visible) an ordinary buffer; a ValueError on a device with neither."""
        self.device = device
        self.alive = False
        self.serial = next(_serials)     # unique for the process (ids and handles are reused)
        self.freed_at = 0                # when the pool last took it back (BufferPool.shrink's order)
        self.nbytes = max(4, (int(nbytes) + 3) // 4 * 4)
        host_visible = device.is_host_visible if host_visible is None or host_memory else host_visible
        self.host_memory = host_memory
        heap = None
        if host_memory and not device.is_host_visible:
            heap = device.caps.host_heap()
            if heap is None:
                raise ValueError(f"{device.name} has no host-visible heap outside its device-local memory: a buffer "
                                 "cannot be placed in host memory there")
            host_visible = cached = True
        self.host_visible = host_visible
        # Made and registered in device._buffers under the device lock, open checked under it too:
        # close() destroys what _buffers holds under that lock, so a buffer is either refused
        # (DeviceClosed) or registered before close() destroys the registered ones -- also for the
        # callers that are not counted calls (a host-visible Param, a kernel probe), which close()
        # does not wait for. (Outside the lock a buffer made as close() ran was never destroyed, and
        # its memory was allocated on a VkDevice close() had destroyed.) Not a per-call path: the
        # pool hands out buffers it made before (and BufferPool.take holds the lock anyway).
        with device.lock:
            device.check_open()
            self._create(device, host_visible, dedicated, cached, heap)
            self.alive = True
            device._buffers.add(self)
        if device.validation:
            device.check_validation("vkCreateBuffer")

    def _create(self, device, host_visible, dedicated, cached, heap=None):
        d = device.device
        info = ffi.new("VkBufferCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO
        info.size = self.nbytes
        info.usage = _USAGE
        info.sharingMode = vk.VK_SHARING_MODE_EXCLUSIVE
        out = ffi.new("VkBuffer*")
        check(lib.vkCreateBuffer(d, info, ffi.NULL, out), "vkCreateBuffer")
        self.handle = out[0]
        try:
            req = ffi.new("VkMemoryRequirements*")
            lib.vkGetBufferMemoryRequirements(d, self.handle, req)
            if host_visible:
                flags = _HOST | (vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT if device.is_host_visible else 0)
            else:
                flags = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
            self.memory_type = None
            if heap is not None:            # the host heap: the device's own memory types are not asked
                flags = _HOST
            if cached and host_visible:     # the host reads what it wrote there (staged checkpoint bytes)
                self.memory_type = device._find_memory(flags | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
                                                       req.memoryTypeBits, required=False, heap=heap)
            if self.memory_type is None:
                self.memory_type = device._find_memory(flags, req.memoryTypeBits, heap=heap)
            if dedicated is None:
                dedicated = DEDICATED_FROM is not None and self.nbytes >= DEDICATED_FROM
            self.block, self.offset = device.arena.place(self.handle, req, self.memory_type, host_visible,
                                                         dedicated)
        except BaseException:
            lib.vkDestroyBuffer(d, self.handle, ffi.NULL)
            raise
        self.memory = self.block.memory
        self._span = int(req.size)
        res = lib.vkBindBufferMemory(d, self.handle, self.memory, self.offset)
        if res != vk.VK_SUCCESS:        # (its range goes back: a block left with no buffer is freed)
            lib.vkDestroyBuffer(d, self.handle, ffi.NULL)
            self.block.release(device.arena, self.offset, self._span)
            check(res, "vkBindBufferMemory")
        self._view = self.block.view[self.offset:self.offset + self.nbytes] if host_visible else None

    def _check(self):
        if not self.alive:
            self.device.check_open()
            raise ValueError(f"{self!r} was released")

    def write(self, data, offset=0):
        """Copy the bytes of numpy array `data` to byte `offset`."""
        self._check()
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if offset < 0 or offset + raw.size > self.nbytes:
            raise ValueError(f"write of {raw.size} bytes at {offset} exceeds buffer of {self.nbytes} bytes")
        if raw.size == 0:
            return
        if self._view is not None:
            self._view[offset:offset + raw.size] = raw
        else:
            staging_copy(self.device, self, offset, raw, upload=True)

    def read(self, offset=0, nbytes=None):
        """Return a copy of `nbytes` bytes from byte `offset` as a uint8 array."""
        self._check()
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"read of {nbytes} bytes at {offset} exceeds buffer of {self.nbytes} bytes")
        if self._view is not None:
            return self._view[offset:offset + nbytes].copy()
        return staging_copy(self.device, self, offset, np.empty(nbytes, np.uint8), upload=False)

    def destroy(self):
        dev = self.device
        with dev.lock:
            if self.alive and not dev.closed:
                self.alive = False
                self._view = None
                dev._buffers.discard(self)
                dev.pipelines.forget_buffer(self)
                lib.vkDestroyBuffer(dev.device, self.handle, ffi.NULL)
                self.block.release(dev.arena, self.offset, self._span)

    def __repr__(self):
        return f"<Buffer {self.nbytes} B>"


STAGING_CHUNK = 64 << 20     # bytes a staged copy moves at most


class _Slot:
    __slots__ = ("buf", "view", "cmd", "fence", "busy")

    def __init__(self, buf, cmd, fence):
        self.buf, self.view, self.cmd, self.fence, self.busy = buf, buf._view, cmd, fence, False

    def mark_busy(self):
        self.busy = True


class StagingRing:
    """`slots` mapped buffers of `chunk` bytes, each with its own command buffer and fence, taken in
    turn: the copy from one slot runs on the GPU while the host fills the next, and a slot is waited
    for only when its turn comes again. One thread uses a ring at a time (the device's under its
    lock); `cached`: host-cached memory where there is some (the host reads back what it wrote)."""

    def __init__(self, device, slots, chunk, cached=False):
        self.device, self.chunk, self.next = device, int(chunk), 0
        self.slots = []                 # [_Slot]
        self.cmd_pool = device.create_command_pool()
        try:
            for _ in range(slots):
                buf = Buffer(device, self.chunk, host_visible=True, cached=cached)
                with device.lock:       # (allocation from the ring's pool, under the lock as every pool use)
                    cmd = device.allocate_command_buffer(self.cmd_pool)
                self.slots.append(_Slot(buf, cmd, ffi.new("VkFence[]", [device.create_fence()])))
        except BaseException:
            self.destroy()
            raise
        self.region = ffi.new("VkBufferCopy*")

    @property
    def nbytes(self):
        return self.chunk * len(self.slots)

    def take(self):
        """The next slot, once the copy it last carried has finished."""
        slot = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        self.wait(slot)
        return slot

    def wait(self, slot):
        if slot.busy:
            self.device.wait(slot.fence)        # (raising, e.g. DeviceClosed: destroy() still waits for it)
            slot.busy = False

    def copy(self, slot, src, src_offset, dst, dst_offset, n):
        """Submit the copy of n bytes src → dst (one of them the slot's buffer); returns at once."""
        cmd, r = slot.cmd, self.region
        begin_transfer(cmd, one_time=True)
        r.srcOffset, r.dstOffset, r.size = src_offset, dst_offset, n
        lib.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1, r)
        check(lib.vkEndCommandBuffer(cmd), "vkEndCommandBuffer")
        info, keep = self.device.submit_info([cmd])
        # in flight once the queue took it (destroy() then waits for it; a copy refused before, e.g.
        # by a closing device, would leave it waiting for a fence never submitted)
        self.device.submit(info, slot.fence, slot.mark_busy)

    def finish(self):
        """Wait for every copy submitted."""
        for slot in self.slots:
            self.wait(slot)

    def destroy(self):
        """Free the slots (after their copies: also while the device closes, before its handles go)."""
        d = self.device.device
        for slot in self.slots:
            if slot.busy:
                lib.vkWaitForFences(d, 1, slot.fence, 1, 600 * 10**9)
            lib.vkDestroyFence(d, slot.fence[0], ffi.NULL)
            slot.buf.destroy()
        self.slots = []
        if self.cmd_pool is not None:
            lib.vkDestroyCommandPool(d, self.cmd_pool, ffi.NULL)
            self.cmd_pool = None


def staging_copy(device, buf, offset, host, upload):
    """Copy between `host` (uint8 array) and `buf` through the device's staging ring, in chunks; an
    upload fills one slot while the copy from the other runs (and returns when the last finished)."""
    with device.lock:       # the staging ring is shared by every thread
        return _staging_copy(device, buf, offset, host, upload)


def _staging_copy(device, buf, offset, host, upload):
    chunk = min(STAGING_CHUNK, max(host.size, 1 << 20))
    ring = device._staging
    if ring is None or ring.chunk < chunk:
        if ring is not None:
            ring.destroy()
            device._staging = None
        ring = device._staging = StagingRing(device, 2, chunk)
    chunk = ring.chunk
    for start in range(0, host.size, chunk):
        n = min(chunk, host.size - start)
        slot = ring.take()
        if upload:
            slot.view[:n] = host[start:start + n]
            ring.copy(slot, slot.buf, 0, buf, offset + start, n)
        else:
            ring.copy(slot, buf, offset + start, slot.buf, 0, n)
            ring.wait(slot)
            host[start:start + n] = slot.view[:n]
    ring.finish()
    return host


def guarded_buffer(device, numel, data=None, host_visible=False, fill_guards=True, size=4, host_memory=False):
    """A pooled buffer laid out [guard | numel elements of `size` bytes | guard], guards set to SENTINEL
    (guards are GUARD 4-byte words; the data region is padded to a multiple of 4 bytes).
    host_visible: mapped even where device memory is not (small values written/read every step);
    host_memory: in the device's host heap (Buffer), where it has one."""
    nbytes = _data_bytes(numel, size)
    if host_memory and not device.is_host_visible:
        buf = Buffer(device, nbytes + 2 * GUARD * 4, host_memory=True)
    elif host_visible and not device.is_host_visible:
        buf = Buffer(device, nbytes + 2 * GUARD * 4, host_visible=True)
    else:
        buf = device.pool.alloc(nbytes + 2 * GUARD * 4)
    if fill_guards:
        guard = np.full(GUARD, SENTINEL, np.uint32)
        buf.write(guard, 0)
        buf.write(guard, GUARD * 4 + nbytes)
    if data is not None:
        buf.write(data, GUARD * 4)
    return buf


def _data_bytes(numel, size):
    return -(-numel * size // 4) * 4


def guards_intact(buf, numel, size=4):
    head = buf.read(0, GUARD * 4).view(np.uint32)
    tail = buf.read(GUARD * 4 + _data_bytes(numel, size), GUARD * 4).view(np.uint32)
    return bool((head == SENTINEL).all() and (tail == SENTINEL).all())


class BufferPool:
    """Hands out buffers, reusing freed ones of the same rounded size (powers of two above 4 KiB).

    Thread-safe. `free_later` may be called from any thread at any time (finalizers): the buffer is
    queued and taken back at the next pool call."""

    def __init__(self, device):
        self.device = device
        self._free = {}                             # size -> [Buffer], most recently freed last
        self._clock = 0                             # counts frees: a buffer's freed_at orders shrink()
        self._all = []
        self._later = collections.deque()
        self.free_bytes = 0

    @staticmethod
    def bucket(nbytes):
        nbytes = max(4, int(nbytes))
        if nbytes <= 4096:
            return (nbytes + 255) // 256 * 256
        return 1 << (nbytes - 1).bit_length()

    def alloc(self, nbytes):
        return self.alloc_many((nbytes,))[0]

    def alloc_many(self, sizes):
        """One buffer of at least each of `sizes` bytes (under one lock)."""
        return self.take([self.bucket(n) for n in sizes])

    def take(self, buckets):
        """One buffer of each of `buckets` (sizes from bucket(): the per-call path, where callers
        computed them once)."""
        out = []
        with self.device.lock:
            if self.device._closed:
                self.device.check_open()
            if self._later:
                self._drain()
            for size in buckets:
                free = self._free.get(size)
                if free:
                    buf = free.pop()
                    self.free_bytes -= buf.nbytes
                else:
                    buf = Buffer(self.device, size)
                    self._all.append(buf)
                out.append(buf)
        return out

    def free(self, buf):
        with self.device.lock:
            self._drain()
            self._put(buf)
        self.device.programs.enforce_budget()

    def free_later(self, buf):
        """Queue `buf` for return (safe from finalizers and other threads: no lock is taken)."""
        self._later.append(buf)

    def _put(self, buf):
        if not buf.alive:
            return
        if buf.host_visible and not self.device.is_host_visible:
            buf.destroy()       # a mapped buffer made outside the pool: never handed out for device data
            return
        self._clock += 1
        buf.freed_at = self._clock
        free = self._free.get(buf.nbytes)
        if free is None:
            self._free[buf.nbytes] = [buf]
        else:
            free.append(buf)
        self.free_bytes += buf.nbytes

    def _drain(self):
        while self._later:
            self._put(self._later.popleft())

    def drain(self):
        """Take back the buffers queued by free_later."""
        if self._later:
            with self.device.lock:
                self._drain()

    def shrink(self, keep_bytes):
        """Destroy the least recently freed buffers until at most `keep_bytes` are free."""
        with self.device.lock:
            self._drain()
            dead = set()
            if self.free_bytes > keep_bytes:        # the least recently freed first (rare: no index kept)
                for buf in sorted((b for bufs in self._free.values() for b in bufs), key=lambda b: b.freed_at):
                    if self.free_bytes <= keep_bytes:
                        break
                    self._free[buf.nbytes].remove(buf)
                    self.free_bytes -= buf.nbytes
                    dead.add(buf.serial)
                    buf.destroy()
            if dead:
                self._all = [b for b in self._all if b.serial not in dead]

    def trim(self):
        """Destroy every buffer that is free now."""
        self.shrink(0)

    def destroy(self):
        self._later.clear()
        for b in self._all:
            b.destroy()
        if self.device._staging is not None:
            self.device._staging.destroy()
        self._all, self._free, self.free_bytes = [], {}, 0
        self._clock = 0
