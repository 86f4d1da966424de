"""`python -m dsv4_vk eval`: every case of dsv4_vk/cases.py along every path this device runs
(each fused variant and the unfused chain), on the same fresh random inputs, against each other
and against the float64 numpy reference. One line per case and path; exit status 1 on any FAIL.

PASS needs: NMSE vs the unfused chain ≤ 1e-7 (fused paths), NMSE vs the float64 reference ≤ 1e-7,
max-abs error vs the reference ≤ MAX_ABS[op] · max(1, max|reference|), no NaN/inf placed
differently, guard regions around every tensor intact. T = 0 passes when the op either returns
empty outputs of the right shape or refuses with a ValueError that names the argument.
"""
import argparse
import json
import re
import sys
import time

import numpy as np

from ..hc import cases as C
from ..core.executor import CompiledGraph
from ..hc.metrics import max_abs, nmse, nonfinite_mismatch
from ..vk import default_device
from . import apply_device, parser

NMSE_MAX = 1e-7
MAX_ABS = {"HC_COMB": 2e-6, "HC_PRE": 1e-6, "HC_POST": 1e-6, "HC_STEP": 2e-6, "HC_SITE_PRE": 4e-6}   # × max(1, max|ref|)


class Progress:
    """A one-line progress bar on stderr (only where asked for: a tty or --progress)."""

    def __init__(self, total, enabled):
        self.total, self.enabled, self.done, self.t0 = total, enabled, 0, time.monotonic()

    def step(self, label):
        self.done += 1
        if self.enabled:
            n = 30 * self.done // max(1, self.total)
            sys.stderr.write(f"\r[{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total} "
                             f"{time.monotonic() - self.t0:5.0f}s {label[:48]:48s}")
            sys.stderr.flush()

    def clear(self):
        """Erase the bar so that result lines printed to the same terminal stay readable."""
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def close(self):
        if self.enabled:
            sys.stderr.write("\n")


def _run(device, case, path, inputs):
    """(outputs, guard failures, dispatches) of one path; compiled graph released afterwards."""
    cg = CompiledGraph(device, C.build(case, path, device))
    try:
        out = cg.run(inputs)
        return out, cg.check_guards(), cg.recording.n_dispatches
    finally:
        cg.release()


def _worst(outs, refs, fn, scales=None):
    if scales is None:
        return max(fn(outs[k], refs[k]) for k in refs)
    return max(fn(outs[k], refs[k], scales.get(k)) for k in refs)


def _row(case, path, **kw):
    row = {"case": case.name, **case.as_dict(), "path": path, "nmse_unfused": None, "nmse_ref": None,
           "max_abs": None, "bound": None, "nonfinite": 0, "guards": [], "dispatches": None,
           "note": "", "error": None, "pass": False}
    row.update(kw)
    return row


def eval_case(device, case, path_names, rng):
    """Rows (dicts) for one case: the unfused chain first, then each fused variant."""
    inputs = C.make_inputs(case, rng)
    order = [p for p in path_names if p == C.UNFUSED] + [p for p in path_names if p != C.UNFUSED]
    if case.fused_only:
        order = [p for p in order if p != C.UNFUSED]
    if case.T == 0:
        return [_eval_empty(device, case, p, inputs) for p in order]
    ref, scales = C.reference_and_scales(case, inputs)
    bound = MAX_ABS[case.op] * max(1.0, max(float(np.max(np.abs(r))) for r in ref.values()))
    rows, unfused = [], None
    for path in order:
        try:
            out, guards, n = _run(device, case, path, inputs)
        except Exception as e:      # a failure of one path must not hide the others
            rows.append(_row(case, path, error=f"{type(e).__name__}: {e}"))
            continue
        row = _row(case, path, nmse_ref=_worst(out, ref, nmse, scales), max_abs=_worst(out, ref, max_abs),
                   bound=bound, nonfinite=sum(nonfinite_mismatch(out[k], ref[k]) for k in ref),
                   guards=guards, dispatches=n)
        if path == C.UNFUSED:
            unfused = out
        elif unfused is not None:
            row["nmse_unfused"] = _worst(out, unfused, nmse, scales)
            row["nonfinite"] += sum(nonfinite_mismatch(out[k], unfused[k]) for k in ref)
        row["pass"] = (row["nmse_ref"] <= NMSE_MAX and row["max_abs"] <= bound and row["nonfinite"] == 0
                       and not guards and (row["nmse_unfused"] is None or row["nmse_unfused"] <= NMSE_MAX)
                       and (path == C.UNFUSED or unfused is not None or case.fused_only))
        if path != C.UNFUSED and unfused is None and not case.fused_only:
            row["note"] = "no unfused result to compare with"
        rows.append(row)
    return rows


def _eval_empty(device, case, path, inputs):
    """T = 0: empty outputs of the right shape, or a ValueError naming the argument, are both
    correct answers."""
    try:
        out, guards, n = _run(device, case, path, inputs)
    except ValueError as e:
        named = any(re.search(rf"\b{re.escape(k)}\b", str(e)) for k in C.input_shapes(case))
        return _row(case, path, note=f"rejected: {e}", **{"pass": named},
                    error=None if named else f"ValueError names no argument: {e}")
    except Exception as e:
        return _row(case, path, error=f"{type(e).__name__}: {e}")
    want = C.output_shapes(case)
    bad = [k for k in want if out[k].shape != want[k]]
    return _row(case, path, guards=guards, dispatches=n, note="empty result",
                error=f"output shapes {[out[k].shape for k in bad]}, expected {[want[k] for k in bad]}" if bad else None,
                **{"pass": not bad and not guards})


def _fmt(x):
    return "-" if x is None else f"{x:.1e}"


def format_row(r, width):
    if r["error"]:
        detail = f"ERROR {r['error']}"
    elif r["nmse_ref"] is None:
        detail = r["note"]
    else:
        detail = (f"nmse_unfused {_fmt(r['nmse_unfused']):>7s}  nmse_ref {_fmt(r['nmse_ref']):>7s}  "
                  f"max_abs {_fmt(r['max_abs']):>7s} (≤{_fmt(r['bound'])})  "
                  f"nonfinite {r['nonfinite']}  guards {'ok' if not r['guards'] else 'BROKEN ' + ','.join(r['guards'])}"
                  f"  dispatches {r['dispatches']}")
        if r["note"]:
            detail += f"  ({r['note']})"
    return f"{r['case']:{width}s} {r['path']:13s} {'PASS' if r['pass'] else 'FAIL'}  {detail}"


def select(cases, ops=None, pattern=None):
    if ops:
        cases = [c for c in cases if c.op in ops]
    if pattern:
        rx = re.compile(pattern)
        cases = [c for c in cases if rx.search(c.name)]
    return cases


def main(argv=None):
    ap = parser("eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", type=C.parse_ops, help="only these ops, e.g. HC_COMB or HC_PRE,HC_POST")
    ap.add_argument("--filter", metavar="REGEX", help="only cases whose name matches, e.g. 'T=17 '")
    ap.add_argument("--quick", action="store_true", help="a small sweep (CI)")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="write the results as JSON to PATH (stdout, instead of the table, without PATH)")
    ap.add_argument("--progress", action="store_true", help="progress bar on stderr even when it is not a tty")
    ap.add_argument("--seed", type=int, help="seed of the random inputs (default: fresh, printed)")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    args = ap.parse_args(argv)
    apply_device(args)
    if args.filter:
        try:
            re.compile(args.filter)
        except re.error as e:
            ap.error(f"--filter {args.filter!r} is not a valid regular expression: {e}")

    device = default_device()
    cases = select(C.eval_cases(device, args.quick), args.op, args.filter)
    if not cases:
        print("error: no case matches --op/--filter", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(f"{c.name:40s} {c.why}" for c in cases))
        return 0
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    to_stdout = args.json != "-"
    header = (f"# eval on {device.name} ({device.caps.type}), subgroup size {device.subgroup_size}, "
              f"seed {seed}, {len(cases)} cases")
    if to_stdout:
        print(header, flush=True)
    path_names = {op: C.paths(device, op) for op in {c.op for c in cases}}
    if to_stdout:
        for op in sorted(path_names):
            print(f"# {op}: paths {', '.join(path_names[op])}")
    width = max(len(c.name) for c in cases)
    progress = Progress(len(cases), args.progress or sys.stderr.isatty())
    rows = []
    for case in cases:
        progress.step(case.name)
        case_rows = eval_case(device, case, path_names[case.op], rng)
        device.pool.trim()              # sizes change from case to case: do not hoard free buffers
        rows += case_rows
        if to_stdout:
            progress.clear()
            for r in case_rows:
                print(format_row(r, width), flush=True)
    progress.close()
    failed = sum(not r["pass"] for r in rows)
    summary = f"# {len(rows) - failed} passed, {failed} failed ({len(cases)} cases, subgroup size {device.subgroup_size})"
    if to_stdout:
        print(summary)
    if args.json:
        doc = {"device": device.name, "device_type": device.caps.type, "subgroup_size": device.subgroup_size,
               "seed": seed, "paths": path_names, "nmse_max": NMSE_MAX, "max_abs_rel": MAX_ABS,
               "passed": len(rows) - failed, "failed": failed, "results": rows}
        text = json.dumps(doc, indent=1, default=float)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
    return 1 if failed else 0
