"""Sweep the HC_PRE / HC_POST launch layout (workgroup size, chunks per invocation) on a device and
print GPU time and GB/s against a copy of the same bytes. Results decide ops.hc.SLICE_TUNING.

    . .vkdev/enter.sh; python3 tools/hc_tune.py --d 4096,7168 --t 4096 --out $OUT/hc_tune.json
"""
import argparse
import itertools
import json
import os
import sys

import numpy as np


from dsv4_vk.hc import cases as C
from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import bench_path
from dsv4_vk.hc import kernels as hc_ops
from dsv4_vk.vk import default_device, memory


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", default="4096,7168")
    ap.add_argument("--t", default="4096")
    ap.add_argument("--wg", default="64,128,256,512,1024")
    ap.add_argument("--cpt", default="1,2,4")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--ops", default="HC_PRE,HC_POST", help="ops in the order measured")
    ap.add_argument("--repeat", type=int, default=1, help="graph repetitions per command buffer")
    ap.add_argument("--dedicated-mib", type=int, help="dedicated allocations for buffers from this size")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.dedicated_mib is not None:
        memory.DEDICATED_FROM = a.dedicated_mib << 20
    dev = default_device()
    rng = np.random.default_rng(0)
    rows = []
    copy_1g = F.copy_gbps(dev)
    print(f"{dev.name}: copy 1 GiB x4 {copy_1g:.0f} GB/s")
    for D, T in itertools.product(map(int, a.d.split(",")), map(int, a.t.split(","))):
        for op in a.ops.split(","):
            case = C.Case(op, T, D)
            nbytes = C.io_bytes(case) // 2 // 16 * 16
            copy_same = F.copy_gbps(dev, nbytes, copies=a.repeat)
            inputs = C.make_inputs(case, rng)
            for wg, cpt in itertools.product(map(int, a.wg.split(",")), map(int, a.cpt.split(","))):
                hc_ops.SLICE_TUNING.update(wg=wg, cpt=cpt)
                r = bench_path(dev, case, "fused", inputs, a.replays, a.repeat)
                row = {"op": op, "T": T, "D": D, "wg": wg, "cpt": cpt, "gpu_us": r["gpu_us"], "gbps": r["gbps"],
                       "pct_copy_same_bytes": 100 * r["gbps"] / copy_same, "pct_copy_1g": 100 * r["gbps"] / copy_1g,
                       "copy_same_bytes_gbps": copy_same}
                rows.append(row)
                print(f"{op:8s} T={T} D={D} wg={wg:5d} cpt={cpt}  {r['gpu_us']:8.1f} µs {r['gbps']:8.0f} GB/s "
                      f"{row['pct_copy_same_bytes']:6.1f}% of copy({nbytes >> 20} MiB)={copy_same:.0f}  "
                      f"{row['pct_copy_1g']:6.1f}% of copy(1 GiB)")
            dev.pool.trim()
    hc_ops.SLICE_TUNING.update(wg=None, cpt=1)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": dev.name, "copy_1g_gbps": copy_1g, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
