"""Profiling of graph runs: GPU time per op, dispatches, barriers and submits, split into phases.

    from dsv4_vk import profile
    with profile.profile() as prof:
        with profile.phase("prefill"):
            ...                              # Executor runs
        with profile.phase("decode"):
            ...
    print(prof.table())                      # or prof.as_dict()

`DSV4_VK_PROFILE=1` profiles every run of the process and prints the table to stderr at exit.
Ops are the dispatch labels the executor gives (the node's tag, e.g. "HC_COMB" or
"HC_COMB/unfused", else the op name). While profiling is active the executor records a timestamp
after every dispatch; the executor calls `active()` and `notify(stats)` (keep both).
"""
import atexit
import collections
import contextlib
import sys

from ..vk import env

DEFAULT_PHASE = "run"

_stack: "list[Profile]" = []   # active Profile objects (profile() blocks, innermost last)
_phases: list[str] = []        # phase names, innermost last
_env_profile = None   # the process-wide Profile of DSV4_VK_PROFILE=1


def _env_enabled():
    """DSV4_VK_PROFILE, read once (at the first run): every run asks, and the environment lookup
    would cost each library call about a microsecond."""
    global _env_flag
    if _env_flag is None:
        _env_flag = env.flag("DSV4_VK_PROFILE")
    return _env_flag


_env_flag = None


def active():
    """True while any run should be profiled (the executor then records timestamps)."""
    return bool(_stack) or (_env_flag if _env_flag is not None else _env_enabled())   # (every run asks)


def notify(stats):
    """Called by the executor with the RunStats of every run."""
    global _env_profile
    if _env_enabled() and _env_profile is None:
        _env_profile = Profile()
        atexit.register(_print_at_exit)
    for prof in _stack + ([_env_profile] if _env_profile is not None else []):
        prof.add(stats)


def _print_at_exit():
    if _env_profile is not None and _env_profile.phases:
        print(_env_profile.table(), file=sys.stderr)


def current_phase():
    return _phases[-1] if _phases else DEFAULT_PHASE


@contextlib.contextmanager
def phase(name):
    """Runs inside are counted under phase `name` (innermost phase wins)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"phase name must be a non-empty string, got {name!r}")
    _phases.append(name)
    try:
        yield
    finally:
        _phases.pop()


@contextlib.contextmanager
def profile():
    """Profile every run inside; yields the Profile that collects them."""
    prof = Profile()
    _stack.append(prof)
    try:
        yield prof
    finally:
        _stack.remove(prof)


class PhaseStats:
    """Totals of one phase and its per-op (label) breakdown."""

    def __init__(self):
        self.runs = self.submits = self.dispatches = self.barriers = 0
        self.untimed_runs = 0        # runs without timestamps (device without timestamp queries)
        self.gpu_ns = 0.0
        self.ops = collections.OrderedDict()    # label -> [dispatches, gpu ns]
        # (position in its run, label, detail) -> [runs, gpu ns]: each dispatch of the phase's runs
        self.dispatch_times = collections.OrderedDict()

    def add(self, stats):
        self.runs += 1
        self.submits += stats.submits
        self.dispatches += stats.dispatches
        self.barriers += stats.barriers
        if stats.gpu_ns is None:
            self.untimed_runs += 1
        for label, (n, ns) in stats.per_label().items():
            entry = self.ops.setdefault(label, [0, 0.0])
            entry[0] += n
            entry[1] += ns
            self.gpu_ns += ns
        if stats.gpu_ns is not None:
            for i, (label, detail) in enumerate(zip(stats.labels, stats.details)):
                entry = self.dispatch_times.setdefault((i, label, detail), [0, 0.0])
                entry[0] += 1
                entry[1] += float(stats.gpu_ns[i])

    def timeline(self):
        """[(position, label, detail, runs, mean GPU µs)] of every dispatch, in run order (dispatches of
        different graphs at one position are listed apart)."""
        return [(i, label, detail, n, ns / n / 1e3)
                for (i, label, detail), (n, ns) in sorted(self.dispatch_times.items(), key=lambda kv: kv[0][0])]

    def as_dict(self):
        return {"runs": self.runs, "submits": self.submits, "dispatches": self.dispatches,
                "barriers": self.barriers, "gpu_ms": self.gpu_ns / 1e6, "untimed_runs": self.untimed_runs,
                "ops": {k: {"dispatches": n, "gpu_ms": ns / 1e6} for k, (n, ns) in self.ops.items()}}


class Profile:
    """Collected runs, by phase. `table()` for people, `as_dict()` for programs."""

    def __init__(self):
        self.phases = collections.OrderedDict()   # phase name -> PhaseStats

    def add(self, stats):
        self.phases.setdefault(current_phase(), PhaseStats()).add(stats)

    @staticmethod
    def phase(name):
        """Same as the module's `phase(name)`."""
        return phase(name)

    def total(self):
        tot = PhaseStats()
        for ph in self.phases.values():
            for k in ("runs", "submits", "dispatches", "barriers", "untimed_runs", "gpu_ns"):
                setattr(tot, k, getattr(tot, k) + getattr(ph, k))
            for label, (n, ns) in ph.ops.items():
                entry = tot.ops.setdefault(label, [0, 0.0])
                entry[0] += n
                entry[1] += ns
        return tot

    def as_dict(self):
        return {"phases": {k: v.as_dict() for k, v in self.phases.items()}, "total": self.total().as_dict()}

    def table(self):
        """One block per phase: ops by GPU time (dispatches, per run, GPU ms, share), then totals."""
        if not self.phases:
            return "profile: no runs recorded"
        width = max([len(lab) for ph in self.phases.values() for lab in ph.ops] + [24])
        head = f"{'phase':10s} {'op':{width}s} {'dispatches':>10s} {'per run':>9s} {'GPU ms':>10s} {'share':>7s}"
        lines = [head, "-" * len(head)]
        for name, ph in self.phases.items():
            for label, (n, ns) in sorted(ph.ops.items(), key=lambda kv: -kv[1][1]):
                share = f"{100 * ns / ph.gpu_ns:6.1f}%" if ph.gpu_ns else "     -"
                lines.append(f"{name:10s} {label:{width}s} {n:10d} {n / ph.runs:9.1f} {ns / 1e6:10.3f} {share}")
            note = f", {ph.untimed_runs} untimed" if ph.untimed_runs else ""
            lines.append(f"{name:10s} {'total':{width}s} {ph.dispatches:10d} {ph.dispatches / ph.runs:9.1f} "
                         f"{ph.gpu_ns / 1e6:10.3f}   runs {ph.runs}, submits {ph.submits}, "
                         f"barriers {ph.barriers}{note}")
        return "\n".join(lines)

    def __repr__(self):
        return f"Profile(phases={list(self.phases)})"
