"""numpy in, numpy out: the hyper-connection ops as plain functions (float32 results).

Each call validates its arguments (ValueError naming the argument and what was expected), builds
the op's graph, and runs it on `device` (default: the process-wide device) through an executor that
compiles each graph shape once and replays it. T = 0 returns empty results without touching the
device. `last_run()` describes the last call: dispatches, barriers, paths [(op, path, reason)].
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from . import composite as hc, policy as hc_policy
from ..core.executor import Executor
from ..core.graph import Graph
from ..ops.base import format_shape
from .kernels import HC, N_MIX, check_eps, check_n_iter
from ..vk import Device, default_device

_executors = {}
_last = None


def _executor(device):
    device = device or default_device()
    hit = _executors.get(id(device))
    if hit is None or hit.device is not device:
        hit = _executors[id(device)] = Executor(device)
    return hit


def _array(name, a, expected):
    """a as float32 with shape `expected` (ints, or None: any size; T may be 0, D must be ≥ 1)."""
    try:
        arr = np.asarray(a)
    except Exception as e:      # ragged lists and the like
        raise ValueError(f"{name} must be a numeric array, got {type(a).__name__} ({e})") from None
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be a floating-point array (float32 or float64), got dtype {arr.dtype}")
    want = format_shape(expected)
    if arr.ndim != len(expected):
        raise ValueError(f"{name} must have rank {len(expected)} (shape {want}), got shape {arr.shape}")
    for s, e in zip(arr.shape, expected):
        if e is not None and s != e:
            raise ValueError(f"{name} must have shape {want}, got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def _same(what, *named):
    (n0, v0), *rest = named
    for n, v in rest:
        if v != v0:
            raise ValueError(f"{what} disagrees between {n0} ({v0}) and {n} ({v})")
    return v0


def _hidden(name, d):
    if d < 1:
        raise ValueError(f"{name}: hidden size D must be ≥ 1, got {d}")
    return d


def _run(device, inputs, build):
    """Build the graph from named inputs, run it, return its outputs in order."""
    global _last
    ex = _executor(device)
    g = Graph()
    t = {k: g.input(k, v.shape) for k, v in inputs.items()}
    outs = build(g, t, ex.device)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for i, o in enumerate(outs):
        g.output(f"out{i}", o)
    res = ex.run(g, **inputs)
    _last = ex.last.stats
    got = tuple(res[f"out{i}"] for i in range(len(outs)))
    return got if len(got) > 1 else got[0]


def _empty_run(*shapes):
    global _last
    _last = SimpleNamespace(dispatches=0, barriers=0, submits=0, paths=[])
    out = tuple(np.zeros(s, np.float32) for s in shapes)
    return out if len(out) > 1 else out[0]


def last_run() -> Any:
    """Stats of the last call: .dispatches, .barriers, .paths [(op, path, reason)]; None before any."""
    return _last


def hc_comb(mixes: ArrayLike, scale: ArrayLike, base: ArrayLike, *, eps: float = 1e-6, n_iter: int = 20,
            fused: bool | None = None, variant: str | None = None, device: Device | None = None) -> np.ndarray:
    """comb [T,4,4] (comb[t, src, dst]) from mixes [T,24], scale [3], base [24]."""
    mixes = _array("mixes", mixes, (None, N_MIX))
    scale = _array("scale", scale, (3,))
    base = _array("base", base, (N_MIX,))
    eps, n_iter = check_eps("eps", eps), check_n_iter(n_iter)
    hc_policy.check_override("HC_COMB", fused, variant)
    if mixes.shape[0] == 0:
        return _empty_run((0, HC, HC))
    return _run(device, {"mixes": mixes, "scale": scale, "base": base},
                lambda g, t, dev: hc.comb(g, t["mixes"], t["scale"], t["base"], eps=eps, n_iter=n_iter,
                                          fused=fused, variant=variant, device=dev))


def hc_pre(x: ArrayLike, weights: ArrayLike, *, fused: bool | None = None, device: Device | None = None) -> np.ndarray:
    """u [T,D] = Σ_s weights[t,s]·x[t,s,:] for x [T,4,D], weights [T,4]."""
    x = _array("x", x, (None, HC, None))
    weights = _array("weights", weights, (None, HC))
    T = _same("T (tokens)", ("x", x.shape[0]), ("weights", weights.shape[0]))
    D = _hidden("x", x.shape[2])
    hc_policy.check_override("HC_PRE", fused)
    if T == 0:
        return _empty_run((0, D))
    return _run(device, {"x": x, "weights": weights},
                lambda g, t, dev: hc.pre(g, t["x"], t["weights"], fused=fused, device=dev))


def hc_post(f: ArrayLike, residual: ArrayLike, post: ArrayLike, comb: ArrayLike, *, fused: bool | None = None,
            device: Device | None = None) -> np.ndarray:
    """X_new [T,4,D] = f·post[:, d] + Σ_s comb[:, s, d]·residual[:, s] for each destination d."""
    f = _array("f", f, (None, None))
    residual = _array("residual", residual, (None, HC, None))
    post = _array("post", post, (None, HC))
    comb = _array("comb", comb, (None, HC, HC))
    T = _same("T (tokens)", ("f", f.shape[0]), ("residual", residual.shape[0]), ("post", post.shape[0]),
              ("comb", comb.shape[0]))
    D = _hidden("f", _same("D (hidden size)", ("f", f.shape[1]), ("residual", residual.shape[2])))
    hc_policy.check_override("HC_POST", fused)
    if T == 0:
        return _empty_run((0, HC, D))
    return _run(device, {"f": f, "residual": residual, "post": post, "comb": comb},
                lambda g, t, dev: hc.post(g, t["f"], t["residual"], t["post"], t["comb"], fused=fused, device=dev))


def hc_site_pre(X: ArrayLike, fn: ArrayLike, scale: ArrayLike, base: ArrayLike, *, hc_eps: float = 1e-6,
                norm_eps: float = 1e-6, n_iter: int = 20, fused: bool | None = None,
                device: Device | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One site's pre side: (u [T,D], post [T,4], comb [T,4,4]) from X [T,4,D], fn [24,4D], scale, base."""
    X = _array("X", X, (None, HC, None))
    D = _hidden("X", X.shape[2])
    fn = _array("fn", fn, (N_MIX, HC * D))
    scale = _array("scale", scale, (3,))
    base = _array("base", base, (N_MIX,))
    hc_eps, norm_eps, n_iter = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps), check_n_iter(n_iter)
    hc_policy.check_override("HC_COMB", fused)
    if X.shape[0] == 0:
        return _empty_run((0, D), (0, HC), (0, HC, HC))
    return _run(device, {"X": X, "fn": fn, "scale": scale, "base": base},
                lambda g, t, dev: hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], hc_eps=hc_eps,
                                              norm_eps=norm_eps, n_iter=n_iter, fused=fused, device=dev))
