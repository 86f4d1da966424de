"""Where a model's params live, decided before anything is allocated: the device bytes a Model needs
(check_memory), and which layers' routed experts live in host memory where the device's own memory
does not hold everything (expert_offload).

A discrete GPU reads a storage buffer in system memory over its bus (Capabilities.host_heap). Decode
reads only the picked experts of a layer's stack (num_experts_per_tok of n_routed_experts), so a
layer whose routed-expert stacks (layers.{i}.ffn.w13 / w2 with their scales, and their parts past
one binding) live there costs a token only those experts' bytes over the bus; everything else (the
attention, the shared expert where it has params of its own, the cache) stays in device memory.
Whole layers move: the graphs, their dispatches and the stacks' splits are the same wherever a
stack lives.
"""
from __future__ import annotations

from typing import Literal, Union

import numpy as np

from .params import cache_shapes
from .config import V4Config

HISTORY = "step.history"      # i32 [max_ctx]: the token sampled after each position (multi-step decode)
ExpertOffload = Union[Literal["auto"], bool, int]


def _tensor_bytes(cfg: V4Config, chunk: int) -> dict:
    """{name: bytes} of what grows with max_ctx: the cache params (cache_shapes), the multi-step
    token history, and each indexer's scores of a prefill chunk (a temporary)."""
    shapes = cache_shapes(cfg, chunk)
    sizes = {name: int(np.prod(shape, dtype=np.int64)) * dt.itemsize for name, (shape, dt) in shapes.items()}
    sizes[HISTORY] = 4 * cfg.max_ctx
    for i in range(cfg.num_hidden_layers):
        if f"layers.{i}.idx.ent" in shapes:
            sizes[f"layers.{i} indexer scores of a prefill chunk"] = 4 * chunk * shapes[f"layers.{i}.idx.ent"][0][0]
    return sizes


def offload_value(value: object) -> Literal["auto"] | int:
    """expert_offload as "auto" or a number of layers (False: 0); ValueError naming what is allowed."""
    if value is False:
        return 0
    if isinstance(value, str) and value == "auto":
        return "auto"
    if not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= 0:
        return int(value)
    raise ValueError(f"expert_offload must be 'auto' (routed experts in host memory only where the device's own "
                     f"memory does not hold everything), False (never) or a number of layers ≥ 0, got {value!r}")


def device_budget(value: object) -> int | None:
    """max_device_memory as bytes or None; ValueError naming what is allowed."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"max_device_memory must be a number of bytes ≥ 1 or None (the device's largest "
                         f"device-local heap), got {value!r}")
    return int(value)


def host_heap_bytes(device) -> int | None:
    """The bytes of the device's host heap (system memory it reads over its bus), None without one."""
    i = device.caps.host_heap()
    return None if i is None else device.caps.memory_heaps[i].size


def _shares_host_memory(device) -> bool:
    """Whether the device's own memory is the host's (lavapipe, integrated GPUs): moving experts to
    host memory frees none of it."""
    return bool(getattr(device, "is_host_visible", False))


def check_memory(cfg: V4Config, weight_bytes: int, chunk: int, device, experts=(), offload: object = "auto",
                 max_device_memory: object = None) -> dict:
    """The device bytes a Model of cfg needs, checked before anything is allocated, and where its
    routed experts go: {"cache": the decode cache, RoPE tables, per-step values and token history
    (exact), "weights": weight_bytes, "total", "available": the device's largest device-local heap
    (or max_device_memory), "offloaded": the layers whose routed experts live in host memory, "host":
    their bytes, "device": total − host (where the device's memory is not the host's)}.
    experts: per layer, its routed-expert stacks' bytes (build.expert_stack_bytes; none: nothing can
    move). offload: "auto" (the fewest layers, largest stacks first, that make the rest fit; none
    where everything fits), False or a number of layers (those first). ValueError naming max_ctx, the
    bytes needed and available (about the largest max_ctx that fits, and the layers expert_offload
    would move) where they do not fit; naming the host heap's bytes where the experts do not fit
    there, or that the device has none; or where one tensor that grows with max_ctx (a cache tensor,
    a prefill chunk's indexer scores) would exceed the device's maxStorageBufferRange (each tensor is
    bound whole)."""
    C = cfg.max_ctx
    how = offload_value(offload)
    budget = device_budget(max_device_memory)
    sizes, sizes2 = _tensor_bytes(cfg, chunk), _tensor_bytes(cfg.replace(max_ctx=2 * C), chunk)
    cache = sum(v for k, v in sizes.items() if " " not in k)
    wbytes = int(weight_bytes)
    heaps = [h.size for h in device.caps.memory_heaps if h.device_local] or [h.size for h in device.caps.memory_heaps]
    have, limit = max(heaps), device.caps.limits.max_storage_buffer_range
    where = "its largest device-local heap"
    if budget is not None and budget < have:
        have, where = budget, "max_device_memory"
    shared = _shares_host_memory(device)
    order = [i for i in sorted(range(len(experts)), key=lambda i: (-experts[i], i)) if experts[i] > 0]
    freed = np.cumsum([0] + [int(experts[i]) for i in order]).tolist()     # host bytes of the first n layers

    def fewest_layers():
        """The fewest layers whose experts in host memory make the rest fit (None: not even all)."""
        return next((n for n, f in enumerate(freed) if cache + wbytes - f <= have), None)

    if how == "auto":
        n = 0 if cache + wbytes <= have or shared else (fewest_layers() or 0)
    else:
        n = how
        if n > len(order):
            raise ValueError(f"expert_offload = {n}: the model has {_layers(len(order))} with routed experts")
    layers = tuple(sorted(order[:n]))
    host = freed[n]
    on_device = wbytes - (0 if shared else host)

    def largest_fitting():
        """About the largest max_ctx within the heap and the binding range (sizes are linear in it)."""
        fits = []
        slope = (sum(v for k, v in sizes2.items() if " " not in k) - cache) / C
        if slope > 0:
            fits.append((have - on_device - (cache - slope * C)) / slope)
        for k, v in sizes.items():
            d = (sizes2[k] - v) / C
            if d > 0:
                fits.append((limit - (v - d * C)) / d)
        return int(min(fits)) if fits else C

    name, big = max(sizes.items(), key=lambda kv: kv[1])
    if cache + on_device > have or big > limit:
        fits = largest_fitting()
        hint = f"; max_ctx at most about {fits} fits" if fits >= 1 else "; the weights alone do not fit"
        if cache + on_device > have:
            apart = f" besides {host} bytes of routed experts in host memory" if host and not shared else ""
            more = _offload_hint(order, fewest_layers(), freed, n, shared, device)
            raise ValueError(f"max_ctx = {C} needs {cache + on_device} bytes of device memory ({cache} for the decode "
                             f"cache and RoPE tables, {on_device} for the weights{apart}); {device.name} has {have} "
                             f"bytes available ({where}){hint}{more}")
        raise ValueError(f"max_ctx = {C}: {name} would take {big} bytes, past {device.name}'s maxStorageBufferRange "
                         f"of {limit} bytes (each tensor is bound whole){hint}"
                         + (" (or lower prefill_chunk)" if " " in name else ""))
    if layers and not shared:
        room = host_heap_bytes(device)
        if room is None:
            raise ValueError(f"expert_offload: the routed experts of {_layers(n)} ({host} bytes) would go to host memory, "
                             f"but {device.name} has no host-visible heap outside its device-local memory")
        if host > room:
            raise ValueError(f"expert_offload: the routed experts of {_layers(n)} need {host} bytes of host memory the "
                             f"device reads; {device.name}'s host heap has {room} bytes")
    return {"cache": cache, "weights": wbytes, "total": cache + wbytes, "available": have, "offloaded": layers,
            "host": host, "device": cache + on_device}


def _layers(n: int) -> str:
    return f"{n} layer" if n == 1 else f"{n} layers"


def _offload_hint(order, fewest, freed, n, shared, device) -> str:
    """What moving routed experts to host memory would do, for check_memory's refusal."""
    if not order:
        return ""
    if shared:
        return ("; routed experts in host memory (expert_offload) would free none of it: this device's memory "
                "is the host's" if fewest is not None else "")
    if fewest is None:
        return (f"; with the routed experts of all {_layers(len(order))} ({freed[-1]} bytes) in host memory "
                f"(expert_offload) the rest still does not fit")
    if fewest > n:
        return (f"; or expert_offload='auto' (or {fewest}) keeps the routed experts of {_layers(fewest)} "
                f"({freed[fewest]} bytes) in host memory, read over the bus")
    return ""
