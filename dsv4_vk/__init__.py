"""dsv4_vk: a Vulkan compute backend for DeepSeek-V4 inference, with fused hyper-connection ops."""
from . import ops  # noqa: F401  (registers the op declarations)
from .executor import CompiledGraph, Executor, RunStats
from .graph import Graph
from .tensor import Tensor
from . import hc, hc_policy  # noqa: F401  (graph functions and kernel policy of the HC ops)
from .api import hc_comb, hc_post, hc_pre, hc_site_pre, last_run

__all__ = ["CompiledGraph", "Executor", "Graph", "RunStats", "Tensor"]
__all__ += ["hc", "hc_policy", "hc_comb", "hc_pre", "hc_post", "hc_site_pre", "last_run"]
