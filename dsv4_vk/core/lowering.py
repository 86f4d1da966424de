"""Lowering: a graph's nodes to kernel launches (`OpDef.lower`), under the tuning the graph was built with."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .tuning import tuned

if TYPE_CHECKING:
    from ..vk import Device
    from .graph import Graph, Node
    from .opdef import Launch


def lower_graph(graph: Graph, device: Device, repeat: int = 1) -> list[tuple[Node, Launch]]:
    """(node, launch) of every dispatch of `graph` on `device`, the nodes `repeat` times in order."""
    with tuned(graph.tuning):
        return [(node, launch) for _ in range(repeat) for node in graph.nodes
                for launch in node.op.lower(node, device)]


def dispatch_detail(launch: Launch) -> str:
    """What a dispatch ran, for per-dispatch profiles: shader, defines, grid and argument shapes
    (outputs marked with '>'), e.g. 'mul_mat LANES=32 W_BF16 grid 512 | [1,4096] [1024,4096]bf16 >[1,1024]'."""
    defs = " ".join(k if v == 1 and k != "LANES" else f"{k}={v}" for k, v in launch.defines.items())
    args = " ".join(f"{'>' if i in launch.writes else ''}[{','.join(map(str, t.shape))}]"
                    f"{'' if t.dtype == 'f32' else t.dtype}" for i, t in enumerate(launch.args))
    grid = "x".join(str(g) for g in launch.grid if g != 1) or "1"
    return f"{launch.shader} {defs} grid {grid} | {args}".replace("  ", " ")
