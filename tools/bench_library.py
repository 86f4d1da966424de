#!/usr/bin/env python3
"""Host time per call of each library path at decode size (T = 1, D = 4096 by default):

- numpy API: hc_comb / hc_pre / hc_post / hc_site_pre on numpy arrays (upload, submit, wait, read);
- device-tensor API: the same functions on dsv4_vk.Tensors (results stay on the device);
- HcSite: site.pre / site.post with the weights resident; post(next=) also computing the next site's
  mixes (HC_POST_MIX), and the next site's pre(carry=) starting from them;
- program: a compiled graph of one full site (pre → post, f = u), and of N sites chained (each post
  carrying the next site's mixes).

Columns (µs; per figure the lowest of --rounds medians over --calls calls each, after --warmup
calls): "call", the whole call; "in s+w", the time the call spent inside Device.submit +
Device.wait (vkQueueSubmit and the fence wait, timed in the call with perf_counter only);
"overhead" = call − in s+w, what the library costs on the host beyond submit + wait; "after w",
the part of it after the last wait returned (reading results back, handing out the outputs: where
a host whose caches went cold while it waited pays); "stubbed",
the call with Device.submit and Device.wait replaced by no-ops (the library's host work with warm
caches: the driver's submit and wait, and on a CPU device the kernels, evict the interpreter's
caches between real calls); "bare", the same submission (same command buffers) issued alone, for
reference. Submits per call are counted, not assumed; "recs": copy sets the program recorded
during all those calls (0 when every call found its device-tensor copies already recorded).

    python3 tools/bench_library.py [--d 4096] [--t 1] [--calls 300] [--sites 4] [--spin-us 0,2000] [--json out.json]

"spin": the fence polling of Device.wait in µs (DSV4_VK_SPIN_US); with --spin-us each row is
measured at each setting in turn, in one process.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import dsv4_vk as dv
from dsv4_vk.hc import api as hc_api


class SubmitClock:
    """Accumulates the time spent inside dev.submit and dev.wait (instance attributes shadow them).
    Only perf_counter_ns (a vDSO read) inside: a thread CPU-time clock is a system call on some
    hosts, and the part of the wrapper outside its window would be billed as library overhead."""

    def __init__(self, dev):
        self.device = dev
        self.ns = self.submits = self.wait_end = 0
        self.stubbed = False
        for name in ("submit", "wait"):
            setattr(dev, name, self._timed(getattr(dev, name), name == "submit"))

    def _timed(self, fn, is_submit):
        clock = time.perf_counter_ns

        def timed(*a, **kw):
            if self.stubbed:
                return None
            self.submits += is_submit
            t0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                t1 = clock()
                self.ns += t1 - t0
                if not is_submit:
                    self.wait_end = t1
        return timed


ROUNDS = [7]   # each figure is the lowest of the per-round medians: the round least disturbed by other load


def _median_us(fn, calls, warmup, clock):
    for _ in range(warmup):
        fn()
    best, now = None, time.perf_counter_ns
    for _ in range(ROUNDS[0]):
        ts, inside, after = [], [], []
        for _ in range(calls):
            clock.ns = clock.wait_end = 0
            t0 = now()
            fn()
            t1 = now()
            ts.append(t1 - t0)
            inside.append(clock.ns)
            after.append(t1 - clock.wait_end if clock.wait_end else 0)
        over = [t - i for t, i in zip(ts, inside)]
        med = tuple(statistics.median(v) / 1e3 for v in (ts, inside, over, after))
        best = med if best is None else tuple(min(a, b) for a, b in zip(best, med))
    return best


SPIN_US = [None]      # fence polling settings compared row by row (--spin-us); None: the device's default


def measure(name, op, call, program, calls, warmup, clock):
    """measure_one for each --spin-us setting, in turn, in this process (variants compared side by side)."""
    dev, rows = clock.device, []
    default = dev.spin_ns
    try:
        for spin in SPIN_US:
            dev.spin_ns = default if spin is None else 1000 * spin
            rows.append(measure_one(name, op, call, program, calls, warmup, clock))
            rows[-1]["spin_us"] = dev.spin_ns // 1000
    finally:
        dev.spin_ns = default
    return rows


def measure_one(name, op, call, program, calls, warmup, clock):
    """Time `call` (and its time inside submit + wait), then the bare submission it made on `program()`."""
    call()
    before = program().copy_recordings
    host, inside, over, after = _median_us(call, calls, warmup, clock)
    cg = program()
    clock.submits = 0
    call()
    submits = clock.submits           # every vkQueueSubmit: staging copies (discrete GPUs) count too
    info = cg.last_submit_info
    dev, fence = cg.device, cg.recording.fence_arr

    def bare():
        dev.submit(info, fence)
        dev.wait(fence)
    base = _median_us(bare, calls, warmup, clock)[0]
    clock.stubbed = True
    try:
        stub = _median_us(call, calls, warmup, clock)[0]
    finally:
        clock.stubbed = False
    recorded = program().copy_recordings - before     # over the timed, bare and stubbed calls
    row = {"path": name, "op": op, "call_us": round(host, 1), "in_submit_wait_us": round(inside, 1),
           "overhead_us": round(over, 1), "after_wait_us": round(after, 1), "stubbed_us": round(stub, 1),
           "bare_submit_wait_us": round(base, 1), "submits_per_call": submits,
           "copy_recordings": recorded}
    cols = " ".join(f"{v:9.1f}" for v in (host, inside, over, after, stub, base))
    print(f"{name:14s} {op:20s} {clock.device.spin_ns // 1000:5d} {cols} {submits:4d} {recorded:5d}", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--t", type=int, default=1)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=ROUNDS[0], help="rounds of --calls calls per figure (lowest median)")
    ap.add_argument("--sites", type=int, default=4, help="sites chained in the N-site program")
    ap.add_argument("--spin-us", default="", help="comma-separated DSV4_VK_SPIN_US settings to compare row by row "
                    "(default: the device's own)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)
    try:
        SPIN_US[:] = [int(v) for v in args.spin_us.split(",")] if args.spin_us else [None]
    except ValueError:
        ap.error(f"--spin-us: expected integers such as 0,2000, got {args.spin_us!r}")
    if any(v is not None and v < 0 for v in SPIN_US):
        ap.error("--spin-us values must be ≥ 0")
    if args.d < 1 or args.t < 1 or args.calls < 1 or args.warmup < 0 or args.sites < 1 or args.rounds < 1:
        ap.error("--d, --t, --calls, --rounds and --sites must be ≥ 1, --warmup ≥ 0")
    ROUNDS[0] = args.rounds
    T, D = args.t, args.d
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (T, 4, D)).astype(np.float32)
    fn = (rng.uniform(-1, 1, (24, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32)
    scale = rng.uniform(-0.5, 0.5, 3).astype(np.float32)
    base = rng.uniform(-0.25, 0.25, 24).astype(np.float32)
    mixes = rng.uniform(-2, 2, (T, 24)).astype(np.float32)
    w = rng.uniform(0, 1, (T, 4)).astype(np.float32)
    f = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    post = rng.uniform(0, 2, (T, 4)).astype(np.float32)
    comb = rng.uniform(0, 1, (T, 4, 4)).astype(np.float32)

    rows = []
    with dv.Device() as dev:
        print(f"device: {dev.name} ({dev.caps.type}); T = {T}, D = {D}; lowest of {ROUNDS[0]} medians of "
              f"{args.calls} calls, µs")
        heads = " ".join(f"{h:>9s}" for h in ("call", "in s+w", "overhead", "after w", "stubbed", "bare"))
        print(f"{'path':14s} {'op':20s} {'spin':>5s} {heads} {'subm':>4s} {'recs':>5s}")
        last = lambda: hc_api._local.last()        # the program the last API call ran (a weak reference)  # noqa: E731
        n, c = dict(calls=args.calls, warmup=args.warmup, clock=SubmitClock(dev)), dict(device=dev)
        rows.extend(measure("numpy", "hc_comb", lambda: dv.hc_comb(mixes, scale, base, **c), last, **n))
        rows.extend(measure("numpy", "hc_pre", lambda: dv.hc_pre(X, w, **c), last, **n))
        rows.extend(measure("numpy", "hc_post", lambda: dv.hc_post(f, X, post, comb, **c), last, **n))
        rows.extend(measure("numpy", "hc_site_pre", lambda: dv.hc_site_pre(X, fn, scale, base, **c), last, **n))

        t = {k: dev.tensor(v) for k, v in dict(X=X, fn=fn, scale=scale, base=base, mixes=mixes, w=w, f=f,
                                                 post=post, comb=comb).items()}
        rows.extend(measure("device-tensor", "hc_comb", lambda: dv.hc_comb(t["mixes"], t["scale"], t["base"]),
                            last, **n))
        rows.extend(measure("device-tensor", "hc_pre", lambda: dv.hc_pre(t["X"], t["w"]), last, **n))
        rows.extend(measure("device-tensor", "hc_post", lambda: dv.hc_post(t["f"], t["X"], t["post"], t["comb"]),
                            last, **n))
        rows.extend(measure("device-tensor", "hc_site_pre",
                            lambda: dv.hc_site_pre(t["X"], t["fn"], t["scale"], t["base"]), last, **n))

        site = dv.HcSite(t["fn"], t["scale"], t["base"], device=dev)
        site2 = dv.HcSite(t["fn"], t["scale"], t["base"], device=dev)
        rows.extend(measure("HcSite", "pre", lambda: site.pre(t["X"]), last, **n))
        u, p, cb = site.pre(t["X"])
        rows.extend(measure("HcSite", "post", lambda: site.post(u, t["X"], p, cb), last, **n))
        rows.extend(measure("HcSite", "post(next=)", lambda: site.post(u, t["X"], p, cb, next=site2), last, **n))
        X_new, carry = site.post(u, t["X"], p, cb, next=site2)
        rows.extend(measure("HcSite", "pre(carry=)", lambda: site2.pre(X_new, carry=carry), last, **n))

        for n_sites in sorted({1, args.sites}):
            sites = [site] + [dv.HcSite(t["fn"], t["scale"], t["base"], device=dev) for _ in range(n_sites - 1)]
            g = dv.Graph()
            x = xin = g.input("X", (T, 4, D))
            mix = None
            for k, s in enumerate(sites):         # each post carries the next site's mixes (the last: none)
                uu, pp, cc = s.pre_graph(g, x, mix=mix)
                if k + 1 < n_sites:
                    x, mix = s.post_graph(g, uu, x, pp, cc, next=sites[k + 1])
                else:
                    x = s.post_graph(g, uu, x, pp, cc)
            g.output("X_new", x)
            prog = g.compile(dev)
            x_next = dev.empty((T, 4, D))
            assert xin.shape == x_next.shape
            rows.extend(measure("program", f"{n_sites} full site(s)",
                                lambda: prog.replay(X=t["X"], out={"X_new": x_next}), lambda: prog, **n))
        info = {"device": dev.name, "type": dev.caps.type, "T": T, "D": D, "calls": args.calls,
                "warmup": args.warmup, "rounds": ROUNDS[0], "version": dv.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(info, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
