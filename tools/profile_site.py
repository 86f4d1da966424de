#!/usr/bin/env python3
"""GPU time per kernel of whole hyper-connection sites at decode: a program of --sites sites
chained as a model's decode step runs them (each post carrying the next site's mixes, the head
collapse last; f = u as the sublayer), run --runs times under the profiler, which puts a timestamp
after every dispatch. Per label: dispatches per run and GPU µs per dispatch (timestamps between
dispatches serialise them: the figures say which kernel costs what, the bench says the total).

    python3 tools/profile_site.py [--d 4096] [--t 1] [--sites 4] [--runs 200] [--warm-ms 500] [--n-iter 20]
                                  [--post-wg 64]
"""
import argparse
import time

import numpy as np

import dsv4_vk as dv
from dsv4_vk.core import profile
from dsv4_vk.hc import composite
from site_chain_bench import chain


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--t", type=int, default=1)
    ap.add_argument("--sites", type=int, default=4)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--n-iter", type=int, default=20, help="Sinkhorn iterations (1: its cost out of the figures)")
    ap.add_argument("--post-wg", type=int, help="HC_POST_MIX workgroup size (hc.composite.SITE_TUNING)")
    ap.add_argument("--warm-ms", type=float, default=500.0, help="replays before profiling (GPU clocks up)")
    args = ap.parse_args(argv)
    if args.post_wg is not None:
        composite.SITE_TUNING["post_wg"] = args.post_wg
    if min(args.d, args.t, args.sites, args.runs) < 1 or args.warm_ms < 0:
        ap.error("--d, --t, --sites and --runs must be ≥ 1, --warm-ms ≥ 0")
    T, D, rng = args.t, args.d, np.random.default_rng(0)
    with dv.Device() as dev:
        g, _ = chain(dev, T, D, args.sites, rng, n_iter=args.n_iter)
        prog = g.compile(dev)
        X = dev.tensor(rng.uniform(-1, 1, (T, 4, D)).astype(np.float32))
        end = time.perf_counter() + args.warm_ms / 1e3
        while time.perf_counter() < end:
            prog.replay(X=X)
        with profile.profile() as prof:
            profiled = g.compile(dev, timestamps=True)     # a timestamp after every dispatch
            for _ in range(args.runs):
                profiled.replay(X=X)
        print(f"device: {dev.name}; T = {T}, D = {D}; {args.sites} site(s) + head; n_iter {args.n_iter}; "
              f"post_wg {composite.SITE_TUNING['post_wg']}; {args.runs} runs; "
              f"paths {sorted(set(p[1] for p in g.paths))}")
        print(prof.table())


if __name__ == "__main__":
    main()
