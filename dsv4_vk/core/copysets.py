"""The copy-set cache of a compiled graph: the small command buffers that copy device-tensor inputs
in and outputs out around the recording, recorded once per set of buffers and offsets (a key) and
submitted with the recording in the same vkQueueSubmit on every later run with that key."""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from ..vk.recorder import record_copies

if TYPE_CHECKING:
    from ..vk.recorder import Recording

IO_CACHE = 4        # per compiled graph: recorded copy sets kept (least recently used dropped)


class CopySets:
    def __init__(self) -> None:
        self._sets: collections.OrderedDict[tuple, Any] = collections.OrderedDict()   # key -> ((info, keepalive), cmds)
        self.recorded = 0           # copy sets recorded so far (a new key each: benchmarks watch it)

    def get(self, key: tuple) -> Any:
        """The VkSubmitInfo recorded for `key`, or None."""
        hit = self._sets.get(key)
        if hit is None:
            return None
        self._sets.move_to_end(key)
        return hit[0][0]

    def record(self, recording: Recording, key: tuple, copies_in: list, copies_out: list) -> Any:
        """The VkSubmitInfo of [copies in, the recording, copies out] for a new `key`; past IO_CACHE
        sets the least recently used one's command buffers are reused (none is in flight: a run
        waits for the previous one before it submits)."""
        self.recorded += 1
        if len(self._sets) >= IO_CACHE:
            _, (_, cmds) = self._sets.popitem(last=False)
        else:
            cmds = [recording.allocate_command_buffer(), recording.allocate_command_buffer()]
        chain = []
        if copies_in:
            record_copies(cmds[0], copies_in)
            chain.append(cmds[0])
        chain.append(recording.cmd)
        if copies_out:
            record_copies(cmds[1], copies_out)
            chain.append(cmds[1])
        info, arr = recording.device.submit_info(chain)
        self._sets[key] = ((info, arr), cmds)
        return info

    def clear(self) -> None:
        self._sets = collections.OrderedDict()
