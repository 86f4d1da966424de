#!/usr/bin/env python3
"""GPU time of a chain of whole hyper-connection sites at decode, as a model's decode step runs them
(each post carrying the next site's mixes, the head collapse last; f = u as the sublayer): per D,
dispatches, barriers and GPU µs per site (the chain's total over its sites; timestamps before and
after the whole chain only), median of --replays after a clock warm-up.
(results/h200/history/issue10/handoff/ has this tool's runs at 0e48b56, which also timed each chain
with HC_SITE waiting in its shader for the HC_POST_MIX before it instead of a barrier.)

    . .vkdev/enter.sh; python3 tools/site_chain_bench.py [--d 4096,7168] [--t 1] [--sites 16] [--replays 200]
                                                          [--warm-ms 500] [--json FILE]
"""
import argparse
import json
import statistics

import numpy as np

import dsv4_vk as dv
from dsv4_vk.cli.floor import ClockWarmer
from dsv4_vk.core.executor import CompiledGraph


def chain(dev, T, D, n_sites, rng, n_iter=20):
    """(graph, the HcSites it uses): n_sites sites chained as a model's decode step runs them and the
    head collapse (outputs "h" and the last streams "X"; input "X"), weights random in the cases'
    ranges. (tools/profile_site.py times the same chain dispatch by dispatch.)"""
    sites = [dv.HcSite((rng.uniform(-1, 1, (24, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32),
                       rng.uniform(-0.5, 0.5, 3), rng.uniform(-0.25, 0.25, 24), n_iter=n_iter, device=dev)
             for _ in range(n_sites)]
    head = dv.HcSite.head((rng.uniform(-1, 1, (4, 4 * D)) / np.sqrt(4 * D)).astype(np.float32),
                          rng.uniform(-0.5, 0.5, 1), rng.uniform(-0.25, 0.25, 4), device=dev)
    g = dv.Graph()
    x, mix = g.input("X", (T, 4, D)), None
    for k, s in enumerate(sites):
        u, post, comb = s.pre_graph(g, x, mix=mix)
        x, mix = s.post_graph(g, u, x, post, comb, next=sites[k + 1] if k + 1 < n_sites else head)
    g.output("h", head.collapse_graph(g, x, mix=mix))
    g.output("X", x)
    return g, (sites, head)


def us_per_site(prog, X, n_sites, replays):
    """GPU µs per site of each of `replays` replays of `prog` (recorded with timestamps="ends")."""
    per = []
    for _ in range(replays):
        prog.replay(X=X)
        per.append(prog.recording.total_gpu_ns() / 1e3 / n_sites)
    return per


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", default="4096,7168")
    ap.add_argument("--t", type=int, default=1)
    ap.add_argument("--sites", type=int, default=16)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--warm-ms", type=float, default=500.0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = []
    with dv.Device() as dev, ClockWarmer(dev, a.warm_ms) as warm:
        print(f"device: {dev.name}; T = {a.t}; {a.sites} sites + head per chain")
        for D in [int(d) for d in a.d.split(",")]:
            X = np.random.default_rng(1).uniform(-1, 1, (a.t, 4, D)).astype(np.float32)
            g, keep = chain(dev, a.t, D, a.sites, np.random.default_rng(0))
            prog = CompiledGraph(dev, g, timestamps="ends")
            got = prog.run(X=X)
            finite = all(np.isfinite(v).all() for v in got.values())
            warm()
            per = us_per_site(prog, X, a.sites, a.replays)
            st = prog.run_stats()
            row = {"D": D, "T": a.t, "sites": a.sites, "dispatches": st.dispatches, "barriers": st.barriers,
                   "us_per_site": statistics.median(per), "us_min": min(per), "finite": finite}
            rows.append(row)
            print(f"D={D}: {st.dispatches} dispatches, {st.barriers} barriers: {row['us_per_site']:.2f} µs per "
                  f"site (min {row['us_min']:.2f}); outputs finite: {finite}", flush=True)
            prog.release()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
