"""`python -m dsv4_vk bench`: speed of every bench case (dsv4_vk/hc/cases.py) along every path, read
against the device floor (dsv4_vk/cli/floor.py), which is measured and printed first.

Per case and path: GPU time (median over ≥ 10 replays of the recorded command buffer after a
warm-up, between a timestamp before and one after the whole graph), host submit+wait time,
dispatches and barriers, host µs to record the graph (a fresh compile once pipelines and pooled
buffers are warm: lowering + recording), effective GB/s (every input and output tensor read or
written once, over the GPU time) and tokens/s. Sections: decode (T = 1) and prefill (T = 512 … 4096).
Summary: per D, the decode ratio unfused/fused of HC_COMB + HC_PRE + HC_POST together (target
≥ 40×) and, at the largest prefill T, HC_PRE / HC_POST GB/s as % of the copy bandwidth (target
≥ 85% at T = 4096, D = 4096).

    python -m dsv4_vk bench [--d 4096,7168] [--t 512,1024,2048,4096] [--tmax 1024] [--quick]
                            [--json out.json] [--plot out.png]
    python -m dsv4_vk bench --plot-from out.json --plot out.png      (no device needed)
"""
import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

from ..hc import cases as C
from . import floor as F
from . import apply_device, error_line, parser

HC3 = ("HC_COMB", "HC_PRE", "HC_POST")
TARGET_DECODE_RATIO = 40.0
TARGET_COPY_PCT = 85.0
TARGET_SITE_DECODE_US, TARGET_SITE_DISPATCHES = 8.0, 2     # a whole site at decode, D = 4096
TARGET_SITE_FLOOR_RATIO = 1.3                              # a whole site at prefill over its floor
TARGET_MIX_COPY_PCT = 80.0                                 # HC_MIX alone at T ≥ 512
TARGET_DEVICE = "H200"                # the targets are the H200's: on other devices they are shown, not judged
MIN_REPLAYS = 10


def _int_list(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _largest_tensor_bytes(case):
    return 4 * max(math.prod(s) for s in list(C.input_shapes(case).values()) + list(C.output_shapes(case).values()))


def record_us(device, graph):
    """Host µs to lower and record `graph` with pipelines and pooled buffers warm (best of 2)."""
    from ..core.executor import CompiledGraph
    CompiledGraph(device, graph).release()      # leaves its buffers in the pool
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter_ns()
        cg = CompiledGraph(device, graph)
        best = min(best, (time.perf_counter_ns() - t0) / 1e3)
        cg.release()
    return best


def graph_barriers(device, graph):
    """Barriers of one recording of `graph` (a repeated recording adds some between repetitions)."""
    from ..core.executor import CompiledGraph
    cg = CompiledGraph(device, graph)
    try:
        return cg.recording.n_barriers
    finally:
        cg.release()


def timed_replays(device, graph, inputs, replays, warm, timestamps, repeat=1):
    """The recording of `graph` with `inputs` set, submitted once (shader JIT, first touch of the
    buffers), then after warm() handed to the caller `replays` times to submit and time; released
    at the end."""
    from ..core.executor import CompiledGraph
    cg = CompiledGraph(device, graph, timestamps=timestamps, repeat=repeat)
    try:
        for name, array in inputs.items():
            cg.set_input(name, array)
        rec = cg.recording
        rec.submit()
        if warm is not None:
            warm()
        for _ in range(replays):
            yield rec
    finally:
        cg.release()


def median_gpu_us(device, graph, inputs, replays, warm=None, repeat=4) -> float:
    """Median GPU µs of one run of `graph` over `replays` replays of a recording that runs it
    `repeat` times back to back (timestamps before and after only), after warm() (the kernel
    benches of tools/)."""
    times = []
    for rec in timed_replays(device, graph, inputs, replays, warm, "ends", repeat):
        rec.submit()
        times.append(rec.total_gpu_ns() / 1e3 / repeat)
    return statistics.median(times)


def bench_path(device, case, path, inputs, replays, repeat=1, warm=None):
    """One row: timings of `case` along `path`; with repeat > 1 the graph is recorded that many
    times back to back in one command buffer and the GPU time is per repetition. warm: called
    right before the timed replays (floor.ClockWarmer: the GPU's clock up from idle)."""
    graph = C.build(case, path, device)
    gpu, wall = [], []
    # timestamps only before and after the graph: per-dispatch ones would serialise the work timed
    for rec in timed_replays(device, graph, inputs, replays, warm, "ends", repeat):
        t0 = time.perf_counter_ns()
        rec.submit()
        wall.append((time.perf_counter_ns() - t0) / 1e3)
        gpu.append(rec.total_gpu_ns() / 1e3 / repeat)
    # a repeated recording adds barriers between repetitions: count one recording's own
    dispatches = rec.n_dispatches // repeat
    barriers = rec.n_barriers if repeat == 1 else graph_barriers(device, graph)
    gpu_us = statistics.median(gpu)
    return {"gpu_us": gpu_us, "wall_us": statistics.median(wall), "dispatches": dispatches, "barriers": barriers,
            "record_us": record_us(device, graph), "gbps": C.io_bytes(case) / (gpu_us * 1e3),
            "tokens_per_s": case.T / (gpu_us * 1e-6)}


def dispatch_times(device, case, path, inputs, replays, warm=None):
    """[(label, median GPU µs)] per dispatch of `case` along `path`, a timestamp after each (which
    serialises them: the parts of a row, not its whole)."""
    runs = []
    for rec in timed_replays(device, C.build(case, path, device), inputs, replays, warm, True):
        rec.submit()
        runs.append(rec.timings())
    return [(lab, float(statistics.median(r[i] for r in runs)) / 1e3) for i, lab in enumerate(rec.labels)]


def run(device, cases, replays, rng, on_row=None, repeat=1, warm_ms=0):
    """Rows for every (section, case) × path; a case too large for the device is skipped, an error
    in one path is reported in its row and does not stop the others. on_row(row) as each finishes.
    warm_ms: GPU clock warm-up before each row's timed replays (floor.ClockWarmer)."""
    with F.ClockWarmer(device, warm_ms) as warm:
        return _run(device, cases, replays, rng, on_row, repeat, warm)


def _run(device, cases, replays, rng, on_row, repeat, warm):
    limit = device.caps.limits.max_storage_buffer_range
    paths = {op: C.paths(device, op) for op in {c.op for _, c in cases}}
    rows = []
    for section, case in cases:
        need = _largest_tensor_bytes(case) + 512
        inputs = C.make_inputs(case, rng) if need <= limit else None
        for path in paths[case.op]:
            row = {"section": section, "op": case.op, "T": case.T, "D": case.D, "path": path,
                   "bytes": C.io_bytes(case), "error": None}
            if inputs is None:
                row["error"] = f"skipped: a tensor of {need / 2**20:.0f} MiB exceeds maxStorageBufferRange"
            else:
                try:
                    row.update(bench_path(device, case, path, inputs, replays, repeat, warm))
                except Exception as e:      # report it in the row, keep benchmarking the rest
                    row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            if on_row:
                on_row(row)
        device.pool.trim()              # sizes change from case to case: do not hoard free buffers
    return rows


def _fused_best(rows, op, T, D):
    got = [r for r in rows if r["op"] == op and r["T"] == T and r["D"] == D and r["path"] != C.UNFUSED
           and not r["error"]]
    return min(got, key=lambda r: r["gpu_us"]) if got else None


def _unfused(rows, op, T, D):
    return next((r for r in rows if r["op"] == op and r["T"] == T and r["D"] == D and r["path"] == C.UNFUSED
                 and not r["error"]), None)


def summarize(rows, floor):
    """Decode ratio per D (HC_COMB + HC_PRE + HC_POST, unfused over best fused) and prefill
    HC_PRE / HC_POST GB/s as % of the measured copy bandwidth at the largest prefill T."""
    out = {"decode_ratio": {}, "prefill_copy_pct": {}, "targets": {"decode_ratio": TARGET_DECODE_RATIO,
                                                                  "copy_pct": TARGET_COPY_PCT}}
    dec = [r for r in rows if r["section"] == "decode"]
    for D in sorted({r["D"] for r in dec if r["D"]}):
        fused = [_fused_best(dec, op, 1, 0 if op == "HC_COMB" else D) for op in HC3]
        unf = [_unfused(dec, op, 1, 0 if op == "HC_COMB" else D) for op in HC3]
        # the three ops in one graph (HC_STEP) when benchmarked: one GPU timeline, as in a model;
        # otherwise the sum of the three timed alone (each pays its own start-up)
        step_f, step_u = _fused_best(dec, "HC_STEP", 1, D), _unfused(dec, "HC_STEP", 1, D)
        if step_f and step_u:
            fused, unf, how = [step_f], [step_u], "HC_STEP (one graph)"
        else:
            how = "sum of HC_COMB, HC_PRE, HC_POST timed alone"
        if all(fused) and all(unf):
            out["decode_ratio"][str(D)] = {
                "unfused_us": sum(r["gpu_us"] for r in unf), "fused_us": sum(r["gpu_us"] for r in fused),
                "ratio": sum(r["gpu_us"] for r in unf) / sum(r["gpu_us"] for r in fused),
                "fused_paths": [r["path"] for r in fused], "measured_as": how}
    out["site"] = _site_summary(rows, floor)
    pre = [r for r in rows if r["section"] == "prefill" and not r["error"]]
    if pre and floor:
        tmax = max(r["T"] for r in pre)
        for op in ("HC_PRE", "HC_POST"):
            for D in sorted({r["D"] for r in pre if r["op"] == op}):
                best = _fused_best(pre, op, tmax, D)
                if best:
                    out["prefill_copy_pct"][f"{op} T={tmax} D={D}"] = {
                        "op": op, "T": tmax, "D": D, "gbps": best["gbps"],
                        "pct_of_copy": 100 * best["gbps"] / floor["copy_gbps"]}
    return out


def _site_summary(rows, floor):
    """The whole site (HC_SITE, best fused path) per D: at decode its GPU µs and dispatches, at each
    prefill T its GPU time over its floor (cases.floor_bytes at the copy bandwidth); HC_MIX's copy %."""
    out = {"decode": {}, "prefill": {}, "mix": {}}
    for r in rows:
        if r["error"] or r["path"] == C.UNFUSED or r["op"] not in ("HC_SITE", "HC_MIX"):
            continue
        case = C.Case(r["op"], r["T"], r["D"])
        key = f"T={r['T']} D={r['D']}"
        if r["op"] == "HC_MIX":
            if r["section"] == "prefill" and floor:
                best = out["mix"].get(key)
                pct = 100 * r["gbps"] / floor["copy_gbps"]
                if best is None or pct > best["pct_of_copy"]:
                    out["mix"][key] = {"T": r["T"], "D": r["D"], "path": r["path"], "gbps": r["gbps"], "pct_of_copy": pct}
            continue
        sec = out[r["section"]]
        if key in sec and sec[key]["gpu_us"] <= r["gpu_us"]:
            continue
        sec[key] = {"T": r["T"], "D": r["D"], "path": r["path"], "gpu_us": r["gpu_us"], "dispatches": r["dispatches"]}
        if floor:
            floor_us = C.floor_bytes(case) / (floor["copy_gbps"] * 1e3)
            sec[key].update(floor_us=floor_us, floor_ratio=r["gpu_us"] / floor_us)
    return out


def format_row(r, floor):
    head = f"{r['section']:8s} {r['op']:12s} {r['T']:6d} {r['D'] or '-':>6} {r['path']:12s}"
    if r["error"]:
        return f"{head} {r['error']}"
    vs = ""
    if floor:
        # decode and HC_COMB (compute, not bandwidth) read against one dependent dispatch,
        # the bandwidth-bound prefill rows against the copy kernel
        vs = (f"{r['gpu_us'] / floor['dispatch_barrier_us']:8.1f}×dispatch"
              if r["section"] == "decode" or r["op"] == "HC_COMB"
              else f"{100 * r['gbps'] / floor['copy_gbps']:8.1f}%copy")
    return (f"{head} {r['gpu_us']:11.1f} {r['wall_us']:10.1f} {r['dispatches']:6d} {r['barriers']:6d} "
            f"{r['record_us']:10.1f} {r['gbps']:9.2f} {r['tokens_per_s']:12.0f} {vs}")


HEADER = (f"{'section':8s} {'op':12s} {'T':>6s} {'D':>6s} {'path':12s} {'GPU µs':>11s} {'wall µs':>10s} "
          f"{'disp':>6s} {'barr':>6s} {'record µs':>10s} {'GB/s':>9s} {'tokens/s':>12s} vs floor")


def format_report(doc):
    floor = doc.get("floor")
    lines = [f"# bench on {doc['device']} ({doc['device_type']}), subgroup size {doc['subgroup_size']}, "
             f"{doc['replays']} replays (median), clock warm-up {doc.get('warm_ms', 0):g} ms"]
    if floor:
        lines += ["## floor"] + ["  " + ln for ln in F.format_floor(floor).splitlines()]
    for section in ("decode", "prefill"):
        rows = [r for r in doc["rows"] if r["section"] == section]
        if rows:
            lines += [f"## {section}", HEADER] + [format_row(r, floor) for r in rows]
    return "\n".join(lines + [format_summary(doc["summary"], doc["device"])])


def failed_rows(rows):
    """Rows whose path raised (not those skipped for the device's buffer range)."""
    return [r for r in rows if r.get("error") and not r["error"].startswith("skipped:")]


def format_summary(s, device_name=TARGET_DEVICE):
    """The summary lines; each target says met / NOT met on the device the targets are for (an H200),
    elsewhere only what it is."""
    judged = TARGET_DEVICE in device_name
    lines = ["## summary"] + ([] if judged else [f"(the targets are an {TARGET_DEVICE}'s: not judged on {device_name})"])

    def verdict(ok):
        return ("met" if ok else "NOT met") if judged else "not judged here"

    for D, v in s["decode_ratio"].items():
        ok = verdict(v["ratio"] >= TARGET_DECODE_RATIO)
        lines.append(f"decode D={D}: HC_COMB+HC_PRE+HC_POST unfused {v['unfused_us']:.1f} µs / fused "
                     f"{v['fused_us']:.1f} µs = {v['ratio']:.1f}× (target ≥ {TARGET_DECODE_RATIO:.0f}×: {ok}; "
                     f"{v.get('measured_as', '')})")
    for k, v in s["prefill_copy_pct"].items():
        ok = verdict(v["pct_of_copy"] >= TARGET_COPY_PCT)
        target = f"target ≥ {TARGET_COPY_PCT:.0f}% at T=4096, D=4096: {ok}" if (v["T"], v["D"]) == (4096, 4096) \
            else "target applies at T=4096, D=4096"
        lines.append(f"prefill {k}: {v['gbps']:.2f} GB/s = {v['pct_of_copy']:.1f}% of copy bandwidth ({target})")
    site = s.get("site", {})
    for k, v in site.get("decode", {}).items():
        ok = v["gpu_us"] <= TARGET_SITE_DECODE_US and v["dispatches"] <= TARGET_SITE_DISPATCHES
        lines.append(f"decode HC_SITE {k} ({v['path']}): {v['gpu_us']:.1f} µs GPU, {v['dispatches']} dispatches "
                     f"(target ≤ {TARGET_SITE_DECODE_US:g} µs and ≤ {TARGET_SITE_DISPATCHES} at D=4096: "
                     f"{verdict(ok)})")
    for k, v in site.get("prefill", {}).items():
        if "floor_ratio" in v:
            ok = v["floor_ratio"] <= TARGET_SITE_FLOOR_RATIO
            lines.append(f"prefill HC_SITE {k} ({v['path']}): {v['gpu_us']:.1f} µs GPU = {v['floor_ratio']:.2f}× its "
                         f"floor {v['floor_us']:.1f} µs (target ≤ {TARGET_SITE_FLOOR_RATIO}× at T=4096, D=4096: "
                         f"{verdict(ok)})")
    for k, v in site.get("mix", {}).items():
        ok = v["pct_of_copy"] >= TARGET_MIX_COPY_PCT
        lines.append(f"prefill HC_MIX {k}: {v['gbps']:.1f} GB/s = {v['pct_of_copy']:.1f}% of copy bandwidth "
                     f"(target ≥ {TARGET_MIX_COPY_PCT:g}% at T ≥ 512: {verdict(ok)})")
    if not s["decode_ratio"] and not s["prefill_copy_pct"] and not any(site.values()):
        lines.append("(nothing to summarise: sections or paths missing)")
    return "\n".join(lines)


# --- plot ----------------------------------------------------------------------------------------

def plot(doc, png):
    """PNG of fused and unfused GPU time across T, one panel per op (a line per path and D)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib, which is not installed: `pip install matplotlib` "
                           "(or `pip install -e '.[plot]'`), or save --json here and run "
                           "`python -m dsv4_vk bench --plot-from results.json --plot out.png` where it is") from None
    rows = [r for r in doc["rows"] if not r.get("error")]
    ops = [op for op in C.OPS if any(r["op"] == op for r in rows)]
    if not ops:
        raise RuntimeError("no timed rows to plot")
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        mine = [r for r in rows if r["op"] == op]
        ds = sorted({r["D"] for r in mine})
        fused_paths = sorted({r["path"] for r in mine} - {C.UNFUSED})
        for path, D in sorted({(r["path"], r["D"]) for r in mine}):
            pts = sorted((r["T"], r["gpu_us"]) for r in mine if (r["path"], r["D"]) == (path, D))
            # colour = D, line = fused (solid, one marker per variant) or unfused (dashed)
            marker = "s" if path == C.UNFUSED else "o^vD"[fused_paths.index(path) % 4]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=f"C{ds.index(D)}",
                    linestyle="--" if path == C.UNFUSED else "-", label=path + (f" D={D}" if D else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("tokens T")
        ax.set_ylabel("GPU µs")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{doc['device']}: fused vs unfused")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# --- CLI ------------------------------------------------------------------------------------------

def main(argv=None):
    ap = parser("bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=_int_list, default=[4096, 7168], help="hidden sizes D (default 4096,7168)")
    ap.add_argument("--t", type=_int_list, default=list(C.PREFILL_TS), help="prefill T values (default 512..4096)")
    ap.add_argument("--tmax", type=int, help="drop prefill T above this (slow unfused chains on CPU devices)")
    ap.add_argument("--quick", action="store_true", help="smallest prefill T only, shorter floor measurement")
    ap.add_argument("--op", type=C.parse_ops, help="only these ops, e.g. HC_PRE,HC_POST")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode section")
    ap.add_argument("--no-prefill", action="store_true", help="skip the prefill section")
    ap.add_argument("--copy-mib", type=float, help="bytes the floor's copy moves, MiB (default: 1024 on GPUs, "
                    "16 on CPU devices)")
    ap.add_argument("--replays", type=int, default=MIN_REPLAYS, help=f"timed replays per row (≥ {MIN_REPLAYS})")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    ap.add_argument("--warm-ms", type=float, help="keep the GPU busy this long before each timing so its clock "
                    "is up from idle (default 500 on GPUs, 0 on CPU devices; 0 disables)")
    ap.add_argument("--repeat", type=int, default=1, help="record each graph this many times back to back in "
                    "one command buffer and report GPU time per repetition (like the floor's copy, which "
                    "times 4 back-to-back copies)")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="write the results as JSON to PATH (stdout, instead of the table, without PATH)")
    ap.add_argument("--plot", metavar="PNG", help="plot GPU time across T (needs matplotlib)")
    ap.add_argument("--plot-from", metavar="JSON", help="render --plot from a saved --json file; no benchmark")
    args = ap.parse_args(argv)
    apply_device(args)

    if args.plot_from:
        if not args.plot:
            ap.error("--plot-from needs --plot OUT.png")
        try:
            with open(args.plot_from) as fh:
                doc = json.load(fh)
            print(format_report(doc))
            plot(doc, args.plot)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            print(f"error: {error_line(e)}", file=sys.stderr)
            return 2
        print(f"wrote {args.plot}")
        return 0
    if args.replays < MIN_REPLAYS:
        ap.error(f"--replays must be ≥ {MIN_REPLAYS}")
    if args.warm_ms is not None and not args.warm_ms >= 0:
        ap.error(f"--warm-ms must be ≥ 0, got {args.warm_ms}")
    if args.seed < 0:
        ap.error(f"--seed must be ≥ 0, got {args.seed}")
    if args.copy_mib is not None and not 0 < args.copy_mib < float("inf"):
        ap.error(f"--copy-mib must be a number > 0, got {args.copy_mib}")
    if args.plot:                       # fail before benchmarking, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib (`pip install matplotlib`); or save --json and use --plot-from "
                  "where matplotlib is installed", file=sys.stderr)
            return 2

    from ..vk import default_device
    device = default_device()
    ts = sorted(set(args.t))
    if args.quick:
        ts = ts[:1]
    if args.tmax is not None:
        ts = [t for t in ts if t <= args.tmax]
    ops = args.op or list(C.OPS)
    cases = [(s, c) for s, c in C.bench_cases(args.d, ts, ops)
             if not (s == "decode" and args.no_decode) and not (s == "prefill" and args.no_prefill)]
    to_stdout = args.json != "-"
    say = print if to_stdout else (lambda *a, **k: None)
    copy_bytes = None if args.copy_mib is None else int(args.copy_mib * 2**20) // 16 * 16
    warm_ms = F.default_warm_ms(device) if args.warm_ms is None else args.warm_ms
    fl = F.measure(device, chain=64 if args.quick else 256, copy_bytes=copy_bytes, replays=args.replays,
                   warm_ms=warm_ms)
    say(f"# bench on {device.name} ({device.caps.type}), subgroup size {device.subgroup_size}, "
        f"clock warm-up {warm_ms:g} ms before each timing")
    say("## floor\n" + "\n".join("  " + ln for ln in F.format_floor(fl).splitlines()))
    section = [None]

    def show(row):
        if row["section"] != section[0]:
            section[0] = row["section"]
            say(f"## {row['section']}\n{HEADER}")
        say(format_row(row, fl), flush=True)

    rows = run(device, cases, args.replays, np.random.default_rng(args.seed), on_row=show, repeat=args.repeat,
               warm_ms=warm_ms)
    doc = {"device": device.name, "device_type": device.caps.type, "subgroup_size": device.subgroup_size,
           "replays": args.replays, "repeat": args.repeat, "warm_ms": warm_ms, "floor": fl, "rows": rows, "summary": summarize(rows, fl)}
    say(format_summary(doc["summary"], device.name))
    if args.json:
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
    if args.plot:
        plot(doc, args.plot)
        say(f"wrote {args.plot}")
    failed = failed_rows(rows)
    if failed:
        first = failed[0]
        print(f"error: {len(failed)} of {len(rows)} rows failed; the first: {first['section']} {first['op']} "
              f"T={first['T']} D={first['D']} {first['path']}: {first['error']}", file=sys.stderr)
        return 1
    return 0

