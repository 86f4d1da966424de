#!/usr/bin/env python3
"""Decode soak: many steps of a small model loop through every library path, watching host memory
and device allocations. It fails (exit 1) when either grows after the warm-up.

Each step: two HcSites (pre on the device streams, the user's layer — an RMS_NORM program of its own
— and post carrying the next mixes), the head collapse from the carry, one
hc_comb on numpy arrays (the numpy API), and one replay of a compiled program of a full site
(bound weights, X copied in and out). Every --every steps it samples the process RSS
(/proc/self/statm), the device's allocations and bytes (`Device.memory_stats`) and the number of
live Python objects.

    python3 tools/soak_library.py [--steps 10000] [--d 4096] [--every 1000] [--json out.json]
"""
import argparse
import gc
import json
import sys
import time

import numpy as np

import dsv4_vk as dv


def rss_bytes():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100, help="steps before the baseline sample")
    ap.add_argument("--slack-mib", type=float, default=8.0, help="allowed RSS growth after the warm-up")
    ap.add_argument("--json", help="write the samples to this file")
    args = ap.parse_args(argv)
    if min(args.steps, args.d, args.every) < 1 or not 0 <= args.warmup < args.steps:
        ap.error("--steps, --d and --every must be ≥ 1 and 0 ≤ --warmup < --steps")
    D = args.d
    rng = np.random.default_rng(0)

    def w(*shape, scale=1.0):
        return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)

    samples = []
    with dv.Device() as dev:
        X = dev.tensor(w(1, 4, D))
        sites = [dv.HcSite(w(24, 4 * D, scale=2 / np.sqrt(4 * D)), w(3, scale=0.5), w(24, scale=0.25), device=dev)
                 for _ in range(2)]
        head = dv.HcSite.head(w(4, 4 * D, scale=1 / np.sqrt(4 * D)), w(1, scale=0.5), w(4, scale=0.25), device=dev)
        g = dv.Graph()
        xin = g.input("X", (1, 4, D))
        u, post, comb = sites[0].pre_graph(g, xin)
        g.output("X_new", sites[0].post_graph(g, g.op("RMS_NORM", u, eps=1e-6), xin, post, comb))
        prog = g.compile(dev)
        lg = dv.Graph()
        lg.output("f", lg.op("RMS_NORM", lg.input("u", (1, D)), eps=1e-6))
        layer = lg.compile(dev)                                  # the user's own layer: bounded output
        mixes, scale, base = w(1, 24, scale=2.0), w(3, scale=0.5), w(24, scale=0.25)
        print(f"device: {dev.name}; D = {D}; {args.steps} steps")
        print(f"{'step':>6s} {'rss MiB':>8s} {'allocs':>6s} {'alloc MiB':>9s} {'pool bufs':>9s} {'cached':>6s} "
              f"{'objects':>8s} {'ms/step':>8s}")
        t0 = time.perf_counter()
        for step in range(1, args.steps + 1):
            carry = None
            for k, site in enumerate(sites):        # each post carries the next site's (the head's) mixes
                u, post, comb = site.pre(X, carry=carry)
                f = dev.empty((1, D))
                layer.replay(u=u, out={"f": f})
                X, carry = site.post(f, X, post, comb, next=sites[k + 1] if k + 1 < len(sites) else head)
            h = head.collapse(X, carry=carry)
            dv.hc_comb(mixes, scale, base, device=dev)
            prog.replay(X=X, out={"X_new": X})
            if step == args.warmup or step % args.every == 0 or step == args.steps:
                gc.collect()
                m = dev.memory_stats()
                s = {"step": step, "rss_bytes": rss_bytes(), "allocations": m["allocations"],
                     "allocated_bytes": m["allocated_bytes"], "pool_buffers": m["pool_buffers"],
                     "cached_programs": m["cached_programs"], "objects": len(gc.get_objects()),
                     "ms_per_step": (time.perf_counter() - t0) * 1e3 / step}
                samples.append(s)
                print(f"{step:6d} {s['rss_bytes'] / 2**20:8.1f} {s['allocations']:6d} "
                      f"{s['allocated_bytes'] / 2**20:9.1f} {s['pool_buffers']:9d} {s['cached_programs']:6d} "
                      f"{s['objects']:8d} {s['ms_per_step']:8.2f}", flush=True)
        finite = bool(np.isfinite(h.numpy()).all() and np.isfinite(X.numpy()).all())
    base, last = samples[0], samples[-1]
    growth = max(s["rss_bytes"] for s in samples) - base["rss_bytes"]
    flat = (growth <= args.slack_mib * 2**20 and all(s["allocations"] == base["allocations"] for s in samples)
            and all(s["allocated_bytes"] == base["allocated_bytes"] for s in samples)
            and last["objects"] - base["objects"] < 1000)
    print(f"after step {base['step']}: RSS grew at most {growth / 2**20:.2f} MiB; device allocations "
          f"{'unchanged' if flat else 'CHANGED'}; results finite: {finite}; {'FLAT' if flat else 'GREW'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": dev.name, "D": D, "steps": args.steps, "rss_growth_bytes": growth, "flat": flat,
                       "finite": finite, "samples": samples}, fh, indent=1)
    return 0 if flat and finite else 1


if __name__ == "__main__":
    sys.exit(main())
