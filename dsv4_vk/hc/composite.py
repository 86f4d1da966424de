"""Hyper-connection graph functions: each appends either its fused node(s) or the unfused chain of
primitive nodes (one dispatch per node, exactly as docs/hc_math.md describes it).

    g = Graph()
    comb = hc.comb(g, mixes, scale, base)                       # [T,4,4], comb[t, src, dst]
    u = hc.pre(g, X, weights)                                   # [T,D]
    X_new = hc.post(g, f, X, post, comb)                        # [T,4,D]
    u, post, comb = hc.site_pre(g, X, fn, scale, base)          # one site's pre side
    X_new, carry = hc.site(g, X, fn, scale, base, sublayer, mix=carry, next_fn=fn_next)   # a whole site

Site path (the plan's HC_SITE, the default where the device can): `site_pre` is HC_MIX_PART + HC_SITE,
or HC_SITE alone with the partials `mix` carried from the previous site's HC_POST_MIX, so at
decode a whole site is two dispatches (HC_SITE, HC_POST_MIX) plus its sublayer. Three-op path
(`DSV4_VK_DISABLE_HC_SITE`): the mixes (HC_MIX), HC_COEFS (comb with both gates), HC_PRE, HC_POST.
`fused=None` follows the plan (`plan.plan`: environment, device and shape), True/False overrides it (True where the
device cannot is an error). Nodes are labelled with g.tag(op); g.paths gets (op, path, reason).
`device` (default: the process-wide device) is the device the graph will run on: the path depends
on it.
"""
from __future__ import annotations

import numpy as np

from ..core.graph import Graph
from ..vk import Device
from . import kernels, mix_kernels, plan as hc_plan, policy as hc_policy
from .kernels import HC, N_MIX, check_eps, check_n_iter, check_post_shapes, check_same, check_shape
from .plan import CARRY_MAX_T, PREFILL_CARRY, SITE_MAX_T, SITE_TUNING, carries, carry_splits  # noqa: F401  (re-exported)
from .policy import mix_supported
from ..core.tensor import GraphTensor
from ..vk import default_device


def variants(device):
    """{"HC_COMB": ["sg16", "rows4"] (those this device can run), "HC_PRE": ["fused"], "HC_POST": ["fused"]}."""
    return hc_policy.variants(device)


def _tensor(g, name, t):
    if not isinstance(t, GraphTensor):
        raise ValueError(f"{name} must be a GraphTensor, got {type(t).__name__}")
    if t.graph is not g:
        raise ValueError(f"{name} belongs to another graph")
    if t.dtype != "f32":
        raise ValueError(f"{name} must be f32, got {t.dtype}")
    return t


def _unit_inner(g, t):
    """t, or a contiguous copy when its last axis is strided (the fused kernels read rows)."""
    return t if t.shape[-1] == 1 or t.strides[-1] == 1 else g.op("CONT", t)


def _record(g, op, choice):
    g.record_path(op, choice.path, choice.reason)


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


def comb(g, mixes, scale, base, *, eps=1e-6, n_iter=20, fused=None, variant=None, device=None):
    """comb [T,4,4] (comb[t, src, dst]) from mixes [T,24], scale [3], base [24]."""
    for name, t in (("mixes", mixes), ("scale", scale), ("base", base)):
        _tensor(g, name, t)
    check_shape("mixes", mixes.shape, (None, N_MIX))
    check_shape("scale", scale.shape, (3,))
    check_shape("base", base.shape, (N_MIX,))
    eps, n_iter = check_eps("eps", eps), check_n_iter(n_iter)
    choice = hc_plan.plan("HC_COMB", device or default_device(), fused=fused, variant=variant)
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


def pre(g, x, weights, *, fused=None, device=None):
    """u [T,D] = Σ_s weights[t,s] · x[t,s,:] for x [T,4,D], weights [T,4]."""
    _check_pre(g, x, weights)
    choice = hc_plan.plan("HC_PRE", device or default_device(), fused=fused)
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


def post(g, f, residual, post, comb, *, fused=None, device=None):
    """X_new [T,4,D]: X_new[t,d,:] = f[t,:]·post[t,d] + Σ_s comb[t,s,d]·residual[t,s,:]."""
    post_w, comb_m = post, comb
    for name, t in (("f", f), ("residual", residual), ("post", post_w), ("comb", comb_m)):
        _tensor(g, name, t)
    check_post_shapes(f.shape, residual.shape, post_w.shape, comb_m.shape)
    choice = hc_plan.plan("HC_POST", device or default_device(), fused=fused)
    _record(g, "HC_POST", choice)
    with g.tag("HC_POST"):
        if choice.fused:
            return g.op("HC_POST", _unit_inner(g, f), _unit_inner(g, residual), post_w, comb_m)
        return post_chain(g, f, residual, post_w, comb_m)


# --- a whole site, the head collapse -------------------------------------------------------------------

def _mix_partials(g, X, fn, device):
    """partials [T,G,m+1] of the mixes of X with fn (HC_MIX_PART in the plan's layout)."""
    X, fn = _unit_inner(g, X), _unit_inner(g, fn)
    T, _, D = X.shape
    unit = 4 if kernels.vec4_ok(D, [X, fn]) else 1
    return mix_kernels.mix_partials(g, X, fn, hc_plan.plan("HC_MIX", device, T, D, chunks=D // unit).params)


def mixes(g, X, fn, *, norm_eps=1e-6, fused=None, device=None):
    """mix [T,m] = (x @ fnᵀ)·r, x = X flattened per token, r = 1/sqrt(mean(x²) + norm_eps).

    Fused (device with subgroup arithmetic): HC_MIX (one workgroup per token, one dispatch) where the tokens
    alone give the device enough workgroups, else HC_MIX_PART (D split over workgroups: decode, or
    KSPLIT's fn slices in shared memory from KSPLIT_MIN_T tokens) + HC_MIX_REDUCE. Unfused:
    RMS_NORM → MUL_MAT."""
    device = device or default_device()
    _tensor(g, "X", X)
    _tensor(g, "fn", fn)
    check_shape("X", X.shape, (None, HC, None))
    check_shape("fn", fn.shape, (None, HC * X.shape[2]))
    norm_eps = check_eps("norm_eps", norm_eps)
    return _mixes(g, X, fn, norm_eps, fused is not False and mix_supported(device) is None, device)


def _mixes(g, X, fn, norm_eps, fused, device):
    T, _, D = X.shape
    if fused and fn.shape[0] % 4 == 0 and fn.shape[0] <= N_MIX:       # the kernels' row blocks
        X, fn = _unit_inner(g, X), _unit_inner(g, fn)
        unit = 4 if kernels.vec4_ok(D, [X, fn]) else 1
        layout = hc_plan.plan("HC_MIX", device, T, D, chunks=D // unit).params
        if layout["groups"] == 1 and not layout["split"]:
            return g.op("HC_MIX", X, fn, norm_eps=norm_eps, wg=layout["wg"])
        part = mix_kernels.mix_partials(g, X, fn, layout)
        return g.op("HC_MIX_REDUCE", part, norm_eps=norm_eps, width=HC * D)
    x = (X if X.is_contiguous else g.op("CONT", X)).reshape(T, HC * D)
    return g.op("MUL_MAT", g.op("RMS_NORM", x, eps=norm_eps), fn)


def _gate(g, mix, scale1, base, a, b):
    """sigmoid(mix·scale + base)·a + b."""
    s = g.op("SIGMOID", g.op("ADD", g.op("MUL", mix, scale1), base))
    return g.op("SCALE", s, a=a, b=b)


def _check_site_args(g, X, fn, scale, base, m, n_scale, suffix=""):
    for name, t in (("X", X), ("fn" + suffix, fn), ("scale" + suffix, scale), ("base" + suffix, base)):
        _tensor(g, name, t)
    check_shape("X", X.shape, (None, HC, None))
    check_shape("fn" + suffix, fn.shape, (m, HC * X.shape[2]))
    check_shape("scale" + suffix, scale.shape, (n_scale,))
    check_shape("base" + suffix, base.shape, (m,))


def _check_carry(g, mix, X, m):
    """A carried partials tensor [T, G, m+1] (from site(..., next_fn=)) or None."""
    if mix is None:
        return None
    _tensor(g, "mix", mix)
    check_shape("mix", mix.shape, (X.shape[0], None, m + 1))
    return mix


def _site_kernels(g, X, fn, scale, base, mix, m, hc_eps, norm_eps, n_iter, device):
    """The site path's pre side: (u [T,D], coefs [T,m]) through HC_SITE (+ HC_MIX_PART unless the
    partials were carried)."""
    T, _, D = X.shape
    with g.tag("HC_MIX"):
        part = mix if mix is not None else _mix_partials(g, X, fn, device)
    with g.tag("HC_SITE"):
        coefs = g.empty((T, m))
        u = g.op("HC_SITE", part, _unit_inner(g, X), scale, base, coefs, hc_eps=hc_eps, norm_eps=norm_eps,
                 n_iter=n_iter, wg=SITE_TUNING["site_wg"] if T <= CARRY_MAX_T else None)
    return u, coefs


def _coef_views(g, coefs):
    """(pre [T,4], post [T,4], comb [T,4,4]) views of a [T,24] coefficient tensor (HC_COEFS's layout)."""
    st, sj = coefs.strides
    comb_m = GraphTensor(g, coefs.storage, (coefs.shape[0], HC, HC), (st, HC * sj, sj), coefs.offset + 2 * HC * sj)
    return coefs[:, 0:HC], coefs[:, HC:2 * HC], comb_m


def _site_choice(device, fused, site, T=1):
    """The plan of HC_SITE for a call of T tokens (fused=False: the unfused chains; site=None: the
    plan's choice, True: the site kernels, False: the three-op path)."""
    return hc_plan.plan("HC_SITE", device, T, fused=fused, site=site)


def site_pre(g, X, fn, scale, base, *, hc_eps=1e-6, norm_eps=1e-6, n_iter=20, fused=None, site=None, device=None,
             mix=None):
    """One site's pre side: (u [T,D], post [T,4], comb [T,4,4]) from the streams X [T,4,D].

    Site path (the plan's HC_SITE): HC_MIX_PART (unless `mix`, the partials carried from the
    previous site's post, is given) then HC_SITE: two dispatches, one with `mix`. Three-op path:
    the mixes (`mixes`, or HC_MIX_REDUCE of `mix`), HC_COEFS (comb and both gates: post and comb
    are then strided views of its [T,24] output), HC_PRE. Unfused: every op as its primitive chain
    (`mix` ignored).
    `fused` as for the three ops (False: the unfused chains); `site`: None (policy), True (force the
    site kernels), False (the three-op path)."""
    _check_site_args(g, X, fn, scale, base, N_MIX, 3)
    hc_eps, norm_eps, n_iter = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps), check_n_iter(n_iter)
    device = device or default_device()
    mix = _check_carry(g, mix, X, N_MIX)
    site_choice = _site_choice(device, fused, site, X.shape[0])
    _record(g, "HC_SITE", site_choice)
    if site_choice.fused:
        u, coefs = _site_kernels(g, X, fn, scale, base, mix, N_MIX, hc_eps, norm_eps, n_iter, device)
        _, post_w, comb_m = _coef_views(g, coefs)
        return u, post_w, comb_m
    return _three_op_pre(g, X, fn, scale, base, hc_eps, norm_eps, n_iter, fused, device, mix)


def _carried_or_mixes(g, X, fn, norm_eps, fused, device, carry):
    """The mixes [T,m]: HC_MIX_REDUCE of the carried partials where given (fused), else `_mixes`."""
    if carry is not None and fused:
        return g.op("HC_MIX_REDUCE", carry, norm_eps=norm_eps, width=HC * X.shape[2])
    return _mixes(g, X, fn, norm_eps, fused, device)


def _three_op_pre(g, X, fn, scale, base, hc_eps, norm_eps, n_iter, fused, device, carry=None):
    comb_choice = hc_plan.plan("HC_COMB", device, fused=fused)
    with g.tag("HC_MIX"):
        mix = _carried_or_mixes(g, X, fn, norm_eps, comb_choice.fused and mix_supported(device) is None, device,
                                carry)
    if comb_choice.fused:
        # site fusion: the comb kernel also writes the pre/post gates (HC_COEFS, one dispatch for nine)
        _record(g, "HC_COMB", hc_policy.Choice(True, comb_choice.variant, comb_choice.reason + "; HC_COEFS: "
                                               "comb with the site's pre/post gates"))
        with g.tag("HC_COMB"):
            coefs = g.op("HC_COEFS", mix, scale, base, eps=hc_eps, n_iter=n_iter, variant=comb_choice.variant)
        pre_w, post_w, comb_m = _coef_views(g, coefs)
    else:
        with g.tag("HC_MIX"):
            pre_w = _gate(g, mix[:, 0:HC], scale[0:1], base[0:HC], 1.0, hc_eps)
            post_w = _gate(g, mix[:, HC:2 * HC], scale[1:2], base[HC:2 * HC], 2.0, 0.0)
        _record(g, "HC_COMB", comb_choice)
        with g.tag("HC_COMB"):
            comb_m = comb_chain(g, mix, scale, base, hc_eps, n_iter)
    pre_choice = hc_plan.plan("HC_PRE", device, fused=fused)
    if comb_choice.fused and pre_choice.fused:
        # the collapse forms its own gates from the mixes (HC_PRE_GATE): it does not read HC_COEFS's
        # output, so no barrier separates the two and they run side by side
        _record(g, "HC_PRE", hc_policy.Choice(True, pre_choice.variant, pre_choice.reason + "; HC_PRE_GATE: the "
                                              "pre gates from the mixes, beside HC_COEFS"))
        with g.tag("HC_PRE"):
            u = g.op("HC_PRE_GATE", _unit_inner(g, X), mix[:, 0:HC], scale[0:1], base[0:HC], eps=hc_eps)
        return u, post_w, comb_m
    u = pre(g, X, pre_w, fused=fused, device=device)
    return u, post_w, comb_m


def site(g, X, fn, scale, base, sublayer, *, mix=None, next_fn=None, hc_eps=1e-6, norm_eps=1e-6, n_iter=20,
         fused=None, site=None, device=None):
    """A whole site: u, post, comb = site_pre(X); f = sublayer(u); X_new = post(f, X, post, comb).
    Returns (X_new [T,4,D], carry).

    `sublayer(u)` appends the sublayer's nodes (norm, attention or MoE) and returns f [T,D].
    `next_fn` (the next site's fn [24,4D], or the head's fn_h [4,4D]): on the site path at
    T ≤ CARRY_MAX_T, HC_POST_MIX writes X_new and the next site's mixes partials in the same pass;
    `carry` is then those partials ([T,G,m+1]) to pass as the next site's (or head_pre's) `mix=`,
    else None. A model's decode step is then two dispatches per site plus its sublayers:

        carry = None
        for i, (fn, scale, base, sub) in enumerate(sites):
            X, carry = hc.site(g, X, fn, scale, base, sub, mix=carry, next_fn=next_fns[i])
        h = hc.head_pre(g, X, fn_h, scale_h, base_h, mix=carry)
    """
    device = device or default_device()
    u, post_w, comb_m = site_pre(g, X, fn, scale, base, hc_eps=hc_eps, norm_eps=norm_eps, n_iter=n_iter,
                                 fused=fused, site=site, device=device, mix=mix)
    f = sublayer(u)
    _tensor(g, "sublayer output", f)
    check_shape("sublayer output", f.shape, (X.shape[0], X.shape[2]))
    return site_post(g, f, X, post_w, comb_m, next_fn=next_fn, fused=fused, site=site, device=device)


def site_post(g, f, X, post_w, comb_m, *, next_fn=None, fused=None, site=None, device=None):
    """The second half of `site`: X_new = post(f, X, post, comb); returns (X_new, carry). On the site
    path at T ≤ CARRY_MAX_T with `next_fn`: HC_POST_MIX, carry = the next site's mixes partials."""
    device = device or default_device()
    if next_fn is not None:
        _tensor(g, "next_fn", next_fn)
        D = X.shape[-1]
        if next_fn.ndim != 2 or next_fn.shape[0] not in (N_MIX, HC) or next_fn.shape[1] != HC * D:
            raise ValueError(f"next_fn must be a site's fn [24, {HC * D}] or the head's [4, {HC * D}], "
                             f"got {list(next_fn.shape)}")
    if next_fn is None or not carries(device, fused, X.shape[0], X.shape[2], site):
        return post(g, f, X, post_w, comb_m, fused=fused, device=device), None
    for name, t in (("f", f), ("residual", X), ("post", post_w), ("comb", comb_m)):
        _tensor(g, name, t)
    check_post_shapes(f.shape, X.shape, post_w.shape, comb_m.shape)
    with g.tag("HC_POST"):
        f, X_in, next_fn = _unit_inner(g, f), _unit_inner(g, X), _unit_inner(g, next_fn)
        T, D = f.shape
        unit = 4 if kernels.vec4_ok(D, [f, X_in, next_fn]) else 1
        layout = hc_plan.plan("HC_POST_MIX", device, T, D, chunks=D // unit, fused=fused, site=site).params
        out = g.empty(X.shape)
        carry = g.op("HC_POST_MIX", f, X_in, post_w, comb_m, next_fn, out, **layout)
    return out, carry


def head_pre(g, X, fn_h, scale_h, base_h, *, hc_eps=1e-6, norm_eps=1e-6, fused=None, site=None, device=None,
             mix=None):
    """Head collapse: Σ_s pre_h[t,s]·X[t,s,:], pre_h = sigmoid(mix_h·scale_h[0] + base_h) + hc_eps.
    Site path: HC_SITE with m = 4 (one dispatch with `mix`, the partials carried from the last
    site's post; else HC_MIX_PART first)."""
    _check_site_args(g, X, fn_h, scale_h, base_h, HC, 1, "_h")
    hc_eps, norm_eps = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps)
    device = device or default_device()
    mix = _check_carry(g, mix, X, HC)
    site_choice = _site_choice(device, fused, site, X.shape[0])
    _record(g, "HC_SITE", site_choice)
    if site_choice.fused:
        u, _ = _site_kernels(g, X, fn_h, scale_h, base_h, mix, HC, hc_eps, norm_eps, 1, device)
        return u
    pre_choice = hc_plan.plan("HC_PRE", device, fused=fused)
    with g.tag("HC_MIX"):
        m = _carried_or_mixes(g, X, fn_h, norm_eps, pre_choice.fused and mix_supported(device) is None, device, mix)
        pre_h = _gate(g, m, scale_h, base_h, 1.0, hc_eps)
    return pre(g, X, pre_h, fused=fused, device=device)
