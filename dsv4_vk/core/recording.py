"""Recording: a lowered graph into one command buffer, each dispatch bound to its storages' buffers
with the ranges it reads and writes (the recorder puts barriers where a dispatch reads or writes
what an earlier one wrote)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .lowering import dispatch_detail, lower_graph
from .tensor import itemsize
from ..vk import Recorder
from ..vk.memory import GUARD
from ..vk.tensor import data_bytes

if TYPE_CHECKING:
    from ..vk import Buffer, Device
    from ..vk.recorder import Recording
    from .graph import Graph, Node
    from .opdef import Launch


def record_launch(rec: Recorder, buffers: dict[int, Buffer], node: Node, launch: Launch) -> None:
    """One dispatch: its pipeline, its arguments bound past their buffers' leading guards (so that
    offsets in push constants are storage-relative; the range is the storage's own, never the pooled
    buffer's rounded size) and the byte ranges it reads and writes."""
    pipe = rec.device.pipelines.get(launch.shader, len(launch.args), launch.defines, launch.spec,
                                    launch.subgroup_size, launch.full_subgroups)
    bufs: list = []
    reads: list = []
    writes: list = []
    for i, t in enumerate(launch.args):
        buf = buffers[id(t.storage)]
        bufs.append((buf, GUARD * 4, max(4, data_bytes(t.storage.numel, t.dtype))))
        lo, hi = t.extent()
        sz = itemsize(t.dtype)
        rng = (buf, GUARD * 4 + lo * sz, GUARD * 4 + -(-hi * sz // 4) * 4)
        (writes if i in launch.writes else reads).append(rng)
    rec.dispatch(pipe, bufs, launch.push, launch.grid, reads, writes, label=launch.label or node.tag or node.op.name)


def record_graph(device: Device, graph: Graph, buffers: dict[int, Buffer], timestamps: bool = False,
                 repeat: int = 1) -> tuple[Recording, list[str]]:
    """The finished recording of `graph` (its nodes `repeat` times back to back) and what each
    dispatch ran (dispatch_detail); the recorder's resources go back if any step fails."""
    launches = lower_graph(graph, device, repeat)
    rec = Recorder(device, timestamps=timestamps)
    try:
        for node, launch in launches:
            record_launch(rec, buffers, node, launch)
        return rec.finish(), [dispatch_detail(launch) for _, launch in launches]
    except BaseException:
        rec.discard()       # its command pool, buffer and query pools
        raise
