"""Sweep HC kernel launch layouts on a device and print GPU time and GB/s against a copy of the same
bytes. Knobs are entries of the tuning tables: slice.* = hc.kernels.SLICE_TUNING (HC_PRE, HC_POST,
HC_SITE: workgroup size, chunks per invocation), mix.* = hc.mix_kernels.MIX_TUNING (HC_MIX kernels:
workgroup size, D splits, KSPLIT split, lpt, tb, tpl, kernel), site.* = hc.plan.SITE_TUNING (HC_POST_MIX
and HC_SITE workgroups at decode), carry.prefill / carry.kernel / carry.tb / carry.lpt / carry.tpl = hc.plan.PREFILL_CARRY (0/1/auto:
HC_SITE past 8 tokens with the post carrying the next mixes never, wherever it can, or where the next
mixes do not run on TCR; ksplit/tc: the kernel of that carry; KSPLIT's layout for it on GPUs).
Every combination of the given values is timed (median of --replays, after a clock warm-up).
--per-dispatch adds, per row, each dispatch's own GPU time (a second recording with a timestamp
after every dispatch, which serialises them: the parts, not the whole).

    . .vkdev/enter.sh; python3 tools/hc_tune.py --d 4096,7168 --t 4096 --out $OUT/hc_tune.json
    python3 tools/hc_tune.py --ops HC_MIX --t 512,4096 --d 4096 --set mix.split=0,16 --set mix.lpt=1,2,4
    python3 tools/hc_tune.py --ops HC_MIX,HC_SITE --t 512,4096 --d 4096 --set mix.split=16 --set mix.tpl=1,2
    python3 tools/hc_tune.py --ops HC_SITE --t 1 --d 4096 --set site.post_wg=32,64,128 --set slice.wg=64,256
    python3 tools/hc_tune.py --ops HC_SITE --t 512,4096 --d 4096 --site-path three-op --set carry.prefill=auto,0,1 --per-dispatch
"""
import argparse
import itertools
import json

import numpy as np

from dsv4_vk.hc import cases as C
from dsv4_vk.hc import kernels as hc_ops, mix_kernels, plan as hc_plan
from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import bench_path, dispatch_times
from dsv4_vk.core.tuning import tuned
from dsv4_vk.vk import default_device, memory

TABLES = {"slice": hc_ops.SLICE_TUNING, "mix": mix_kernels.MIX_TUNING, "site": hc_plan.SITE_TUNING,
          "carry": hc_plan.PREFILL_CARRY}
PATH = {"HC_SITE": C.SITE}


def knob(text):
    name, _, values = text.partition("=")
    table, _, key = name.partition(".")
    if table not in TABLES or key not in TABLES[table] or not values:
        raise argparse.ArgumentTypeError(f"expected TABLE.KEY=v1,v2 with TABLE.KEY one of "
                                         f"{[f'{t}.{k}' for t, d in TABLES.items() for k in d]}, got {text!r}")
    # numbers, 'auto' (None), or names (e.g. mix.kernel=tc,ksplit)
    return table, key, [None if v == "auto" else int(v) if v.lstrip("-").isdigit() else v for v in values.split(",")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", default="4096,7168")
    ap.add_argument("--t", default="4096")
    ap.add_argument("--wg", default="64,128,256,512,1024", help="= --set slice.wg=...")
    ap.add_argument("--cpt", default="1,2,4", help="= --set slice.cpt=...")
    ap.add_argument("--set", type=knob, action="append", default=[], metavar="TABLE.KEY=V1,V2",
                    help="values of one knob ('auto': the built-in rule); replaces --wg/--cpt when given")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--ops", default="HC_PRE,HC_POST", help="ops in the order measured")
    ap.add_argument("--repeat", type=int, default=1, help="graph repetitions per command buffer")
    ap.add_argument("--warm-ms", type=float, default=300.0, help="clock warm-up before each timing")
    ap.add_argument("--dedicated-mib", type=int, help="dedicated allocations for buffers from this size")
    ap.add_argument("--per-dispatch", action="store_true", help="also time each dispatch of a row on its own")
    ap.add_argument("--site-path", choices=("site", "three-op"), default="site",
                    help="HC_SITE's path: the site kernels (default) or the three fused ops")
    ap.add_argument("--out")
    a = ap.parse_args()
    PATH["HC_SITE"] = C.SITE if a.site_path == "site" else C.THREE_OP
    if a.dedicated_mib is not None:
        memory.DEDICATED_FROM = a.dedicated_mib << 20
    knobs = a.set or [("slice", "wg", [int(v) for v in a.wg.split(",")]),
                      ("slice", "cpt", [int(v) for v in a.cpt.split(",")])]
    dev = default_device()
    rows = []
    with F.ClockWarmer(dev, a.warm_ms) as warm:
        copy_1g = F.copy_gbps(dev, warm=warm)
        print(f"{dev.name}: copy {F.default_copy_bytes(dev) >> 20} MiB x4 {copy_1g:.0f} GB/s")
        for D, T in itertools.product(map(int, a.d.split(",")), map(int, a.t.split(","))):
            for op in a.ops.split(","):
                case = C.Case(op, T, D)
                nbytes = C.io_bytes(case) // 2 // 16 * 16
                copy_same = F.copy_gbps(dev, nbytes, copies=a.repeat, warm=warm)
                made = {}                   # input shapes → inputs: drawn again only where a setting changes them
                for values in itertools.product(*(v for _, _, v in knobs)):
                    setting = {f"{t}.{k}": v for (t, k, _), v in zip(knobs, values)}
                    try:
                        with tuned(setting):
                            # shaped under the setting (a carry's partials have the splits its kernel makes);
                            # the same seed for every setting
                            shapes = tuple(sorted((k, tuple(v)) for k, v in C.input_shapes(case).items()))
                            if shapes not in made:
                                made = {shapes: C.make_inputs(case, np.random.default_rng(0))}
                            inputs = made[shapes]
                            r = bench_path(dev, case, PATH.get(op, "fused"), inputs, a.replays, a.repeat, warm)
                            parts = dispatch_times(dev, case, PATH.get(op, "fused"), inputs, a.replays, warm) \
                                if a.per_dispatch else None
                    except Exception as e:          # a layout the device refuses: report, go on
                        print(f"{op:8s} T={T} D={D} {setting}: {type(e).__name__}: {e}")
                        continue
                    row = {"op": op, "T": T, "D": D, **setting, "gpu_us": r["gpu_us"], "gbps": r["gbps"],
                           "dispatches": r["dispatches"], "pct_copy_same_bytes": 100 * r["gbps"] / copy_same,
                           "pct_copy_1g": 100 * r["gbps"] / copy_1g, "copy_same_bytes_gbps": copy_same}
                    if op == "HC_SITE":
                        row["floor_ratio"] = r["gpu_us"] / (C.floor_bytes(case) / (copy_1g * 1e3))
                    if parts is not None:
                        row["per_dispatch_us"] = parts
                    rows.append(row)
                    extra = f" {row['floor_ratio']:.2f}× floor" if "floor_ratio" in row else ""
                    if parts is not None:
                        extra += " (" + ", ".join(f"{lab} {us:.1f}" for lab, us in parts) + " µs)"
                    print(f"{op:8s} T={T} D={D} {' '.join(f'{k}={v}' for k, v in setting.items())}  "
                          f"{r['gpu_us']:8.1f} µs {r['gbps']:8.0f} GB/s {row['pct_copy_1g']:6.1f}% of copy(1 GiB) "
                          f"{r['dispatches']} disp{extra}", flush=True)
                dev.pool.trim()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": dev.name, "copy_1g_gbps": copy_1g, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
