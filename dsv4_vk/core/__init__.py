"""The runtime above the Vulkan layer: graph tensors, the graph builder, the executor that lowers a
graph to one recorded command buffer and replays it, op declarations, and profiling."""
from .executor import CompiledGraph, Executor, RunStats, Submission
from .graph import Graph
from .opdef import Launch, OpDef, get_op, register
from .tensor import GraphTensor

__all__ = ["CompiledGraph", "Executor", "Graph", "GraphTensor", "Launch", "OpDef", "RunStats", "Submission",
           "get_op", "register"]
