"""The one case list behind `python -m dsv4_vk eval` (correctness) and `bench` (speed).

A Case is (op, T, D, n_iter, eps, norm_eps, peaked, paths). For every case the harness builds the same
graph once per path — each fused variant this device can run ("fused:<variant>"), and the unfused chain
("unfused") — feeds every path the same fresh random inputs in the spec's ranges and compares them
with each other and with the op's float64 numpy reference.

Eval cases: the spec's test cases (llama.cpp's eval set, `spec_cases`), sizes crossing this
device's subgroup and workgroup boundaries, peaked logits (scale × 10), T = 0, and (full sweep)
grids past the 65535 workgroup limit. Bench cases: decode (T = 1) and prefill (T = 512 … 4096) for
each hidden size D.
"""
import argparse
import math
import re
from dataclasses import dataclass

import numpy as np

from ..core.graph import Graph
from .metrics import max_abs, nmse, nonfinite_mismatch

OPS = ("HC_COMB", "HC_PRE", "HC_POST", "HC_STEP", "HC_SITE_PRE", "HC_MIX", "HC_SITE")
# HC_STEP: the three HC ops of one site in one graph (comb from mixes, pre collapse, post fan-out
# with that comb), so their joint cost is read off one GPU timeline as a model sees it.
# HC_MIX: a site's mixes (flat RMS + mixes mat-mul) alone.
# HC_SITE: a whole site as it runs inside a model, pre and post, with an identity sublayer (f = u):
# from X and the site's weights to u, post, comb and the new streams. Where a post carries the next
# site's mixes (plan.carries: decode, T ≤ CARRY_MAX_T, and with PREFILL_CARRY any T) its
# mixes' partial sums come in as `mix` ([T, G, 25] in the G D splits the previous site's post
# makes, plan.carry_splits; the host computes them) and its post computes the next site's
# (next fn = fn): the steady state of a chain of sites, mixes included. Elsewhere the site reads X
# for its mixes.
UNFUSED = "unfused"
SITE, THREE_OP = "fused:site", "three-op"
MAX_GROUPS = 65535


@dataclass(frozen=True)
class Case:
    op: str
    T: int
    D: int = 0              # hidden size; 0 for HC_COMB (it has none)
    n_iter: int = 20        # Sinkhorn iterations (HC_COMB, HC_SITE_PRE)
    eps: float = 1e-6       # hc_eps
    norm_eps: float = 1e-6  # the flat RMS norm's eps (HC_MIX, HC_SITE_PRE, HC_SITE)
    peaked: bool = False    # comb logits scale × 10
    fused_only: bool = False  # too large for the unfused chain on this device: fused vs reference
    why: str = "spec"       # where the case comes from

    @property
    def name(self):
        parts = [self.op, f"T={self.T}"]
        if self.op != "HC_COMB":
            parts.append(f"D={self.D}")
        if self.op in ("HC_COMB", "HC_STEP", "HC_SITE_PRE", "HC_SITE"):
            parts.append(f"n_iter={self.n_iter}")
            if self.eps != 1e-6:
                parts.append(f"eps={self.eps:g}")
        if self.norm_eps != 1e-6:
            parts.append(f"norm_eps={self.norm_eps:g}")
        if self.peaked:
            parts.append("peaked")
        return " ".join(parts)

    def as_dict(self):
        return {"op": self.op, "T": self.T, "D": self.D, "n_iter": self.n_iter, "eps": self.eps,
                "norm_eps": self.norm_eps, "peaked": self.peaked, "why": self.why, "name": self.name}


def parse_ops(text):
    """argparse type for --op: a comma-separated subset of OPS."""
    ops = [o.strip().upper() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise argparse.ArgumentTypeError(f"unknown op(s) {bad or text!r}; expected a comma-separated subset of "
                                         f"{', '.join(OPS)}")
    return ops


# --- which paths run here ----------------------------------------------------------------------

def paths(device, op):
    """Path names for `op` on `device`: "fused:<variant>" for each runnable variant, then "unfused"."""
    from . import composite as hc
    variants = hc.variants(device)
    if op == "HC_COMB":
        fused = [f"fused:{v}" for v in variants.get("HC_COMB", [])]
    elif op == "HC_SITE_PRE":
        fused = ["fused"] if any(variants.get(k) for k in ("HC_COMB", "HC_PRE", "HC_SITE_PRE")) else []
    elif op == "HC_STEP":
        fused = [f"fused:{v}" for v in variants.get("HC_COMB", [])]
    elif op == "HC_SITE":
        fused = ([SITE] if variants.get("HC_SITE") else []) + ([THREE_OP] if variants.get("HC_COMB") else [])
    elif op == "HC_MIX":
        from .policy import mix_supported
        fused = ["fused"] if mix_supported(device) is None else []
    else:
        fused = ["fused"] if variants.get(op) else []
    return fused + [UNFUSED]


def _path_args(path):
    """(fused, variant) keyword values for a path name."""
    if path == UNFUSED:
        return False, None
    if path == THREE_OP:
        return True, None
    _, _, variant = path.partition(":")
    return True, (variant or None)


# --- case lists ------------------------------------------------------------------------------------

def spec_cases():
    """The spec's test cases (llama.cpp's eval set)."""
    out = [Case("HC_COMB", T, n_iter=n) for T, n in ((1, 1), (17, 4), (257, 8), (17, 20))]
    out += [Case("HC_COMB", T) for T in (1, 256, 336, 512, 513, 1024, 2048)]
    for op in ("HC_PRE", "HC_POST"):
        out += [Case(op, T, D) for D, T in ((1, 1), (31, 17), (128, 257), (4096, 21))]
    return out


def _near(ks):
    return sorted({t for k in ks for t in (k - 1, k, k + 1) if t >= 1})


def boundary_cases(device, quick=False):
    """Sizes crossing this device's subgroup and workgroup boundaries.

    HC_COMB keeps a token in 16 lanes (sg16) or 4 lanes (rows4), workgroups of 4 subgroups or 64
    lanes: tokens per subgroup sg/16, sg/4, per workgroup sg/4, 16; plus sg and 64 for good measure.
    HC_PRE/POST cover D in chunks of 1 or 4 floats (vec4) per lane, 256 lanes per workgroup."""
    sg = device.subgroup_size
    why = f"subgroup {sg} / workgroup boundary"
    ks = {max(1, sg // 16), max(1, sg // 4), sg, 16, 64}
    ts = [k + 1 for k in sorted(ks)] if quick else _near(ks)
    out = [Case("HC_COMB", T, why=why) for T in ts]
    ds = (3, 257, 1025) if quick else (2, 3, 4, 5, 255, 256, 257, 1023, 1024, 1025, 1028)
    for op in ("HC_PRE", "HC_POST"):
        out += [Case(op, 3, D, why=why) for D in ds]
        out += [Case(op, sg + 1, 5, why=why)]
    return out


def edge_cases(quick=False):
    """T = 0, peaked logits, other eps, the whole site; (full sweep) grids past 65535 workgroups."""
    out = [Case(op, 0, 0 if op == "HC_COMB" else 8, why="T = 0") for op in OPS]
    peaked_ts = (17, 33) if quick else (1, 17, 257, 513)
    out += [Case("HC_COMB", T, peaked=True, why="peaked logits") for T in peaked_ts]
    out += [Case("HC_COMB", 9, eps=1e-3, why="other eps")]
    site = ((1, 1), (64, 5), (256, 17)) if quick else ((1, 1), (3, 7), (64, 5), (256, 17), (1024, 33), (4096, 3))
    out += [Case("HC_SITE_PRE", T, D, why="site") for D, T in site]
    out += [Case("HC_SITE_PRE", 17, 64, peaked=True, why="site, peaked logits")]
    # every coefficient knob at a value where getting it wrong shows: Sinkhorn iterations, hc_eps, and a
    # norm_eps comparable to mean(x²) = 1/3 (at 1e-6 a lost norm_eps moves the mixes by 1.5e-6 relative)
    knobs = ({"n_iter": 1}, {"n_iter": 4, "eps": 1e-3}, {"n_iter": 8, "norm_eps": 0.5})
    out += [Case("HC_SITE_PRE", 5, 64, why="site, other coefficient knobs", **k) for k in knobs]
    out += [Case("HC_SITE", T, 64, n_iter=4, eps=1e-3, norm_eps=0.5, why="whole site, other coefficient knobs")
            for T in ((3,) if quick else (3, 9, 70))]
    whole = ((1, 1), (5, 3), (64, 8), (64, 9), (257, 2), (4096, 1), (7168, 2)) if not quick else ((1, 1), (64, 8), (33, 9))
    out += [Case("HC_SITE", T, D, why="whole site (decode: carried mixes)" if T <= 8 else "whole site")
            for D, T in whole]
    out += [Case("HC_SITE", 4, 64, peaked=True, why="whole site, peaked logits")]
    if not quick:
        # (peaked logits stay at D = 64: at D = 4096 the unfused chain's 16384-term mixes sums, amplified
        # by the peaked comb scale, exceed the site's f32 bound while far within the spec's 1e-7)
        out += [Case("HC_SITE", 300, 1024, why="whole site, prefill")]
    mixd = ((1, 1), (7, 5), (4096, 1), (64, 300)) if not quick else ((7, 5), (64, 33))
    out += [Case("HC_MIX", T, D, why="mixes") for D, T in mixd]
    out += [Case("HC_MIX", T, D, norm_eps=0.5, why="mixes, norm_eps comparable to mean(x²)")
            for D, T in (((7, 5), (64, 70)) if quick else ((7, 5), (4096, 1), (64, 70)))]
    out += [Case("HC_STEP", T, D, why="three ops in one graph") for D, T in ((1, 1), (257, 3), (64, 33))]
    if not quick:
        # one workgroup per token slice (PRE/POST) and 16 tokens per workgroup at most (COMB)
        out += [Case(op, MAX_GROUPS + 2, 4, why="grid folded past 65535 workgroups") for op in ("HC_PRE", "HC_POST")]
        out += [Case("HC_COMB", MAX_GROUPS * 16 + 1, fused_only=True, why="grid folded past 65535 workgroups")]
    return out


def eval_cases(device, quick=False):
    """Every eval case for `device` (quick: a small sweep for CI), duplicates removed."""
    seen, out = set(), []
    for c in spec_cases() + boundary_cases(device, quick) + edge_cases(quick):
        key = (c.op, c.T, c.D, c.n_iter, c.eps, c.norm_eps, c.peaked)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


PREFILL_TS = (512, 1024, 2048, 4096)


def bench_cases(ds=(4096, 7168), prefill_ts=PREFILL_TS, ops=OPS):
    """(section, Case) for decode (T = 1) then prefill; HC_COMB has no D, so it appears once per T."""
    out = []
    for section, ts in (("decode", (1,)), ("prefill", tuple(prefill_ts))):
        for T in ts:
            for op in ops:
                for D in ((0,) if op == "HC_COMB" else ds):
                    out.append((section, Case(op, T, D, why=section)))
    return out


# --- inputs, graphs, references -------------------------------------------------------------------

def input_shapes(case):
    from .plan import carry_splits
    T, D = case.T, case.D
    return {
        "HC_COMB": {"mixes": (T, 24), "scale": (3,), "base": (24,)},
        "HC_PRE": {"x": (T, 4, D), "weights": (T, 4)},
        "HC_POST": {"f": (T, D), "residual": (T, 4, D), "post": (T, 4), "comb": (T, 4, 4)},
        "HC_SITE_PRE": {"X": (T, 4, D), "fn": (24, 4 * D), "scale": (3,), "base": (24,)},
        "HC_STEP": {"mixes": (T, 24), "scale": (3,), "base": (24,), "X": (T, 4, D), "weights": (T, 4),
                    "f": (T, D), "post": (T, 4)},
        "HC_MIX": {"X": (T, 4, D), "fn": (24, 4 * D)},
        "HC_SITE": {"X": (T, 4, D), "fn": (24, 4 * D), "scale": (3,), "base": (24,),
                    "mix": (T, carry_splits(T, D), 25)},
    }[case.op]


def output_shapes(case):
    T, D = case.T, case.D
    return {
        "HC_COMB": {"comb": (T, 4, 4)},
        "HC_PRE": {"u": (T, D)},
        "HC_POST": {"out": (T, 4, D)},
        "HC_SITE_PRE": {"u": (T, D), "post": (T, 4), "comb": (T, 4, 4)},
        "HC_STEP": {"u": (T, D), "out": (T, 4, D)},
        "HC_MIX": {"mix": (T, 24)},
        "HC_SITE": {"u": (T, D), "post": (T, 4), "comb": (T, 4, 4), "X_new": (T, 4, D)},
    }[case.op]


_RANGES = {   # the input ranges of docs/hc_math.md ("Test inputs")
    "mixes": (-2, 2), "scale": (-0.5, 0.5), "base": (-0.25, 0.25), "weights": (0, 1), "comb": (0, 1),
    "post": (0, 2), "x": (-1, 1), "residual": (-1, 1), "f": (-1, 1), "X": (-1, 1),
}


def make_inputs(case, rng):
    """Fresh float32 inputs in the spec's ranges. Peaked: scale × 10, the comb scale ±U[3, 5] (rows then
    stay visibly unnormalised, several % as the spec says). HC_SITE_PRE's fn is
    U[−1,1]·2/√(4D), which makes its mixes about as wide as the spec's U[−2,2]."""
    out = {}
    for name, shape in input_shapes(case).items():
        if name == "mix":       # the carried partial sums of X's mixes: not random, computed from X, fn,
            from .plan import carry_split_chunks           # in the D splits the post makes
            from .mix_kernels import reference_mix_partials
            unit = 4 if case.D % 4 == 0 else 1
            out[name] = reference_mix_partials(out["X"], out["fn"], shape[1], unit,
                                               carry_split_chunks(case.T, case.D)).astype(np.float32)
            continue
        if name == "fn":
            a = rng.uniform(-1, 1, shape) * (2 / math.sqrt(shape[1]))
        else:
            a = rng.uniform(*_RANGES[name], shape)
        if name == "scale" and case.peaked:
            a = a * 10
            a[2] = rng.choice([-1, 1]) * rng.uniform(3, 5)   # the comb logits' scale: surely peaked
        out[name] = a.astype(np.float32)
    return out


def build(case, path, device=None):
    """The graph computing `case` along `path` on `device` (default: the process-wide one); its
    outputs are named as in output_shapes."""
    from . import composite as hc
    fused, variant = _path_args(path)
    kw = {"fused": fused, "device": device}
    g = Graph()
    t = {k: g.input(k, s) for k, s in input_shapes(case).items()}
    if case.op == "HC_COMB":
        outs = {"comb": hc.comb(g, t["mixes"], t["scale"], t["base"], eps=case.eps, n_iter=case.n_iter,
                                variant=variant, **kw)}
    elif case.op == "HC_PRE":
        outs = {"u": hc.pre(g, t["x"], t["weights"], **kw)}
    elif case.op == "HC_POST":
        outs = {"out": hc.post(g, t["f"], t["residual"], t["post"], t["comb"], **kw)}
    elif case.op == "HC_SITE_PRE":
        u, post, comb = hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], hc_eps=case.eps,
                                    norm_eps=case.norm_eps, n_iter=case.n_iter, **kw)
        outs = {"u": u, "post": post, "comb": comb}
    elif case.op == "HC_MIX":
        outs = {"mix": hc.mixes(g, t["X"], t["fn"], norm_eps=case.norm_eps, fused=fused, device=device)}
    elif case.op == "HC_SITE":
        # hc.site's two halves, so that post and comb can be outputs; the sublayer is the identity
        site = True if path == SITE else False if path == THREE_OP else None
        kw = {"fused": fused, "site": site, "device": device}
        mix = t["mix"] if hc.carries(device, fused, case.T, case.D, site) else None
        u, post, comb = hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], hc_eps=case.eps,
                                    norm_eps=case.norm_eps, n_iter=case.n_iter, mix=mix, **kw)
        X_new, _ = hc.site_post(g, u, t["X"], post, comb, next_fn=t["fn"], **kw)
        outs = {"u": u, "post": post, "comb": comb, "X_new": X_new}
    elif case.op == "HC_STEP":
        comb = hc.comb(g, t["mixes"], t["scale"], t["base"], eps=case.eps, n_iter=case.n_iter,
                       variant=variant, **kw)
        outs = {"u": hc.pre(g, t["X"], t["weights"], **kw),
                "out": hc.post(g, t["f"], t["X"], t["post"], comb, **kw)}
    else:
        raise ValueError(f"unknown op {case.op!r}; expected one of {OPS}")
    for k, v in outs.items():
        g.output(k, v)
    return g


U = 2.0 ** -24                 # f32 unit roundoff
PATH_NMSE = 1e-7               # fused vs unfused, and the ceiling vs float64 (the spec's pass criterion)
COMB_NMSE, COMB_MAX_ABS = 1e-12, 5e-7      # comb/gates vs float64: a few f32 ulps (catches a lost eps = 1e-6)
SITE_NMSE, SITE_MAX_ABS = 1e-11, 2e-6      # a site adds the rounding of its 4·D-long mixes mat-mul
SITE_MAX_ABS_D = 2048          # ... up to this D; beyond it the bound grows as √D


def comb_max_abs(mixes, scale, base):
    """Elementwise bound of each token's comb against float64, [T, 1, 1]: COMB_MAX_ABS, plus what the
    rounding of its logits l = mix·scale + base carries (u·|l| each, which exp turns into a relative
    error of the entries; 2·u·max|l| allows for both normalisations). Peaked logits (|l| ≈ 10) reach
    a few 1e-7 more than unpeaked ones: one hypothesis example went 3% past the flat bound."""
    l = np.asarray(mixes, np.float64)[:, 8:24] * float(np.asarray(scale)[2]) + np.asarray(base, np.float64)[8:24]
    return (COMB_MAX_ABS + 2 * U * np.abs(l).max(axis=1))[:, None, None]


def site_max_abs(D: int) -> float:
    """Elementwise bound of a site's u, post and comb against float64. Their error is that of the
    mixes, dots over 4·D terms, which the unfused chain sums serially on CPU devices: a random walk
    of roundings, growing as √D (over 1500 seeds on lavapipe, the unfused post at D = 7168 reached
    0.89 of a flat 2e-6, at D = 64 0.16; one CI run went past it)."""
    return SITE_MAX_ABS * max(1.0, math.sqrt(D / SITE_MAX_ABS_D))


@dataclass
class Expected:
    """What one output must be: its float64 reference, the elementwise error bound, the NMSE ceiling
    vs the reference, and Σ|term| for sums whose terms may cancel (metrics.nmse's scale)."""
    ref: np.ndarray
    bound: object                  # float or array broadcastable to ref
    nmse_max: float = PATH_NMSE
    scale: object = None


def sum_bound(magnitude, n_terms):
    """Elementwise rounding bound of an f32 sum of n_terms products: 2·n·u·Σ|term|."""
    return 2 * n_terms * U * magnitude + 1e-30


def expected(case, inputs):
    """{output name: Expected} for `case` on `inputs` (float64 references, f32 error bounds)."""
    from . import kernels as ref
    a = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    if case.op == "HC_COMB":
        return {"comb": Expected(ref.reference_comb(a["mixes"], a["scale"], a["base"], case.eps, case.n_iter),
                                 comb_max_abs(a["mixes"], a["scale"], a["base"]), COMB_NMSE)}
    if case.op == "HC_PRE":
        m = ref.magnitude(ref.reference_pre, a["x"], a["weights"])
        return {"u": Expected(ref.reference_pre(a["x"], a["weights"]), sum_bound(m, 4), scale=m)}
    if case.op == "HC_POST":
        args = (a["f"], a["residual"], a["post"], a["comb"])
        m = ref.magnitude(ref.reference_post, *args)
        return {"out": Expected(ref.reference_post(*args), sum_bound(m, 5), scale=m)}
    if case.op == "HC_STEP":
        comb = ref.reference_comb(a["mixes"], a["scale"], a["base"], case.eps, case.n_iter)
        post_args = (a["f"], a["X"], a["post"], comb)
        mu = ref.magnitude(ref.reference_pre, a["X"], a["weights"])
        mo = ref.magnitude(ref.reference_post, *post_args)
        # the comb the graph computes carries its own error (≤ COMB_MAX_ABS per element)
        comb_err = COMB_MAX_ABS * np.abs(a["X"]).sum(axis=1, keepdims=True)
        return {"u": Expected(ref.reference_pre(a["X"], a["weights"]), sum_bound(mu, 4), scale=mu),
                "out": Expected(ref.reference_post(*post_args), sum_bound(mo, 5) + comb_err, scale=mo)}
    if case.op == "HC_MIX":
        # a dot over 4·D terms: summed in pieces of ≤ 64 serial terms on the fused path (splits, lanes);
        # the NMSE ceiling is the strict check
        m = ref.magnitude(ref.reference_mixes, a["X"], a["fn"], case.norm_eps)
        return {"mix": Expected(ref.reference_mixes(a["X"], a["fn"], case.norm_eps), sum_bound(m, 64), SITE_NMSE)}
    if case.op in ("HC_SITE_PRE", "HC_SITE"):
        pre, post, comb = ref.reference_site_coefs(a["X"], a["fn"], a["scale"], a["base"], case.eps, case.norm_eps,
                                                   case.n_iter)
        u = ref.reference_pre(a["X"], pre)
        mu = ref.magnitude(ref.reference_pre, a["X"], pre)
        bound = site_max_abs(a["X"].shape[2])
        out = {"u": Expected(u, bound, SITE_NMSE, mu),
               "post": Expected(post, bound, SITE_NMSE), "comb": Expected(comb, bound, SITE_NMSE)}
        if case.op == "HC_SITE":     # post with f = u: u, post and comb each carry their own error
            mo = ref.magnitude(ref.reference_post, u, a["X"], post, comb)
            err_in = bound * (np.abs(u)[:, None, :] + 2 + np.abs(a["X"]).sum(axis=1, keepdims=True))
            out["X_new"] = Expected(ref.reference_post(u, a["X"], post, comb), sum_bound(mo, 5) + err_in, SITE_NMSE, mo)
        return out
    raise ValueError(f"unknown op {case.op!r}; expected one of {OPS}")


# --- evaluation: every path of a case on the same inputs ------------------------------------------------

def run_path(device, case, path, inputs):
    """(outputs, guard failures, dispatches) of one path; the compiled graph is released afterwards."""
    from ..core.executor import CompiledGraph
    cg = CompiledGraph(device, build(case, path, device))
    try:
        out = cg.run(inputs)
        return out, cg.check_guards(), cg.recording.n_dispatches
    finally:
        cg.release()


def _row(case, path, **kw):
    row = {"case": case.name, **case.as_dict(), "path": path, "nmse_unfused": None, "nmse_ref": None,
           "max_abs": None, "bound_excess": None, "nonfinite": 0, "guards": [], "dispatches": None,
           "note": "", "error": None, "pass": False}
    row.update(kw)
    return row


def _compare(out, exp):
    """(worst NMSE vs reference, worst NMSE over its ceiling, worst |error|, worst |error| − bound,
    NaN/inf mismatches) over the outputs."""
    nms = {k: nmse(out[k], e.ref, e.scale) for k, e in exp.items()}
    nm, over = max(nms.values()), max(nms[k] / e.nmse_max for k, e in exp.items())
    ma = max(max_abs(out[k], e.ref) for k, e in exp.items())
    excess = max(float(np.max(np.where(np.isfinite(e.ref) & np.isfinite(out[k]),
                                       np.abs(out[k] - e.ref) - e.bound, -np.inf), initial=-np.inf))
                 for k, e in exp.items())
    return nm, over, ma, excess, sum(nonfinite_mismatch(out[k], e.ref) for k, e in exp.items())


def evaluate_case(device, case, path_names, rng, run=None):
    """Rows (dicts) for one case: the unfused chain first, then each fused path, on the same fresh
    inputs. PASS: NMSE vs float64 within the output's ceiling (Expected.nmse_max),
    every element within its f32 error bound, NMSE vs the unfused chain ≤ 1e-7, NaN/inf placed as
    in the reference, guards intact. T = 0: empty outputs of the right shape, or a ValueError that
    names an argument."""
    run = run or run_path
    inputs = make_inputs(case, rng)
    order = [p for p in path_names if p == UNFUSED] + [p for p in path_names if p != UNFUSED]
    if case.fused_only:
        order = [p for p in order if p != UNFUSED]
    if case.T == 0:
        return [_evaluate_empty(device, case, p, inputs, run) for p in order]
    exp = expected(case, inputs)
    rows, unfused = [], None
    for path in order:
        try:
            out, guards, n = run(device, case, path, inputs)
        except Exception as e:      # a failure of one path must not hide the others
            rows.append(_row(case, path, error=f"{type(e).__name__}: {e}"))
            continue
        nm, over, ma, excess, nonfinite = _compare(out, exp)
        row = _row(case, path, nmse_ref=nm, nmse_ref_ceiling_ratio=over, max_abs=ma, bound_excess=excess,
                   nonfinite=nonfinite, guards=guards, dispatches=n)
        if path == UNFUSED:
            unfused = out
        elif unfused is not None:
            row["nmse_unfused"] = max(nmse(out[k], unfused[k], exp[k].scale) for k in exp)
            row["nonfinite"] += sum(nonfinite_mismatch(out[k], unfused[k]) for k in exp)
        row["pass"] = (over <= 1 and excess <= 0 and row["nonfinite"] == 0 and not guards
                       and (row["nmse_unfused"] is None or row["nmse_unfused"] <= PATH_NMSE)
                       and (path == UNFUSED or unfused is not None or case.fused_only))
        if path != UNFUSED and unfused is None and not case.fused_only:
            row["note"] = "no unfused result to compare with"
        rows.append(row)
    return rows


def _evaluate_empty(device, case, path, inputs, run):
    try:
        out, guards, n = run(device, case, path, inputs)
    except ValueError as e:
        named = any(re.search(rf"\b{re.escape(k)}\b", str(e)) for k in input_shapes(case))
        return _row(case, path, note=f"rejected: {e}", **{"pass": named},
                    error=None if named else f"ValueError names no argument: {e}")
    except Exception as e:
        return _row(case, path, error=f"{type(e).__name__}: {e}")
    want = output_shapes(case)
    bad = [k for k in want if out[k].shape != want[k]]
    return _row(case, path, guards=guards, dispatches=n, note="empty result",
                error=f"output shapes {[out[k].shape for k in bad]}, expected {[want[k] for k in bad]}" if bad else None,
                **{"pass": not bad and not guards})


def floor_bytes(case):
    """HC_SITE: the bytes a site must move at least, by the issue's measure: X read for the mixes and
    for the collapse, f (= u here) and X read and X written by the post (f32). Else io_bytes."""
    if case.op != "HC_SITE":
        return io_bytes(case)
    return 4 * case.T * (4 * 4 * case.D + case.D)


def io_bytes(case):
    """Bytes an ideal kernel reads and writes: every input and output tensor once (f32)."""
    shapes = list(input_shapes(case).values()) + list(output_shapes(case).values())
    return 4 * sum(math.prod(s) for s in shapes)
