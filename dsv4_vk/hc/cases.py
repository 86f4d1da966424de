"""The one case list behind `python -m dsv4_vk eval` (correctness) and `bench` (speed).

A Case is (op, T, D, n_iter, eps, peaked, paths). For every case the harness builds the same graph
once per path — each fused variant this device can run ("fused:<variant>"), and the unfused chain
("unfused") — feeds every path the same fresh random inputs in the spec's ranges and compares them
with each other and with the op's float64 numpy reference.

Eval cases: the spec's test cases (HC_OPS.md "Test cases"), sizes crossing this device's subgroup
and workgroup boundaries, peaked logits (scale × 10), T = 0, and (full sweep) grids past the 65535
workgroup limit. Bench cases: decode (T = 1) and prefill (T = 512 … 4096) for each hidden size D.
"""
import argparse
import math
from dataclasses import dataclass

import numpy as np

from ..core.graph import Graph

OPS = ("HC_COMB", "HC_PRE", "HC_POST", "HC_STEP", "HC_SITE_PRE")
# HC_STEP: the three HC ops of one site in one graph (comb from mixes, pre collapse, post fan-out
# with that comb), so their joint cost is read off one GPU timeline as a model sees it.
UNFUSED = "unfused"
MAX_GROUPS = 65535


@dataclass(frozen=True)
class Case:
    op: str
    T: int
    D: int = 0              # hidden size; 0 for HC_COMB (it has none)
    n_iter: int = 20        # Sinkhorn iterations (HC_COMB, HC_SITE_PRE)
    eps: float = 1e-6       # hc_eps
    peaked: bool = False    # comb logits scale × 10
    fused_only: bool = False  # too large for the unfused chain on this device: fused vs reference
    why: str = "spec"       # where the case comes from

    @property
    def name(self):
        parts = [self.op, f"T={self.T}"]
        if self.op != "HC_COMB":
            parts.append(f"D={self.D}")
        if self.op in ("HC_COMB", "HC_STEP", "HC_SITE_PRE"):
            parts.append(f"n_iter={self.n_iter}")
            if self.eps != 1e-6:
                parts.append(f"eps={self.eps:g}")
        if self.peaked:
            parts.append("peaked")
        return " ".join(parts)

    def as_dict(self):
        return {"op": self.op, "T": self.T, "D": self.D, "n_iter": self.n_iter, "eps": self.eps,
                "peaked": self.peaked, "why": self.why, "name": self.name}


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
    else:
        fused = ["fused"] if variants.get(op) else []
    return fused + [UNFUSED]


def _path_args(path):
    """(fused, variant) keyword values for a path name."""
    if path == UNFUSED:
        return False, None
    _, _, variant = path.partition(":")
    return True, (variant or None)


# --- case lists ------------------------------------------------------------------------------------

def spec_cases():
    """HC_OPS.md "Test cases" (llama.cpp's eval set)."""
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
        key = (c.op, c.T, c.D, c.n_iter, c.eps, c.peaked)
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
    T, D = case.T, case.D
    return {
        "HC_COMB": {"mixes": (T, 24), "scale": (3,), "base": (24,)},
        "HC_PRE": {"x": (T, 4, D), "weights": (T, 4)},
        "HC_POST": {"f": (T, D), "residual": (T, 4, D), "post": (T, 4), "comb": (T, 4, 4)},
        "HC_SITE_PRE": {"X": (T, 4, D), "fn": (24, 4 * D), "scale": (3,), "base": (24,)},
        "HC_STEP": {"mixes": (T, 24), "scale": (3,), "base": (24,), "X": (T, 4, D), "weights": (T, 4),
                    "f": (T, D), "post": (T, 4)},
    }[case.op]


def output_shapes(case):
    T, D = case.T, case.D
    return {
        "HC_COMB": {"comb": (T, 4, 4)},
        "HC_PRE": {"u": (T, D)},
        "HC_POST": {"out": (T, 4, D)},
        "HC_SITE_PRE": {"u": (T, D), "post": (T, 4), "comb": (T, 4, 4)},
        "HC_STEP": {"u": (T, D), "out": (T, 4, D)},
    }[case.op]


_RANGES = {   # HC_OPS.md input ranges
    "mixes": (-2, 2), "scale": (-0.5, 0.5), "base": (-0.25, 0.25), "weights": (0, 1), "comb": (0, 1),
    "post": (0, 2), "x": (-1, 1), "residual": (-1, 1), "f": (-1, 1), "X": (-1, 1),
}


def make_inputs(case, rng):
    """Fresh float32 inputs in the spec's ranges. Peaked: scale × 10. HC_SITE_PRE's fn is
    U[−1,1]·2/√(4D), which makes its mixes about as wide as the spec's U[−2,2]."""
    out = {}
    for name, shape in input_shapes(case).items():
        if name == "fn":
            a = rng.uniform(-1, 1, shape) * (2 / math.sqrt(shape[1]))
        else:
            a = rng.uniform(*_RANGES[name], shape)
        if name == "scale" and case.peaked:
            a = a * 10
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
                                    norm_eps=1e-6, n_iter=case.n_iter, **kw)
        outs = {"u": u, "post": post, "comb": comb}
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


def reference_and_scales(case, inputs):
    """(float64 numpy results named as in output_shapes, {output: Σ|term|}): the scales cover the
    outputs that are sums whose terms may cancel (see metrics.nmse); the others (comb, post:
    positive) are left out."""
    from . import kernels as ref
    a = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    if case.op == "HC_COMB":
        return {"comb": ref.reference_comb(a["mixes"], a["scale"], a["base"], case.eps, case.n_iter)}, {}
    if case.op == "HC_PRE":
        return ({"u": ref.reference_pre(a["x"], a["weights"])},
                {"u": ref.magnitude(ref.reference_pre, a["x"], a["weights"])})
    if case.op == "HC_POST":
        args = (a["f"], a["residual"], a["post"], a["comb"])
        return {"out": ref.reference_post(*args)}, {"out": ref.magnitude(ref.reference_post, *args)}
    if case.op == "HC_STEP":
        comb = ref.reference_comb(a["mixes"], a["scale"], a["base"], case.eps, case.n_iter)
        post_args = (a["f"], a["X"], a["post"], comb)
        return ({"u": ref.reference_pre(a["X"], a["weights"]), "out": ref.reference_post(*post_args)},
                {"u": ref.magnitude(ref.reference_pre, a["X"], a["weights"]),
                 "out": ref.magnitude(ref.reference_post, *post_args)})
    pre, post, comb = ref.reference_site_coefs(a["X"], a["fn"], a["scale"], a["base"], case.eps, 1e-6, case.n_iter)
    return ({"u": ref.reference_pre(a["X"], pre), "post": post, "comb": comb},
            {"u": ref.magnitude(ref.reference_pre, a["X"], pre)})


def io_bytes(case):
    """Bytes an ideal kernel reads and writes: every input and output tensor once (f32)."""
    shapes = list(input_shapes(case).values()) + list(output_shapes(case).values())
    return 4 * sum(math.prod(s) for s in shapes)
