"""dsv4_vk: a Vulkan compute backend for DeepSeek-V4 inference, with fused hyper-connection ops."""
from . import ops  # noqa: F401  (registers the op declarations)
from .executor import CompiledGraph, Executor, RunStats
from .graph import Graph
from .tensor import Tensor

__all__ = ["CompiledGraph", "Executor", "Graph", "RunStats", "Tensor"]
