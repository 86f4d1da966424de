"""`python -m dsv4_vk eval`: every case of dsv4_vk/hc/cases.py along every path this device runs
(each fused variant and the unfused chain), on the same fresh random inputs, against each other
and against the float64 numpy reference. One line per case and path; exit status 1 on any FAIL.

PASS (dsv4_vk.hc.cases.evaluate_case, also what the tests assert): NMSE vs the unfused chain ≤ 1e-7
(fused paths); NMSE vs the float64 reference within the output's ceiling (1e-7, tighter where f32
rounding allows: comb and gates 1e-12, site outputs 1e-11); every element
within its f32 error bound (sums: 2·n·u·Σ|term|; comb 5e-7; site 2e-6); no NaN/inf placed
differently; guard regions around every tensor intact. T = 0 passes when the op either returns empty
outputs of the right shape or refuses with a ValueError that names the argument.
"""
import argparse
import json
import re
import sys
import time

import numpy as np

from ..hc import cases as C
from ..vk import default_device
from . import apply_device, parser

NMSE_MAX = C.PATH_NMSE


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


def _fmt(x):
    return "-" if x is None else f"{x:.1e}"


def format_row(r, width):
    if r["error"]:
        detail = f"ERROR {r['error']}"
    elif r["nmse_ref"] is None:
        detail = r["note"]
    else:
        detail = (f"nmse_unfused {_fmt(r['nmse_unfused']):>7s}  nmse_ref {_fmt(r['nmse_ref']):>7s}  "
                  f"max_abs {_fmt(r['max_abs']):>7s} (over bound: {'no' if r['bound_excess'] <= 0 else _fmt(r['bound_excess'])})  "
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
        case_rows = C.evaluate_case(device, case, path_names[case.op], rng)
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
               "seed": seed, "paths": path_names, "nmse_max": NMSE_MAX,
               "passed": len(rows) - failed, "failed": failed, "results": rows}
        text = json.dumps(doc, indent=1, default=float)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
    return 1 if failed else 0
