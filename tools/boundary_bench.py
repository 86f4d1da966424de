"""The layer boundary in one dispatch (HC_POST_SITE) against two (HC_POST_MIX, then HC_SITE), at decode.

Times, at T tokens and hidden size D (fp32, GPU timestamps, median of the replays, after a clock warm-up):
- `one`: a single boundary per submit (site k's post and site k+1's pre side), and `rep`: that graph
  recorded `--repeat` times back to back in one command buffer (per boundary);
- `chain`: L sites in one graph (identity sublayers, each post carrying the next site's pre or
  partials, the first site's pre from X), per site: what a model's decode step pays per site.
Each with BOUNDARY on (one dispatch) and off (HC_POST_MIX + HC_SITE), and BOUNDARY's workgroup sizes.

    . .vkdev/enter.sh; python3 tools/boundary_bench.py [--t 1] [--d 4096] [--wg 64,128,256] [--json F]
"""
import argparse
import json
import statistics

import numpy as np

from dsv4_vk import hc
from dsv4_vk.cli.bench import timed_replays
from dsv4_vk.cli.floor import ClockWarmer
from dsv4_vk.core.graph import Graph
from dsv4_vk.hc import composite as H
from dsv4_vk.vk import default_device


def weights(rng, T, D):
    a = {"f": rng.uniform(-1, 1, (T, D)), "X": rng.uniform(-1, 1, (T, 4, D)), "post": rng.uniform(0, 2, (T, 4)),
         "comb": rng.uniform(0, 1, (T, 4, 4)), "fn": rng.uniform(-1, 1, (24, 4 * D)) * 2 / np.sqrt(4 * D),
         "scale": rng.uniform(-.5, .5, 3), "base": rng.uniform(-.25, .25, 24)}
    return {k: v.astype(np.float32) for k, v in a.items()}


def boundary_graph(T, D):
    """One boundary: X_new and the next site's pre side (u, coefs or partials → HC_SITE)."""
    g = Graph()
    t = {k: g.input(k, s) for k, s in (("f", (T, D)), ("X", (T, 4, D)), ("post", (T, 4)), ("comb", (T, 4, 4)),
                                        ("fn", (24, 4 * D)), ("scale", (3,)), ("base", (24,)))}
    X_new, carry = hc.site_post(g, t["f"], t["X"], t["post"], t["comb"], next_fn=t["fn"], next_scale=t["scale"],
                                next_base=t["base"])
    u, post, comb = hc.site_pre(g, X_new, t["fn"], t["scale"], t["base"], mix=carry)
    for k, v in (("X_new", X_new), ("u", u), ("post_next", post), ("comb_next", comb)):
        g.output(k, v)
    return g


def chain_graph(T, D, L):
    g = Graph()
    t = {k: g.input(k, s) for k, s in (("X", (T, 4, D)), ("fn", (24, 4 * D)), ("scale", (3,)), ("base", (24,)))}
    X, carry = t["X"], None
    for _ in range(L):
        X, carry = hc.site(g, X, t["fn"], t["scale"], t["base"], lambda u: u, mix=carry, next_fn=t["fn"],
                           next_scale=t["scale"], next_base=t["base"])
    g.output("X", X)
    return g


def time_graph(dev, g, inputs, replays, warm, repeat=1):
    times, n = [], 0
    for rec in timed_replays(dev, g, inputs, replays, warm, "ends", repeat):
        rec.submit()
        times.append(rec.total_gpu_ns() / 1e3 / repeat)
        n = rec.n_dispatches // repeat
    return statistics.median(times), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=1)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--wg", default="64,128,256")
    ap.add_argument("--chain", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=16)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--warm-ms", type=float, default=500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = default_device()
    rng = np.random.default_rng(0)
    w = weights(rng, a.t, a.d)
    chain_in = {k: w[k] for k in ("X", "fn", "scale", "base")}
    variants = [("two-dispatch", False, None)] + [(f"boundary wg {wg}", True, int(wg)) for wg in a.wg.split(",")]
    rows = []
    saved = dict(H.BOUNDARY)
    with ClockWarmer(dev, a.warm_ms) as warm:
        for rnd in range(a.rounds):             # A/B/A/B: the variants interleaved, twice
            for name, on, wg in variants:
                H.BOUNDARY.update(on=on, wg=wg or saved["wg"])
                g1 = boundary_graph(a.t, a.d)
                one, n1 = time_graph(dev, g1, w, a.replays, warm)
                rep, _ = time_graph(dev, g1, w, a.replays, warm, a.repeat)
                chain, nc = time_graph(dev, chain_graph(a.t, a.d, a.chain), chain_in, a.replays, warm)
                row = {"round": rnd, "variant": name, "T": a.t, "D": a.d, "one_us": one, "dispatches": n1,
                       f"rep{a.repeat}_us": rep, "chain_sites": a.chain, "chain_us_per_site": chain / a.chain,
                       "chain_dispatches": nc}
                rows.append(row)
                print(f"{name:18s} T={a.t} D={a.d}  one {one:6.2f} µs ({n1} disp)  rep{a.repeat} {rep:6.2f} µs  "
                      f"chain of {a.chain}: {chain / a.chain:6.2f} µs/site ({nc} disp)", flush=True)
    H.BOUNDARY.update(saved)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev.name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
