"""The logical device with one compute queue on the chosen physical device (vk.instance makes the
instance, probes the physical devices and chooses one).

Device choice: discrete GPU, then integrated, virtual, CPU (lavapipe). `Device(index or name)` or
`DSV4_VK_DEVICE` picks by index (as listed by `python -m dsv4_vk info --all`) or by a
case-insensitive name substring. `DSV4_VK_VALIDATION=1` enables VK_LAYER_KHRONOS_validation with
synchronization validation; every message it reports raises ValidationError from the call that
caused it.

Threads: one device may be used from several threads. `lock` (re-entrant) guards the queue, the
shared descriptor pools, the pipeline cache, the buffer pool and the staging buffer; each recording
owns its command pool and fence, so recordings of different threads never share one. GPU waits
happen outside the lock. Calls that use the device's handles are counted (`begin_use`/`end_use`):
close() refuses new calls, waits for the counted ones to end, then destroys everything, so no
thread waits on a fence (or writes mapped memory) that close() is destroying.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import env
from .binding import ERROR_FRAGMENTED_POOL, ERROR_OUT_OF_POOL_MEMORY, Handle, check, ffi, lib, vk
from .caps import Capabilities
from .errors import DeviceClosed, ValidationError, VulkanError, VulkanUnavailable
from .instance import (COOPMAT_NV, choose, create_instance, create_messenger, keep_alive, link_chain, physical_devices,
                       probe_device)
from .recorder import begin_transfer, destroy_recording

if TYPE_CHECKING:
    from .memory import Buffer
    from .tensor import Tensor

DEFAULT_CACHE_BYTES = 1 << 30   # budget of cached programs + free pooled buffers (DSV4_VK_CACHE_BYTES)
DEFAULT_SPIN_US = 2000          # fence polling before sleeping, on GPUs (DSV4_VK_SPIN_US; 0: sleep at once)



class Device:
    """A logical device with one compute queue; a context manager, safe to use from several threads.

    `Device()` opens the default choice (DSV4_VK_DEVICE, else the best device), `Device(1)` or
    `Device("llvmpipe")` a chosen one. `close()` is idempotent; any later use of the device, or of a
    tensor or program on it, raises DeviceClosed."""

    def __init__(self, selector: int | str | None = None, validation: bool | None = None):
        env.report_unknown()
        if validation is None:
            validation = env.flag("DSV4_VK_VALIDATION")
        force_staging = env.flag("DSV4_VK_FORCE_STAGING")
        no_coopmat = env.flag("DSV4_VK_DISABLE_COOPMAT")
        self.cache_bytes = env.byte_size("DSV4_VK_CACHE_BYTES", DEFAULT_CACHE_BYTES)
        spin_us = env.integer("DSV4_VK_SPIN_US", -1, 0, 10**7, "microseconds to poll a fence before sleeping")
        what = "Device"
        if selector is None and _chosen is not None:
            selector, what = _chosen
        elif selector is None:
            selector, what = os.environ.get("DSV4_VK_DEVICE") or None, "DSV4_VK_DEVICE"
        elif isinstance(selector, bool) or not isinstance(selector, (int, str)) or \
                (isinstance(selector, int) and selector < 0):
            raise ValueError(f"Device(selector): expected a device index ≥ 0 or a name substring, got {selector!r}")
        selector = str(selector) if selector is not None else None
        self.serial = next(_serials)    # the process's devices in the order opened (repr)
        self._closed = True             # until every handle exists: close() then has nothing to undo
        self._closing = True            # set when close() begins (and until the device is open): calls refused
        self._users: list[None] = []    # one entry per counted call inside the device now (begin_use)
        self.in_use = _InUse(self)      # `with device.in_use:` counts the block (begin_use / end_use)
        self._orphans: list[tuple] = []  # handles of recordings destroyed while closing: close() destroys them
        self.lock = threading.RLock()
        self.validation = validation
        self.instance = create_instance(validation)
        # every validation message is kept here; the ones of the current thread's last call raise
        self.validation_messages: list[tuple[int, str]] = []
        self._pending_messages = threading.local()
        self._messenger = None
        try:
            self._messenger = create_messenger(self.instance, self._on_message) if validation else None
            pds = physical_devices(self.instance)
            probes = [probe_device(self.instance, pd) for pd in pds]
            self.index = choose(probes, selector, what)
        except BaseException:
            self._destroy_instance()
            raise
        self.physical = pds[self.index]
        probe = probes[self.index]
        self.coopmat_disabled = no_coopmat and bool(probe.get("coopmat"))   # (what `info` names as the reason)
        if no_coopmat:                  # neither enabled nor offered to the kernels
            probe = {**probe, "coopmat": []}
        self.caps = Capabilities.from_probe(self.index, probe)
        self.queue_family = next((i for i, q in enumerate(self.caps.queues) if q.flags & vk.VK_QUEUE_COMPUTE_BIT),
                                 None)
        if self.queue_family is None:
            raise VulkanUnavailable(f"device {self.caps.name} has no compute queue")
        self._create_device()
        # Map device memory directly where it is host-visible and the device shares host memory
        # (lavapipe, integrated GPUs); DSV4_VK_FORCE_STAGING=1 tests the discrete-GPU staging path.
        self.is_host_visible = self._find_memory(vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
                                                 | vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
                                                 | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, required=False) is not None \
            and self.caps.type_code in (1, 4) and not force_staging
        # Waiting: poll the fence for up to spin_ns, then sleep in vkWaitForFences. A thread woken
        # from sleep pays the wake-up and then runs the caller's next Python on cold caches (on the
        # H200's host about 10 µs a call); polling costs one core while a GPU works. Off on CPU
        # devices, where the poller would take a core from the device itself.
        default_spin = 0 if self.caps.type_code == 4 else DEFAULT_SPIN_US
        self.spin_ns = 1000 * (default_spin if spin_us < 0 else spin_us)
        self._staging = None
        self._one_shot: tuple[Handle, Handle] | None = None
        self._recordings: weakref.WeakSet = weakref.WeakSet()    # destroyed at close() if their owners still hold them
        # every live Buffer, held strongly until its destroy(): close() destroys what is left, also
        # buffers whose owners dropped them without destroy() (a program finalized as close() began,
        # the mapped pair its finalizer queued in the pool, which close() then forgets); a weak set
        # lost those, and their VkBuffer and VkDeviceMemory outlived vkDestroyDevice
        self._buffers: set[Buffer] = set()
        from .cache import ProgramCache
        from .memory import Arena, BufferPool
        from .pipeline import PipelineCache
        self.arena = Arena(self)
        self.pool = BufferPool(self)
        self.pipelines = PipelineCache(self)
        self.programs = ProgramCache(self)
        self._closed = self._closing = False

    # --- state --------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """Raise DeviceClosed once close() has begun (called by every entry point)."""
        if self._closing:
            raise DeviceClosed(f"device {self.caps.name!r} was closed: open a new one with dsv4_vk.Device() "
                               "(or default_device(), which reopens the default device)")

    def begin_use(self) -> None:
        """Count a call that uses the device's handles until its end_use() (in a `finally`; or the
        block `with device.in_use:`): close() waits for every counted call to end before it destroys
        anything. Raises DeviceClosed once close() has begun. Lock-free, for the per-call path: a list
        append, a flag read, a pop (CompiledGraph's per-call methods inline these steps, in this order)."""
        users = self._users
        users.append(None)      # counted first, checked second; close() sets _closing first, reads the
        if self._closing:       # count second: one of the two sees the other (the GIL orders them)
            users.pop()
            self.check_open()

    def end_use(self) -> None:
        """The end of a call counted by begin_use()."""
        self._users.pop()

    def try_begin_use(self) -> bool:
        """begin_use() → True; False where the device is closing or closed, for releasing code (a
        finalizer, release()): close() destroys the handles then, so it leaves them alone."""
        try:
            self.begin_use()
        except DeviceClosed:
            return False
        return True

    def _on_message(self, severity, msg):
        self.validation_messages.append((severity, msg))
        pending = getattr(self._pending_messages, "items", None)
        if pending is None:
            pending = self._pending_messages.items = []
        pending.append((severity, msg))

    def check_validation(self, what: str = "the last call") -> None:
        """With validation on: raise ValidationError for messages the layer reported in this thread."""
        pending = getattr(self._pending_messages, "items", None)
        if pending:
            self._pending_messages.items = []
            text = "\n".join(f"[{sev}] {msg}" for sev, msg in pending)
            raise ValidationError(f"the Vulkan validation layer reported {len(pending)} message(s) for {what}:\n{text}")

    def __enter__(self) -> "Device":
        self.check_open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- set-up -----------------------------------------------------------------------------
    def _create_device(self):
        keep = []
        prio = keep_alive(keep, ffi.new("float[]", [1.0]))
        qinfo = keep_alive(keep, ffi.new("VkDeviceQueueCreateInfo*"))
        qinfo.sType = vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO
        qinfo.queueFamilyIndex = self.queue_family
        qinfo.queueCount = 1
        qinfo.pQueuePriorities = prio
        info = keep_alive(keep, ffi.new("VkDeviceCreateInfo*"))
        info.sType = vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO
        info.queueCreateInfoCount = 1
        info.pQueueCreateInfos = qinfo
        sgc = self.caps.subgroup
        chain = []                          # feature structs, linked into info.pNext in order
        if self.caps.api13 and (sgc.size_control or sgc.full_subgroups):
            f13 = keep_alive(keep, ffi.new("VkPhysicalDeviceVulkan13Features*"))
            f13.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES
            f13.subgroupSizeControl = int(sgc.size_control)
            f13.computeFullSubgroups = int(sgc.full_subgroups)
            chain.append(f13)
        if self.caps.coopmat:             # the tensor-core kernels' extension, fp16 and memory model
            f12 = keep_alive(keep, ffi.new("VkPhysicalDeviceVulkan12Features*"))
            f12.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES
            f12.shaderFloat16 = 1
            f12.vulkanMemoryModel = 1
            cmf = keep_alive(keep, ffi.new("VkPhysicalDeviceCooperativeMatrixFeaturesNV*"))
            cmf.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV
            cmf.cooperativeMatrix = 1
            chain += [f12, cmf]
            info.enabledExtensionCount = 1
            info.ppEnabledExtensionNames = keep_alive(keep, ffi.new("char*[]", [keep_alive(keep, ffi.new("char[]", COOPMAT_NV))]))
        if chain:
            info.pNext = link_chain(chain)
        out = ffi.new("VkDevice*")
        check(lib.vkCreateDevice(self.physical, info, ffi.NULL, out), "vkCreateDevice")
        self.device = out[0]
        q = ffi.new("VkQueue*")
        lib.vkGetDeviceQueue(self.device, self.queue_family, 0, q)
        self.queue = q[0]
        self.command_pool = self.create_command_pool()     # the one-shot (staging) commands; under `lock`
        self._desc_pools = []
        self._new_descriptor_pool()

    DESCRIPTOR_POOL_SETS = 1024   # sets per descriptor pool; more pools are created as needed

    def _new_descriptor_pool(self):
        sets = self.DESCRIPTOR_POOL_SETS
        self._desc_pool_left = sets
        size = ffi.new("VkDescriptorPoolSize*")
        size.type = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
        size.descriptorCount = sets * 8
        info = ffi.new("VkDescriptorPoolCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO
        info.flags = vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT
        info.maxSets = sets
        info.poolSizeCount = 1
        info.pPoolSizes = size
        out = ffi.new("VkDescriptorPool*")
        check(lib.vkCreateDescriptorPool(self.device, info, ffi.NULL, out), "vkCreateDescriptorPool")
        self._desc_pools.append(out[0])

    def _find_memory(self, flags, type_bits=0xFFFFFFFF, required=True, heap=None):
        """The first memory type with `flags` among type_bits (and in heap `heap`, where given)."""
        for i, t in enumerate(self.caps.memory_types):
            if (type_bits >> i) & 1 and (t.flags & flags) == flags and heap in (None, t.heap):
                return i
        if required:
            raise VulkanError(f"no memory type with flags {flags:#x} among bits {type_bits:#x}"
                              + (f" in heap {heap}" if heap is not None else ""))
        return None

    # --- descriptor sets (the pools are shared: callers hold `lock`) ------------------------------
    def allocate_descriptor_set(self, layout: Handle) -> tuple[Handle, Handle]:
        self.check_open()
        lay = ffi.new("VkDescriptorSetLayout[]", [layout])
        info = ffi.new("VkDescriptorSetAllocateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO
        info.descriptorSetCount = 1
        info.pSetLayouts = lay
        out = ffi.new("VkDescriptorSet*")
        with self.lock:
            # count sets ourselves: some drivers (lavapipe) never report an exhausted pool
            if self._desc_pool_left == 0:
                self._new_descriptor_pool()
            for attempt in range(2):
                info.descriptorPool = self._desc_pools[-1]
                res = lib.vkAllocateDescriptorSets(self.device, info, out)
                if res == 0:
                    self._desc_pool_left -= 1
                    return out[0], self._desc_pools[-1]
                if res in (ERROR_OUT_OF_POOL_MEMORY, ERROR_FRAGMENTED_POOL) and attempt == 0:
                    self._new_descriptor_pool()
                    continue
                check(res, "vkAllocateDescriptorSets")
        raise AssertionError("unreachable: the second attempt returns or raises")

    def free_descriptor_set(self, pool: Handle, dset: Handle) -> None:
        if self._closed:
            return
        arr = ffi.new("VkDescriptorSet[]", [dset])
        with self.lock:
            lib.vkFreeDescriptorSets(self.device, pool, 1, arr)

    # --- command buffers ----------------------------------------------------------------------
    def create_command_pool(self) -> Handle:
        """A command pool of the compute queue family; its owner uses it from one thread at a time."""
        pinfo = ffi.new("VkCommandPoolCreateInfo*")
        pinfo.sType = vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO
        pinfo.flags = vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT
        pinfo.queueFamilyIndex = self.queue_family
        cp = ffi.new("VkCommandPool*")
        check(lib.vkCreateCommandPool(self.device, pinfo, ffi.NULL, cp), "vkCreateCommandPool")
        return cp[0]

    def allocate_command_buffer(self, pool: Handle | None = None) -> Handle:
        self.check_open()
        info = ffi.new("VkCommandBufferAllocateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO
        info.commandPool = self.command_pool if pool is None else pool
        info.level = vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY
        info.commandBufferCount = 1
        out = ffi.new("VkCommandBuffer*")
        check(lib.vkAllocateCommandBuffers(self.device, info, out), "vkAllocateCommandBuffers")
        return out[0]

    def create_fence(self) -> Handle:
        self.check_open()
        info = ffi.new("VkFenceCreateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO
        out = ffi.new("VkFence*")
        check(lib.vkCreateFence(self.device, info, ffi.NULL, out), "vkCreateFence")
        return out[0]

    @staticmethod
    def submit_info(cmds: Sequence[Handle]) -> tuple[Handle, Handle]:
        """A VkSubmitInfo for the command buffers `cmds` (built once per recording, reused per submit)."""
        arr = ffi.new("VkCommandBuffer[]", list(cmds))
        info = ffi.new("VkSubmitInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        info.commandBufferCount = len(cmds)
        info.pCommandBuffers = arr
        return info, arr

    def submit(self, info: Handle, fence_arr: Handle, submitted: Callable[[], object] | None = None) -> None:
        """Submit a VkSubmitInfo with fence fence_arr[0] (a VkFence[1]); returns without waiting.
        submitted(): called once the queue took it (the fence will signal), before any error is raised."""
        with self.lock:
            self.check_open()
            check(lib.vkResetFences(self.device, 1, fence_arr), "vkResetFences")
            res = lib.vkQueueSubmit(self.queue, 1, info, fence_arr[0])
            if res == vk.VK_SUCCESS and submitted is not None:
                submitted()
        if self.validation:
            self.check_validation("vkQueueSubmit")
        check(res, "vkQueueSubmit")

    def wait(self, fence_arr: Handle, timeout_ns: int = 600 * 10**9) -> None:
        """Block until the submission signalling fence_arr[0] finished (outside the device lock)."""
        self.check_open()
        res = vk.VK_NOT_READY
        if self.spin_ns:
            end = time.perf_counter_ns() + min(self.spin_ns, timeout_ns)
            while True:
                res = lib.vkGetFenceStatus(self.device, fence_arr[0])
                if res != vk.VK_NOT_READY:
                    check(res, "vkGetFenceStatus")
                    break
                if time.perf_counter_ns() >= end:
                    break
        if res != vk.VK_SUCCESS:
            res = lib.vkWaitForFences(self.device, 1, fence_arr, 1, timeout_ns)
            if res == vk.VK_TIMEOUT:
                raise VulkanError(f"GPU work did not finish within {timeout_ns / 1e9:.0f} s")
            check(res, "vkWaitForFences")
        if self.validation:
            self.check_validation("the submitted work")

    def submit_and_wait(self, cmd: Handle, fence: Handle, timeout_ns: int = 600 * 10**9) -> None:
        """Submit one recorded command buffer and block until the GPU finished it."""
        info, keep = self.submit_info([cmd])
        fences = ffi.new("VkFence[]", [fence])
        self.submit(info, fences)
        self.wait(fences, timeout_ns)

    def one_shot(self, record: Callable[[Handle], object]) -> None:
        """Record commands with `record(cmd)` into the shared one-shot command buffer, submit and wait
        (holding `lock` throughout: the command buffer and the staging buffer are shared)."""
        with self.lock:
            self.check_open()
            if self._one_shot is None:
                self._one_shot = (self.allocate_command_buffer(), self.create_fence())
            cmd, fence = self._one_shot
            begin_transfer(cmd, one_time=True)
            record(cmd)
            check(lib.vkEndCommandBuffer(cmd), "vkEndCommandBuffer")
            self.submit_and_wait(cmd, fence)

    # --- device tensors -------------------------------------------------------------------------
    def tensor(self, array: Any, dtype: Any = None) -> "Tensor":
        """A device Tensor holding a copy of `array` (float64 becomes float32)."""
        from .tensor import Tensor
        with self.in_use:           # (close() waits for the buffer and the upload)
            return Tensor.from_array(self, array, dtype)

    def empty(self, shape: Sequence[int], dtype: Any = "f32") -> "Tensor":
        """An uninitialised device Tensor of `shape` (dtype float32 or int32)."""
        from .tensor import Tensor
        with self.in_use:
            return Tensor(self, shape, dtype)

    def trim(self) -> None:
        """Release every cached program that is not in use, every free pooled buffer and the staging
        buffer of uploads and reads (discrete GPUs; made again on the next one) now."""
        self.check_open()
        self.programs.trim()
        with self.lock:
            self.pool.trim()
            if self._staging is not None:
                self._staging.destroy()
                self._staging = None

    def memory_stats(self) -> dict:
        """Bytes and counts of what the device holds (the soak and the memory tests watch these)."""
        with self.lock:
            return {"allocations": len(self.arena.blocks), "allocated_bytes": sum(b.size for b in self.arena.blocks),
                    "pool_buffers": len(self.pool._all), "pool_free_bytes": self.pool.free_bytes,
                    "cached_programs": self.programs.count, "cached_program_bytes": self.programs.nbytes,
                    "budget_bytes": self.cache_bytes}

    # --- convenience ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.caps.name

    @property
    def subgroup_size(self) -> int:
        return self.caps.subgroup.size

    def supports_subgroup_op(self, op: str) -> bool:
        return self.caps.subgroup.supports(op)

    def wait_idle(self) -> None:
        with self.in_use:
            lib.vkDeviceWaitIdle(self.device)

    def close(self) -> None:
        """Refuse new calls, wait for the calls other threads are inside of and for the GPU, destroy
        everything the device made; idempotent. A call racing with close() completes or raises
        DeviceClosed."""
        self._closing = True            # from here on begin_use() and check_open() raise DeviceClosed
        while self._users:              # counted calls end before their handles go (a fence a thread
            time.sleep(0.001)           # waits on, mapped memory it reads); rare, so a poll will do
        with self.lock:
            if self._closed:
                return
            lib.vkDeviceWaitIdle(self.device)
            for rec in list(self._recordings):
                rec.destroy()           # (hands its handles to _orphans: the device is closing)
            while self._orphans:        # ... and those of recordings finalized while it was closing
                destroy_recording(self.device, *self._orphans.pop())
            if self._one_shot is not None:
                lib.vkDestroyFence(self.device, self._one_shot[1], ffi.NULL)
            self.pipelines.destroy()
            self.pool.destroy()
            for buf in list(self._buffers):
                buf.destroy()
            self._buffers.clear()
            for block in list(self.arena.blocks):   # blocks no buffer holds (KEEP_BLOCKS keeps them)
                block.free()
            self.arena.blocks.clear()
            self.arena.shared.clear()
            self._closed = True
            for p in self._desc_pools:
                lib.vkDestroyDescriptorPool(self.device, p, ffi.NULL)
            lib.vkDestroyCommandPool(self.device, self.command_pool, ffi.NULL)
            lib.vkDestroyDevice(self.device, ffi.NULL)
            self._destroy_instance()
        self.programs.clear()           # after _closed: put() keeps nothing from here on
        if self.validation:
            self.check_validation("closing the device")     # e.g. objects still alive at vkDestroyDevice

    def __del__(self):
        # A device dropped without close() (nothing refers to it any more: no tensor, program or
        # site of it is alive, so no call is inside it and no lock of it is held) frees its memory and
        # handles as close() would, when the garbage collector takes it. Not at interpreter exit,
        # where the modules it needs may be gone (the process's end frees everything anyway).
        if getattr(self, "_closed", True) or sys.is_finalizing():
            return
        self.close()

    def _destroy_instance(self):
        if self._messenger is not None:
            fn = ffi.cast("PFN_vkDestroyDebugUtilsMessengerEXT",
                          lib.vkGetInstanceProcAddr(self.instance, b"vkDestroyDebugUtilsMessengerEXT"))
            fn(self.instance, self._messenger[0], ffi.NULL)
        lib.vkDestroyInstance(self.instance, ffi.NULL)

    def __repr__(self):
        state = " closed" if self._closed else ""
        # the number tells two devices on the same GPU apart (in "lives on ..., the call runs on ...")
        return f"<Device #{self.serial} {self.name!r} {self.caps.type} subgroup={self.subgroup_size}{state}>"


_default = None
class _InUse:
    """`with device.in_use:` — the block counted as a call inside the device (Device.begin_use)."""
    __slots__ = ("device",)

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        self.device.begin_use()

    def __exit__(self, *exc):
        self.device.end_use()


_serials = itertools.count(1)
_default_lock = threading.Lock()


_chosen = None             # (selector, how the user gave it) from choose_default: the command line's --device


def choose_default(selector: str, given_as: str) -> None:
    """Make `selector` what Device() and default_device() open in this process, named `given_as` in
    their errors (the command line's --device), in place of DSV4_VK_DEVICE."""
    global _chosen
    _chosen = (selector, given_as)


def default_device() -> Device:
    """The process-wide device, created on first use and created again after it was closed."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Device()
        return _default
