"""Copy bandwidth against buffer size, memory type and allocation kind on the current device:
finds sizes where the memory system is slow (page size, placement). Fresh buffers per size.

    . .vkdev/enter.sh; python3 tools/mem_probe.py --out $OUT/mem_probe.json
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


from dsv4_vk.ops.base import grid_1d
from dsv4_vk.vk import Buffer, Recorder, default_device, memory, pack_push


def copy_rate(dev, src, dst, nbytes, copies=1, replays=10, groups=None):
    """groups: a fixed grid of that many workgroups looping over the data; -1: one vec4 per
    invocation on a flat x grid past 65535 (where the device allows it); None: the folded grid."""
    n4 = nbytes // 16
    defines = {"OP_COPY": 1, **({"GRID_STRIDE": 1} if groups and groups > 0 else {})}
    pipe = dev.pipelines.get("floor", 2, defines, (256,))
    if groups == -1:
        grid = (-(-n4 // 256), 1, 1)
    else:
        grid = (groups, 1, 1) if groups else grid_1d(n4, 256)
    rec = Recorder(dev, timestamps="ends")
    for _ in range(copies):
        rec.dispatch(pipe, [src, dst], pack_push(n4), grid, [(src, 0, nbytes)], [(dst, 0, nbytes)])
    r = rec.finish()
    r.submit()
    rates, walls = [], []
    for _ in range(replays):
        t0 = time.perf_counter()
        r.submit()
        walls.append(time.perf_counter() - t0)
        ts = r.timestamps_ns()
        rates.append(2 * nbytes * copies / (ts[-1] - ts[0]))
    r.destroy()
    copy_rate.wall_gbps = 2 * nbytes * copies / statistics.median(walls) / 1e9   # submit + wait included
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="64,128,160,256,280,384,512,768,1024")
    ap.add_argument("--copies", default="1", help="copies per command buffer, e.g. 1,4")
    ap.add_argument("--groups", default="0", help="fixed grid sizes to try, e.g. 0,2112 (0: one vec4 per invocation)")
    ap.add_argument("--block-mib", type=int, help="one kept memory block of this size for every buffer")
    ap.add_argument("--fill", default="ones", help="source contents: any of zeros,ones,arange,random")
    ap.add_argument("--types", default="", help="device-local memory type indices to compare, e.g. 1,4 "
                    "(default: the runtime's choice)")
    ap.add_argument("--dedicated", default="0,1", help="allocation kinds: 0 sub-allocated, 1 dedicated")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep (the state of memory drifts)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.block_mib:
        memory.BLOCK_BYTES, memory.KEEP_BLOCKS = a.block_mib << 20, True
    dev = default_device()
    print("memory types:", [(i, hex(t["flags"]), t["heap"]) for i, t in enumerate(dev.caps.memory_types)])
    rows = []
    find = dev._find_memory
    types = [int(t) for t in a.types.split(",") if t] or [None]
    for rnd, mib, mtype in [(r, m, t) for r in range(a.rounds) for m in map(int, a.mib.split(",")) for t in types]:
        # a forced type must still be device-local and allowed for the buffer
        dev._find_memory = (find if mtype is None else
                            lambda flags, bits=0xFFFFFFFF, required=True, t=mtype:
                            t if (bits >> t) & 1 and (dev.caps.memory_types[t]["flags"] & flags) == flags
                            else find(flags, bits, required))
        nbytes = mib << 20
        fills = {"zeros": lambda n: np.zeros(n, np.float32), "ones": lambda n: np.ones(n, np.float32),
                 "arange": lambda n: np.arange(n, dtype=np.float32),
                 "random": lambda n: np.random.default_rng(0).standard_normal(n, dtype=np.float32)}
        for fill, dedicated, copies, groups in [(f, d, c, g) for f in a.fill.split(",")
                                                for d in (bool(int(x)) for x in a.dedicated.split(","))
                                                for c in map(int, a.copies.split(","))
                                                for g in map(int, a.groups.split(","))]:
            src, dst = Buffer(dev, nbytes, dedicated=dedicated), Buffer(dev, nbytes, dedicated=dedicated)
            src.write(fills[fill](nbytes // 4))
            rate = [copy_rate(dev, src, dst, nbytes, copies, groups=groups or None) for _ in range(2)]
            if not np.array_equal(dst.read(), src.read()):
                raise RuntimeError("copy produced wrong data")
            rows.append({"t": time.time(), "wall_gbps": copy_rate.wall_gbps, "round": rnd, "mib": mib, "fill": fill, "dedicated": dedicated, "copies": copies, "groups": groups,
                         "gbps": rate,
                         "memory_type": src.memory_type})
            print(f"round {rnd} {mib:6d} MiB fill={fill:6s} dedicated={dedicated!s:5s} copies={copies} groups={groups} "
                  f"type={src.memory_type}: "
                  + "  ".join(f"{x:7.0f}" for x in rate) + f" GB/s (wall {copy_rate.wall_gbps:5.0f}) "
                  + time.strftime("%H:%M:%S"), flush=True)
            src.destroy()
            dst.destroy()
    if a.out:
        json.dump({"device": dev.name, "rows": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
