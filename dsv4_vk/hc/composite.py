"""Hyper-connection graph functions: each appends either its fused node(s) or the unfused chain of
primitive nodes (one dispatch per node, exactly as shared/spec/HC_OPS.md describes it).

    g = Graph()
    comb = hc.comb(g, mixes, scale, base)                       # [T,4,4], comb[t, src, dst]
    u = hc.pre(g, X, weights)                                   # [T,D]
    X_new = hc.post(g, f, X, post, comb)                        # [T,4,D]
    u, post, comb = hc.site_pre(g, X, fn, scale, base)          # one site's pre side

`site_pre` with a fused HC_COMB fuses the whole pre side into three dispatches (HC_MIX, HC_COEFS,
HC_PRE). `fused=None` follows hc_policy (environment and device), True/False overrides it (True where the
device cannot is an error). Nodes are labelled with g.tag(op); g.paths gets (op, path, reason).
`device` (default: the process-wide device) is the device the graph will run on: the path depends
on it.
"""
from __future__ import annotations

from ..core.graph import Graph
from ..vk import Device
from . import policy as hc_policy
from .kernels import HC, N_MIX, check_eps, check_n_iter, check_post_shapes, check_same, check_shape, mix_supported
from ..core.tensor import Tensor
from ..vk import default_device


def variants(device):
    """{"HC_COMB": ["sg16", "rows4"] (those this device can run), "HC_PRE": ["fused"], "HC_POST": ["fused"]}."""
    return hc_policy.variants(device)


def _tensor(g, name, t):
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a graph Tensor, got {type(t).__name__}")
    if t.graph is not g:
        raise ValueError(f"{name} belongs to another graph")
    if t.dtype != "f32":
        raise ValueError(f"{name} must be f32, got {t.dtype}")
    return t


def _unit_inner(g, t):
    """t, or a contiguous copy when its last axis is strided (the fused kernels read rows)."""
    return t if t.shape[-1] == 1 or t.strides[-1] == 1 else g.op("CONT", t)


def _record(g, op, choice):
    g.paths.append((op, choice.path, choice.reason))


# --- HC_COMB -----------------------------------------------------------------------------------------

def _normalise(g, c, eps, axis):
    """c / (Σ over `axis` + eps): rows (over dst, 3 nodes) or columns (over src, 4 nodes)."""
    T = c.shape[0]
    if axis == "rows":
        s = g.op("SUM_ROWS", c)                                    # [T,src,1]
        return g.op("DIV", c, g.op("SCALE", s, a=1.0, b=eps))
    s = g.op("SUM_ROWS", g.op("CONT", c.transpose(-2, -1)))        # [T,dst,1]
    s = g.op("SCALE", s, a=1.0, b=eps)
    return g.op("DIV", c, s.reshape(T, 1, HC))


def comb_chain(g, mixes, scale, base, eps, n_iter):
    """The unfused HC_COMB chain: 4 + 4 + 7·(n_iter−1) primitive nodes."""
    T = mixes.shape[0]
    logits = g.op("ADD", g.op("MUL", mixes[:, 8:N_MIX], scale[2:3]), base[8:N_MIX])
    c = g.op("SOFT_MAX", logits.reshape(T, HC, HC))                # over dst
    c = g.op("SCALE", c, a=1.0, b=eps)
    c = _normalise(g, c, eps, "columns")
    for _ in range(n_iter - 1):
        c = _normalise(g, c, eps, "rows")
        c = _normalise(g, c, eps, "columns")
    return c


def comb(g: Graph, mixes: Tensor, scale: Tensor, base: Tensor, *, eps: float = 1e-6, n_iter: int = 20,
         fused: bool | None = None, variant: str | None = None, device: Device | None = None) -> Tensor:
    """comb [T,4,4] (comb[t, src, dst]) from mixes [T,24], scale [3], base [24]."""
    for name, t in (("mixes", mixes), ("scale", scale), ("base", base)):
        _tensor(g, name, t)
    check_shape("mixes", mixes.shape, (None, N_MIX))
    check_shape("scale", scale.shape, (3,))
    check_shape("base", base.shape, (N_MIX,))
    eps, n_iter = check_eps("eps", eps), check_n_iter(n_iter)
    choice = hc_policy.choose("HC_COMB", device or default_device(), fused, variant)
    _record(g, "HC_COMB", choice)
    with g.tag("HC_COMB"):
        if choice.fused:
            return g.op("HC_COMB", mixes, scale, base, eps=eps, n_iter=n_iter, variant=choice.variant)
        return comb_chain(g, mixes, scale, base, eps, n_iter)


# --- HC_PRE ------------------------------------------------------------------------------------------

def _check_pre(g, x, weights):
    _tensor(g, "x", x)
    _tensor(g, "weights", weights)
    check_shape("x", x.shape, (None, HC, None))
    check_shape("weights", weights.shape, (None, HC))
    check_same("x", x.shape[0], "weights", weights.shape[0], "T (tokens)")


def pre_chain(g, x, weights):
    """Σ_s weights[:, s]·x[:, s, :] as 4 MUL + 3 ADD nodes."""
    acc = g.op("MUL", x[:, 0, :], weights[:, 0:1])
    for s in range(1, HC):
        acc = g.op("ADD", acc, g.op("MUL", x[:, s, :], weights[:, s:s + 1]))
    return acc


def pre(g: Graph, x: Tensor, weights: Tensor, *, fused: bool | None = None, device: Device | None = None) -> Tensor:
    """u [T,D] = Σ_s weights[t,s] · x[t,s,:] for x [T,4,D], weights [T,4]."""
    _check_pre(g, x, weights)
    choice = hc_policy.choose("HC_PRE", device or default_device(), fused)
    _record(g, "HC_PRE", choice)
    with g.tag("HC_PRE"):
        if choice.fused:
            return g.op("HC_PRE", _unit_inner(g, x), weights)
        return pre_chain(g, x, weights)


# --- HC_POST -----------------------------------------------------------------------------------------

def post_chain(g, f, residual, post_w, comb_m):
    """Per destination d: f·post[:, d] + Σ_s residual[:, s]·comb[:, s, d] (9 nodes), then CONCAT."""
    T, D = f.shape
    outs = []
    for d in range(HC):
        acc = g.op("MUL", f, post_w[:, d:d + 1])
        for s in range(HC):
            acc = g.op("ADD", acc, g.op("MUL", residual[:, s, :], comb_m[:, s, d:d + 1]))
        outs.append(acc.reshape(T, 1, D))
    return g.op("CONCAT", *outs, axis=1)


def post(g: Graph, f: Tensor, residual: Tensor, post: Tensor, comb: Tensor, *, fused: bool | None = None,
         device: Device | None = None) -> Tensor:
    """X_new [T,4,D]: X_new[t,d,:] = f[t,:]·post[t,d] + Σ_s comb[t,s,d]·residual[t,s,:]."""
    post_w, comb_m = post, comb
    for name, t in (("f", f), ("residual", residual), ("post", post_w), ("comb", comb_m)):
        _tensor(g, name, t)
    check_post_shapes(f.shape, residual.shape, post_w.shape, comb_m.shape)
    choice = hc_policy.choose("HC_POST", device or default_device(), fused)
    _record(g, "HC_POST", choice)
    with g.tag("HC_POST"):
        if choice.fused:
            return g.op("HC_POST", _unit_inner(g, f), _unit_inner(g, residual), post_w, comb_m)
        return post_chain(g, f, residual, post_w, comb_m)


# --- a whole site, the head collapse -------------------------------------------------------------------

# HC_MIX (one workgroup per token and mix row) up to this T, RMS_NORM + MUL_MAT beyond. On GPUs
# HC_MIX wins at every T measured (H200, results/h200/history/hc_gpu_check: 1.8x at T=4096 to 37x at T=1);
# on CPU devices its shared-memory step is slow, so only decode-sized T use it there.
MIX_MAX_T = {"cpu": 8}


def mix_max_t(device):
    return MIX_MAX_T.get(device.caps.type, 1 << 31)


def _flat_rms_mixes(g, X, fn, norm_eps, fused, device):
    """mix [T,m] = (x @ fnᵀ)·r, x = X flattened per token, r = 1/sqrt(mean(x²) + norm_eps): one HC_MIX
    dispatch (fused, decode-sized T, device with subgroup arithmetic) or RMS_NORM → MUL_MAT."""
    T, _, D = X.shape
    if fused and T <= mix_max_t(device) and mix_supported(device) is None:
        return g.op("HC_MIX", _unit_inner(g, X), _unit_inner(g, fn), norm_eps=norm_eps)
    x = (X if X.is_contiguous else g.op("CONT", X)).reshape(T, HC * D)
    return g.op("MUL_MAT", g.op("RMS_NORM", x, eps=norm_eps), fn)


def _gate(g, mix, scale1, base, a, b):
    """sigmoid(mix·scale + base)·a + b."""
    s = g.op("SIGMOID", g.op("ADD", g.op("MUL", mix, scale1), base))
    return g.op("SCALE", s, a=a, b=b)


def site_pre(g: Graph, X: Tensor, fn: Tensor, scale: Tensor, base: Tensor, *, hc_eps: float = 1e-6,
             norm_eps: float = 1e-6, n_iter: int = 20, fused: bool | None = None,
             device: Device | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One site's pre side: (u [T,D], post [T,4], comb [T,4,4]) from the streams X [T,4,D].

    With a fused HC_COMB the site is fused as a whole: HC_MIX (T ≤ mix_max_t(device); else RMS_NORM → MUL_MAT),
    HC_COEFS (comb and both gates: post and comb are then strided views of its [T,24] output), HC_PRE."""
    for name, t in (("X", X), ("fn", fn), ("scale", scale), ("base", base)):
        _tensor(g, name, t)
    check_shape("X", X.shape, (None, HC, None))
    check_shape("fn", fn.shape, (N_MIX, HC * X.shape[2]))
    check_shape("scale", scale.shape, (3,))
    check_shape("base", base.shape, (N_MIX,))
    hc_eps, norm_eps, n_iter = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps), check_n_iter(n_iter)
    device = device or default_device()
    comb_choice = hc_policy.choose("HC_COMB", device, fused)
    with g.tag("HC_MIX"):
        mix = _flat_rms_mixes(g, X, fn, norm_eps, comb_choice.fused, device)
    if comb_choice.fused:
        # site fusion: the comb kernel also writes the pre/post gates (HC_COEFS, one dispatch for nine)
        _record(g, "HC_COMB", hc_policy.Choice(True, comb_choice.variant, comb_choice.reason + "; HC_COEFS: "
                                               "comb with the site's pre/post gates"))
        with g.tag("HC_COMB"):
            coefs = g.op("HC_COEFS", mix, scale, base, eps=hc_eps, n_iter=n_iter, variant=comb_choice.variant)
        pre_w, post_w = coefs[:, 0:HC], coefs[:, HC:2 * HC]
        st, sj = coefs.strides
        comb_m = Tensor(g, coefs.storage, (coefs.shape[0], HC, HC), (st, HC * sj, sj), coefs.offset + 2 * HC * sj)
    else:
        with g.tag("HC_MIX"):
            pre_w = _gate(g, mix[:, 0:HC], scale[0:1], base[0:HC], 1.0, hc_eps)
            post_w = _gate(g, mix[:, HC:2 * HC], scale[1:2], base[HC:2 * HC], 2.0, 0.0)
        _record(g, "HC_COMB", comb_choice)
        with g.tag("HC_COMB"):
            comb_m = comb_chain(g, mix, scale, base, hc_eps, n_iter)
    u = pre(g, X, pre_w, fused=fused, device=device)
    return u, post_w, comb_m


def head_pre(g: Graph, X: Tensor, fn_h: Tensor, scale_h: Tensor, base_h: Tensor, *, hc_eps: float = 1e-6,
             norm_eps: float = 1e-6, fused: bool | None = None, device: Device | None = None) -> Tensor:
    """Head collapse: Σ_s pre_h[t,s]·X[t,s,:], pre_h = sigmoid(mix_h·scale_h[0] + base_h) + hc_eps."""
    for name, t in (("X", X), ("fn_h", fn_h), ("scale_h", scale_h), ("base_h", base_h)):
        _tensor(g, name, t)
    check_shape("X", X.shape, (None, HC, None))
    check_shape("fn_h", fn_h.shape, (HC, HC * X.shape[2]))
    check_shape("scale_h", scale_h.shape, (1,))
    check_shape("base_h", base_h.shape, (HC,))
    hc_eps, norm_eps = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps)
    device = device or default_device()
    pre_choice = hc_policy.choose("HC_PRE", device, fused)
    with g.tag("HC_MIX"):
        mix = _flat_rms_mixes(g, X, fn_h, norm_eps, pre_choice.fused, device)
        pre_h = _gate(g, mix, scale_h, base_h, 1.0, hc_eps)
    return pre(g, X, pre_h, fused=fused, device=device)
