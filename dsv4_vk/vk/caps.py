"""What a physical device is and can do, as typed values (read once when the device is probed)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

HOST_VISIBLE = 0x2      # VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT (this module imports no vulkan)


@dataclass(frozen=True)
class SubgroupCaps:
    size: int                       # the default subgroup size of compute pipelines
    min_size: int
    max_size: int
    operations: tuple[str, ...]     # basic, vote, arithmetic, ballot, shuffle, shuffle_relative, clustered, quad
    compute_stage: bool             # subgroup operations are available in compute shaders
    size_control: bool              # VK 1.3 subgroupSizeControl
    full_subgroups: bool            # VK 1.3 computeFullSubgroups
    required_size_compute: bool     # a compute pipeline may require a subgroup size

    def supports(self, *ops: str) -> bool:
        """Whether compute shaders may use every one of the subgroup operation classes `ops`."""
        return self.compute_stage and all(op in self.operations for op in ops)


@dataclass(frozen=True)
class TimestampCaps:
    compute_and_graphics: bool
    period_ns: float
    valid_bits: int


@dataclass(frozen=True)
class Limits:
    max_workgroup_count: tuple[int, int, int]
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_invocations: int
    max_shared_memory: int
    max_push_constants: int
    max_storage_buffer_range: int
    min_storage_buffer_offset_alignment: int


@dataclass(frozen=True)
class MemoryHeap:
    size: int
    device_local: bool


@dataclass(frozen=True)
class MemoryType:
    heap: int
    flags: int


@dataclass(frozen=True)
class QueueFamily:
    flags: int
    count: int
    timestamp_valid_bits: int


@dataclass(frozen=True)
class CoopMatShape:
    """One VK_NV_cooperative_matrix shape at subgroup scope: D (m×n) = A (m×k) · B (k×n) + C."""
    m: int
    n: int
    k: int
    a: str                          # component types: f16, f32, s8, ...
    b: str
    c: str
    d: str


@dataclass(frozen=True)
class FloatControls:
    """VkPhysicalDeviceFloatControlsProperties (Vulkan 1.2): the float widths ("f16", "f32", "f64") for
    which a shader may ask, by an execution mode, to keep subnormals, flush them, round to nearest
    even or toward zero, and keep signed zeros, inf and NaN. None asked, the device's default applies
    (cli.floor.float_edges measures it)."""
    denorm_preserve: tuple[str, ...] = ()
    denorm_flush_to_zero: tuple[str, ...] = ()
    rounding_rte: tuple[str, ...] = ()
    rounding_rtz: tuple[str, ...] = ()
    signed_zero_inf_nan_preserve: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    index: int
    name: str
    type: str                       # discrete-gpu, integrated-gpu, virtual-gpu, cpu, other
    type_code: int
    vendor_id: int
    device_id: int
    api_version: str
    driver_version: int
    driver_name: str
    driver_info: str
    api13: bool
    subgroup: SubgroupCaps
    timestamps: TimestampCaps
    limits: Limits
    memory_heaps: tuple[MemoryHeap, ...]
    memory_types: tuple[MemoryType, ...]
    queues: tuple[QueueFamily, ...]
    # VK_NV_cooperative_matrix shapes (enabled with fp16 and the memory model); empty without
    coopmat: tuple[CoopMatShape, ...] = ()
    # VK_KHR_cooperative_matrix's subgroup shapes where the driver offers it (reported only: not enabled)
    coopmat_khr: tuple[CoopMatShape, ...] = ()
    float_controls: FloatControls = FloatControls()

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    def host_heap(self) -> int | None:
        """The index of the largest heap that is not device-local and has a host-visible memory type
        (on a discrete GPU: system memory it reads over its bus, where a storage buffer may live),
        or None where there is none (a CPU device or an integrated GPU: its memory is all one)."""
        heaps = {t.heap for t in self.memory_types if t.flags & HOST_VISIBLE and not self.memory_heaps[t.heap].device_local}
        return max(heaps, key=lambda h: self.memory_heaps[h].size, default=None)

    def as_dict(self) -> dict:
        """Plain JSON-able values (the `info --json` report)."""
        return dataclasses.asdict(self)

    @staticmethod
    def from_probe(index: int, p: dict) -> "Capabilities":
        sg, ts, lim = p["subgroup"], p["timestamps"], p["limits"]
        limits: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in lim.items()}
        return Capabilities(
            index=index, name=p["name"], type=p["type"], type_code=p["type_code"], vendor_id=p["vendor_id"],
            device_id=p["device_id"], api_version=p["api_version"], driver_version=p["driver_version"],
            driver_name=p["driver_name"], driver_info=p["driver_info"], api13=p["api13"],
            subgroup=SubgroupCaps(size=sg["size"], min_size=sg["min_size"], max_size=sg["max_size"],
                                  operations=tuple(sg["operations"]), compute_stage=sg["compute_stage"],
                                  size_control=sg["size_control"], full_subgroups=sg["full_subgroups"],
                                  required_size_compute=sg["required_size_compute"]),
            timestamps=TimestampCaps(**ts),
            limits=Limits(**limits),
            memory_heaps=tuple(MemoryHeap(**h) for h in p["memory_heaps"]),
            memory_types=tuple(MemoryType(**t) for t in p["memory_types"]),
            queues=tuple(QueueFamily(**q) for q in p["queues"]),
            coopmat=tuple(CoopMatShape(**c) for c in p.get("coopmat", ())),
            coopmat_khr=tuple(CoopMatShape(**c) for c in p.get("coopmat_khr", ())),
            float_controls=FloatControls(**{k: tuple(v) for k, v in p.get("float_controls", {}).items()}),
        )
