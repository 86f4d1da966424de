#!/usr/bin/env python3
"""What the recorder's barrier costs by its scope: the dependent-dispatch chain of `dsv4_vk floor` and a
chain of decode sites (tools/site_chain_bench.py) recorded with the recorder's barrier as it is
(compute and transfer stages, shader and transfer accesses) and with a compute-only one (compute
shader stage, shader write -> shader read/write), in one process. A compute-only barrier is
enough between two dispatches; between a transfer and a dispatch it is not (the recorder's copies).

    . .vkdev/enter.sh; python3 tools/barrier_bench.py [--d 4096] [--sites 16] [--warm-ms 500]
"""
import argparse
import statistics

import numpy as np

import dsv4_vk as dv
from dsv4_vk.cli import floor
from dsv4_vk.core.executor import CompiledGraph
from dsv4_vk.vk import recorder
from dsv4_vk.vk.binding import ffi, lib, vk
from site_chain_bench import chain, us_per_site

FULL = recorder.Recorder.barrier


def compute_only(self):
    bar = ffi.new("VkMemoryBarrier*")
    bar.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
    bar.srcAccessMask = vk.VK_ACCESS_SHADER_WRITE_BIT
    bar.dstAccessMask = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
    stage = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
    lib.vkCmdPipelineBarrier(self.cmd, stage, stage, 0, 1, bar, 0, ffi.NULL, 0, ffi.NULL)
    self._writes.clear()
    self._reads.clear()
    self.n_barriers += 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--sites", type=int, default=16)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--warm-ms", type=float, default=500.0)
    a = ap.parse_args(argv)
    with dv.Device() as dev, floor.ClockWarmer(dev, a.warm_ms) as warm:
        print(f"device: {dev.name}")
        X = np.random.default_rng(1).uniform(-1, 1, (1, 4, a.d)).astype(np.float32)
        outs = {}
        for name, fn in [("full", FULL), ("compute-only", compute_only)] * 2:
            recorder.Recorder.barrier = fn
            try:
                step = floor.dispatch_chain_us(dev, warm=warm)
                g, keep = chain(dev, 1, a.d, a.sites, np.random.default_rng(0))
                prog = CompiledGraph(dev, g, timestamps="ends")
                got = prog.run(X=X)
                outs.setdefault(name, got)
                warm()
                per = us_per_site(prog, X, a.sites, a.replays)
                n_bar = prog.recording.n_barriers
                prog.release()
            finally:
                recorder.Recorder.barrier = FULL
            print(f"{name:13s} dependent dispatch {step:.3f} µs; chain of {a.sites} sites D={a.d}: "
                  f"{statistics.median(per):.2f} µs per site (min {min(per):.2f}), {n_bar} barriers", flush=True)
        same = all(np.array_equal(outs["full"][k], outs["compute-only"][k]) for k in outs["full"])
        print(f"outputs bit-identical: {same}")


if __name__ == "__main__":
    main()
