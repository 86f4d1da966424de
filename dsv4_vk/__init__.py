"""dsv4_vk: a Vulkan compute backend for DeepSeek-V4 inference, with fused hyper-connection ops.

`Tensor` is an array on a device (`Device().tensor(array)`); `GraphTensor` is a symbolic view
inside a `Graph` (see docs/library.md).

Layers, bottom-up: `vk` (the only code importing `vulkan`) → `core` (tensors, graph, executor,
profiling) → `ops` (primitive and model op families) → `hc` (the hyper-connection ops) → `model`
→ `cli`.
"""
from importlib.metadata import PackageNotFoundError, version as _version

from . import ops  # noqa: F401  (registers the primitive ops)
from . import hc  # noqa: F401  (registers the fused HC ops)
from .core import CompiledGraph, Executor, Graph, GraphTensor, RunStats, Submission
from .hc import HCUnsupported, HcHead, HcSite, MixCarry, hc_comb, hc_post, hc_pre, hc_site_pre, last_run
from .vk import (Device, DeviceClosed, ShaderCompileError, Tensor, ValidationError, VulkanError, VulkanUnavailable,
                 default_device)

try:
    __version__ = _version("dsv4_vk")
except PackageNotFoundError:     # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["CompiledGraph", "Device", "DeviceClosed", "Executor", "Graph", "GraphTensor", "HCUnsupported", "HcHead",
           "HcSite", "MixCarry", "RunStats", "ShaderCompileError", "Submission", "Tensor", "ValidationError", "VulkanError",
           "VulkanUnavailable", "__version__", "default_device", "hc", "hc_comb", "hc_post", "hc_pre", "hc_site_pre",
           "last_run"]
