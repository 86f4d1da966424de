"""Fused DeepSeek-V4 hyper-connection ops HC_COMB / HC_COEFS, HC_PRE, HC_POST and the whole-site
HC_SITE, the float64 references of every HC op, and the checks and helpers the HC ops share. The
mixes ops (HC_MIX, HC_MIX_PART, HC_MIX_REDUCE, HC_POST_MIX) and their kernels' layouts:
`mix_kernels`.

Math and layouts: docs/hc_math.md. comb[t, src, dst]: the destination is the column.
The graph functions in `dsv4_vk.hc` choose between these fused nodes and the unfused chain.
"""
import math

import numpy as np

from ..core.tuning import knob_table
from .policy import (COMB_VARIANTS, HCUnsupported, comb_support, full_subgroups_for, required_subgroup_size,
                     sg16_subgroup_size, site_supported)
from ..ops.base import Launch, OpDef, check_params, check_shape, grid_1d, register, view_fields

HC = 4            # streams
N_MIX = 24        # (2 + HC) · HC mixes: pre 0..3, post 4..7, comb 8..23
ROWS4_WORKGROUP = 64


# --- float64 references ----------------------------------------------------------------------------

def as_f64(a):
    return np.asarray(a, np.float64)


def reference_comb(mixes, scale, base, eps=1e-6, n_iter=20):
    """comb [T,4,4] = Sinkhorn(softmax over dst + eps): 1 column norm, then n_iter−1 × (rows, columns)."""
    m, scale, base = as_f64(mixes), as_f64(scale), as_f64(base)
    logits = (m[:, 8:24] * scale[2] + base[8:24]).reshape(-1, HC, HC)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        c = e / e.sum(axis=-1, keepdims=True) + eps
        c = c / (c.sum(axis=-2, keepdims=True) + eps)
        for _ in range(int(n_iter) - 1):
            c = c / (c.sum(axis=-1, keepdims=True) + eps)
            c = c / (c.sum(axis=-2, keepdims=True) + eps)
    return c


def reference_pre(x, w):
    """u [T,D] = Σ_s w[t,s] · x[t,s,:]."""
    return np.einsum("ts,tsd->td", as_f64(w), as_f64(x))


def reference_post(f, residual, post, comb):
    """out [T,4,D]: out[t,d,:] = f[t,:]·post[t,d] + Σ_s comb[t,s,d] · residual[t,s,:]."""
    f, residual, post, comb = as_f64(f), as_f64(residual), as_f64(post), as_f64(comb)
    return f[:, None, :] * post[:, :, None] + np.einsum("tsd,tsh->tdh", comb, residual)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference_mixes(X, fn, norm_eps=1e-6):
    """mix [T,m] = (x @ fnᵀ) · r with x = X flattened per token, r = 1/sqrt(mean(x²) + norm_eps)."""
    X, fn = as_f64(X), as_f64(fn)
    x = X.reshape(X.shape[0], -1)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + norm_eps)
    return (x @ fn.T) * r


def reference_mix_partials(X, fn, groups, chunk=1, split=None):
    """partials [T,G,m+1]: per split of D (chunks of `chunk` floats, `split` or else ceil(chunks/G)
    per split), the dot products with fn over the 4 streams' slices and Σx² (hc_mix_token.comp's layout)."""
    X, fn = as_f64(X), as_f64(fn)
    T, _, D = X.shape
    m = fn.shape[0]
    chunks = D // chunk
    per = (split or -(-chunks // groups)) * chunk
    f = fn.reshape(m, HC, D)
    out = np.zeros((T, groups, m + 1))
    for s in range(groups):
        xs, fs = X[:, :, s * per:(s + 1) * per], f[:, :, s * per:(s + 1) * per]
        out[:, s, :m] = np.einsum("tcd,jcd->tj", xs, fs)
        out[:, s, m] = (xs * xs).sum(axis=(1, 2))
    return out


def reference_site_coefs(X, fn, scale, base, hc_eps=1e-6, norm_eps=1e-6, n_iter=20):
    """One site's coefficients: (pre [T,4], post [T,4], comb [T,4,4])."""
    scale, base = as_f64(scale), as_f64(base)
    mix = reference_mixes(X, fn, norm_eps)
    pre = _sigmoid(mix[:, 0:4] * scale[0] + base[0:4]) + hc_eps
    post = 2.0 * _sigmoid(mix[:, 4:8] * scale[1] + base[4:8])
    return pre, post, reference_comb(mix, scale, base, hc_eps, n_iter)


def reference_site_pre(X, fn, scale, base, hc_eps=1e-6, norm_eps=1e-6, n_iter=20):
    """One site's pre side: (u [T,D], post [T,4], comb [T,4,4])."""
    pre, post, comb = reference_site_coefs(X, fn, scale, base, hc_eps, norm_eps, n_iter)
    return reference_pre(X, pre), post, comb


def reference_head_weights(X, fn_h, scale_h, base_h, hc_eps=1e-6, norm_eps=1e-6):
    """pre_h [T,4] = sigmoid(mix_h·scale_h[0] + base_h) + hc_eps."""
    return _sigmoid(reference_mixes(X, fn_h, norm_eps) * as_f64(scale_h)[0] + as_f64(base_h)) + hc_eps


def reference_head_pre(X, fn_h, scale_h, base_h, hc_eps=1e-6, norm_eps=1e-6):
    """Head collapse: Σ_s pre_h[t,s] · X[t,s,:]."""
    return reference_pre(X, reference_head_weights(X, fn_h, scale_h, base_h, hc_eps, norm_eps))


def magnitude(reference, *args):
    """Σ|term| of a linear combination's float64 reference: the same reference on |args|. Errors of
    a sum that cancels are measured against this scale, not against the (small) result."""
    return reference(*(np.abs(as_f64(a)) for a in args))


# --- validation shared by the op declarations and the graph functions ------------------------------------

def check_same(name_a, a, name_b, b, what):
    if a != b:
        raise ValueError(f"{what} disagrees between {name_a} ({a}) and {name_b} ({b})")


F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).smallest_subnormal)


def check_eps(name, value):
    """An eps as the kernels take it: a number > 0 that float32 holds (neither 0 nor inf once rounded)."""
    if value.__class__ is float and F32_TINY <= value <= F32_MAX:      # the usual case, checked per call
        return value
    wrong = ValueError(f"{name} must be a finite number > 0 that float32 holds ({F32_TINY:.3g} to {F32_MAX:.6g}), "
                       f"got {value!r}")
    if isinstance(value, (bool, str, bytes)):
        raise wrong
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise wrong from None
    if not math.isfinite(v) or v <= 0 or v > F32_MAX or np.float32(v) == 0:
        raise wrong
    return v


def require_support(op, device, why):
    """HCUnsupported naming the op, the device and why, unless why is None (the device can run it)."""
    if why is not None:
        raise HCUnsupported(f"{op} cannot run on {device.name}: {why}")


# Sinkhorn iterations accepted: DeepSeek-V4 runs 20; the unfused chain records 7 nodes an iteration,
# so an unbounded count would grow its graph (and the time to record it) without limit.
MAX_N_ITER = 1000


def check_n_iter(value):
    if value.__class__ is int and 1 <= value <= MAX_N_ITER:        # the usual case, checked per call
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_N_ITER:
        raise ValueError(f"n_iter must be an integer ≥ 1 and at most {MAX_N_ITER} (Sinkhorn iterations), "
                         f"got {value!r}")
    return int(value)


# --- kernels ---------------------------------------------------------------------------------------------

def check_unit_inner(op, name, t):
    if t.shape[-1] != 1 and t.strides[-1] != 1:
        raise ValueError(f"{op}: {name} must have unit stride along its last axis (use CONT), "
                         f"got strides {t.strides}")


SLICE_TUNING = knob_table(   # HC_PRE / HC_POST / HC_SITE layout (tools/hc_tune.py sweeps it)
    "slice",
    wg=(None, "workgroup size (None: the chunks rounded up to a power of two, 32 to 256)"),
    cpt=(1, "chunks of 4 channels an invocation"))


def _slice_launch_layout(D, tensors, wg=None):
    """(vec4?, chunks per token, workgroup size, groups per token, chunks per invocation) of the
    PRE/POST kernels (and HC_SITE's; `wg` overrides the workgroup size)."""
    vec4 = D % 4 == 0 and all(t.offset % 4 == 0 and all(s % 4 == 0 for s in t.strides[:-1]) for t in tensors)
    chunks = D // 4 if vec4 else D
    cpt = SLICE_TUNING["cpt"]
    wg = wg or SLICE_TUNING["wg"] or min(256, max(32, 1 << (chunks - 1).bit_length()))
    return vec4, chunks, wg, -(-chunks // (wg * cpt)), cpt


def strides_in(t, unit):
    return [s // unit for s in t.strides[:-1]]


def mix_fields(T, chunks, slice_, G, inv_k, norm_eps, x, f, o, tb):
    """The push fields the mixes kernels (hc_mix_*.comp) share: sizes, then the views x (X: offset,
    token and stream strides), f (fn: offset, row stride) and o (the partials: offset, token and
    split strides), and tb."""
    return {"T": T, "chunks": chunks, "slice": slice_, "G": G, "inv_k": inv_k, "norm_eps": norm_eps,
            **view_fields("x", x[0], x[1:], ("st", "ss")), **view_fields("f", f[0], f[1:], ("sj",)),
            **view_fields("o", o[0], o[1:], ("st", "s2")), "tb": tb}


@register
class HcComb(OpDef):
    """HC_COMB(mixes [T,24], scale [3], base [24], eps=, n_iter=, variant="sg16"|"rows4") -> [T,4,4]."""
    name, n_inputs = "HC_COMB", 3

    def infer(self, inputs, params):
        mixes, scale, base = inputs
        check_shape("mixes", mixes.shape, (None, N_MIX))
        check_shape("scale", scale.shape, (3,))
        check_shape("base", base.shape, (N_MIX,))
        check_eps("eps", params.get("eps", 1e-6))
        check_n_iter(params.get("n_iter", 20))
        if params.get("variant") not in COMB_VARIANTS:
            raise ValueError(f"{self.name}: variant must be one of {', '.join(COMB_VARIANTS)}, "
                             f"got {params.get('variant')!r}")
        return (mixes.shape[0], HC, HC), "f32"

    def out_layout(self, out):
        """The output's push fields: comb offset and token/src/dst strides, gates offset and stride."""
        return {**view_fields("c", out.offset, out.strides, ("st", "ss", "sd")), "g_off": 0, "g_sj": 0}

    def lower(self, node, device):
        mixes, scale, base = node.inputs
        out = node.output
        variant = node.params["variant"]
        require_support(f"{self.name} variant {variant}", device, comb_support(device)[variant])
        T = mixes.shape[0]
        push = {"T": T, "n_iter": check_n_iter(node.params.get("n_iter", 20)), "eps": float(node.params.get("eps", 1e-6)),
                **view_fields("m", mixes.offset, mixes.strides, ("st", "sj")), **view_fields("s", scale.offset, scale.strides, ("s",)),
                **view_fields("b", base.offset, base.strides, ("s",)), **self.out_layout(out)}
        defines = {"COEFS": 1} if self.name == "HC_COEFS" else {}
        if variant == "sg16":
            size = sg16_subgroup_size(device)
            wg = 4 * size
            return [Launch("hc_comb", [mixes, scale, base, out], (3,), push, grid_1d(T, wg // 16),
                           defines={"SG16": 1, **defines}, spec=(wg,),
                           subgroup_size=required_subgroup_size(device, size), full_subgroups=True)]
        full = device.caps.subgroup.full_subgroups
        return [Launch("hc_comb", [mixes, scale, base, out], (3,), push, grid_1d(T, ROWS4_WORKGROUP // 4),
                       defines={"ROWS4": 1, **defines}, spec=(ROWS4_WORKGROUP,), full_subgroups=full)]

    def reference(self, mixes, scale, base, eps=1e-6, n_iter=20, variant=None):
        return reference_comb(mixes, scale, base, eps, n_iter)


def reference_coefs(mixes, scale, base, eps=1e-6, n_iter=20):
    """coefs [T,24] laid out like the mixes: pre gates (+eps) | post gates (×2) | comb flattened."""
    m, scale, base = as_f64(mixes), as_f64(scale), as_f64(base)
    pre = _sigmoid(m[:, 0:4] * scale[0] + base[0:4]) + eps
    post = 2.0 * _sigmoid(m[:, 4:8] * scale[1] + base[4:8])
    comb = reference_comb(m, scale, base, eps, n_iter).reshape(-1, HC * HC)
    return np.concatenate([pre, post, comb], axis=1)


@register
class HcCoefs(HcComb):
    """HC_COEFS(mixes, scale, base, eps=, n_iter=, variant=) -> coefs [T,24]: HC_COMB plus the pre/post
    gates of the site, in the mixes' layout (whole-site fusion: one dispatch instead of nine)."""
    name = "HC_COEFS"

    def infer(self, inputs, params):
        shape, dtype = super().infer(inputs, params)
        return (shape[0], N_MIX), dtype

    def out_layout(self, out):
        st, sj = out.strides
        return {**view_fields("c", out.offset + 8 * sj, (st, HC * sj, sj), ("st", "ss", "sd")),
                **view_fields("g", out.offset, (sj,), ("sj",))}

    def reference(self, mixes, scale, base, eps=1e-6, n_iter=20, variant=None):
        return reference_coefs(mixes, scale, base, eps, n_iter)


def vec4_ok(D, tensors):
    """Chunks of 4 floats: D, every offset and every stride but the (unit) last one multiples of 4."""
    return D % 4 == 0 and all(t.offset % 4 == 0 and all(s % 4 == 0 for s in t.strides[:-1]) for t in tensors)


WG_REDUCE_MAX = 256   # wg_reduce.glsl's shared step holds 64 subgroups of ≥ 4 lanes


def check_shared(device, op, wg, values):
    """ValueError unless a workgroup of `wg` fits wg_reduce.glsl's fixed shared step (≤ 256
    invocations, ≤ 25 values); HCUnsupported if the step (64 × 25 floats) exceeds the device's shared
    memory — a pipeline past it can lose the device (seen on the H200)."""
    if wg > WG_REDUCE_MAX or values > N_MIX + 1:
        raise ValueError(f"{op}: workgroup {wg} with {values} sums exceeds the shared reduction step "
                         f"({WG_REDUCE_MAX} invocations, {N_MIX + 1} sums)")
    need = 64 * (N_MIX + 1) * 4
    have = device.caps.limits.max_shared_memory
    if need > have:
        raise HCUnsupported(f"{op}: the reduction step needs {need} B of shared memory, {device.name} has {have} B")


def check_fn_rows(op, name, fn):
    """The mixes kernels take fn rows in blocks of 4 (hc_mixacc.glsl), at most a site's 24."""
    if fn.shape[0] % 4 or fn.shape[0] > N_MIX:
        raise ValueError(f"{op}: {name} must have a multiple of 4 rows, at most {N_MIX} (a site's 24, the head's 4), "
                         f"got {fn.shape[0]}")


def check_partials(op, part):
    """Partials [T, G, m+1] are read and written with their m+1 entries adjacent."""
    if part.strides[2] != 1:
        raise ValueError(f"{op}: the partials' entries must be contiguous, got strides {part.strides}")


def check_layout_param(op, params, name):
    v = params.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{op}: {name} must be an integer ≥ 1, got {v!r}")
    return int(v)


def _site_m(part, scale, base):
    """m of a site (24: pre, post, comb) or of the head collapse (4: pre only), from the partials."""
    m = part.shape[2] - 1
    if m not in (N_MIX, HC):
        raise ValueError(f"HC_SITE: partials must be [T, G, 25] (a site) or [T, G, 5] (the head), got {part.shape}")
    check_shape("scale", scale.shape, (3 if m == N_MIX else 1,))
    check_shape("base", base.shape, (m,))
    return m


@register
class HcSiteOp(OpDef):
    """HC_SITE(partials [T,G,m+1], X [T,4,D], scale, base, coefs [T,m], hc_eps=, norm_eps=, n_iter=[, wg=])
    -> u [T,D].

    The rest of a site's pre side from its mixes' partial sums (hc_site.comp): mixes, gates,
    Sinkhorn, the pre collapse u. Also writes its argument `coefs` (an empty tensor the graph
    function made: written_inputs): m = 24, a site: pre | post | comb (HC_COEFS's layout); m = 4, the
    head collapse: its 4 pre gates. wg: the workgroup size (a multiple of 4 from 4 to 256: the
    Sinkhorn's four lanes, the shared reduction step), else HC_PRE's."""
    name, n_inputs = "HC_SITE", 5
    written_inputs = (4,)

    def infer(self, inputs, params):
        part, X, scale, base, coefs = inputs
        check_shape("partials", part.shape, (None, None, None))
        check_shape("X", X.shape, (None, HC, None))
        m = _site_m(part, scale, base)
        check_same("partials", part.shape[0], "X", X.shape[0], "T (tokens)")
        check_shape("coefs", coefs.shape, (X.shape[0], m))
        check_eps("hc_eps", params.get("hc_eps", 1e-6))
        check_eps("norm_eps", params.get("norm_eps", 1e-6))
        check_n_iter(params.get("n_iter", 20))
        if params.get("wg") is not None:
            wg = check_layout_param(self.name, params, "wg")
            if wg % 4 or wg > WG_REDUCE_MAX:
                raise ValueError(f"{self.name}: wg must be a multiple of 4 from 4 to {WG_REDUCE_MAX} (the "
                                 f"Sinkhorn's four lanes, the shared reduction step), got {wg}")
        check_unit_inner(self.name, "X", X)
        check_partials(self.name, part)
        return (X.shape[0], X.shape[2]), "f32"

    def lower(self, node, device):
        part, X, scale, base, coefs = node.inputs
        u = node.output
        require_support(self.name, device, site_supported(device))
        T, G, m1 = part.shape
        D = X.shape[2]
        vec4, chunks, wg, gpt, cpt = _slice_launch_layout(D, [X, u], node.params.get("wg"))
        check_shared(device, self.name, wg, m1)
        unit = 4 if vec4 else 1
        push = {"T": T, "n_chunks": chunks, "groups_per_token": gpt, "G": G,
                "n_iter": check_n_iter(node.params.get("n_iter", 20)), "inv_k": 1.0 / (HC * D),
                "norm_eps": check_eps("norm_eps", node.params.get("norm_eps", 1e-6)),
                "eps": check_eps("hc_eps", node.params.get("hc_eps", 1e-6)),
                **view_fields("p", part.offset, part.strides[:2], ("st", "sg")),
                **view_fields("x", X.offset // unit, strides_in(X, unit), ("st", "ss")),
                **view_fields("s", scale.offset, scale.strides, ("s",)), **view_fields("b", base.offset, base.strides, ("s",)),
                **view_fields("u", u.offset // unit, (u.strides[0] // unit,), ("st",)),
                **view_fields("c", coefs.offset, coefs.strides, ("st", "sj"))}
        return [Launch("hc_site", [part, X, scale, base, coefs, u], (4, 5), push, grid_1d(T * gpt, 1),
                       defines={"VEC4": 1} if vec4 else {}, spec=(wg, cpt, m1 - 1),
                       full_subgroups=full_subgroups_for(device, wg))]

    def reference(self, part, X, scale, base, coefs=None, hc_eps=1e-6, norm_eps=1e-6, n_iter=20, wg=None):
        p = as_f64(part).sum(axis=1)
        mix = p[:, :-1] / np.sqrt(p[:, -1:] / (HC * np.shape(X)[2]) + norm_eps)
        w = (reference_coefs(mix, scale, base, hc_eps, n_iter)[:, :HC] if mix.shape[1] == N_MIX
             else _sigmoid(mix * as_f64(scale)[0] + as_f64(base)) + hc_eps)
        return reference_pre(X, w)


@register
class HcPre(OpDef):
    """HC_PRE(x [T,4,D], w [T,4]) -> u [T,D] = Σ_s w[t,s]·x[t,s,:]."""
    name, n_inputs = "HC_PRE", 2

    def infer(self, inputs, params):
        x, w = inputs
        check_shape("x", x.shape, (None, HC, None))
        check_shape("weights", w.shape, (None, HC))
        check_same("x", x.shape[0], "weights", w.shape[0], "T (tokens)")
        check_unit_inner("HC_PRE", "x", x)
        return (x.shape[0], x.shape[2]), "f32"

    def lower(self, node, device):
        return pre_launch(node, *node.inputs)

    def reference(self, x, w):
        return reference_pre(x, w)


def pre_launch(node, x, w, scale=None, base=None):
    """hc_pre.comp's launch: HC_PRE with weights w, or with scale and base HC_PRE_GATE (-D GATE: w holds
    the pre mixes, the node's eps param)."""
    u = node.output
    check_unit_inner(node.op.name, "output", u)
    T, _, D = x.shape
    vec4, chunks, wg, gpt, cpt = _slice_launch_layout(D, [x, u])
    unit = 4 if vec4 else 1
    fields = {"T": T, "n_chunks": chunks, "groups_per_token": gpt,
              **view_fields("x", x.offset // unit, strides_in(x, unit), ("st", "ss")),
              **view_fields("w", w.offset, w.strides, ("st", "ss")),
              **view_fields("u", u.offset // unit, strides_in(u, unit), ("st",))}
    args, defines = [x, w, u], {"VEC4": 1} if vec4 else {}
    if scale is not None:
        fields |= {"s_off": scale.offset, **view_fields("b", base.offset, base.strides, ("s",)),
                   "eps": check_eps("eps", node.params.get("eps", 1e-6))}
        args, defines = args + [scale, base], {**defines, "GATE": 1}
    return [Launch("hc_pre", args, (2,), fields, grid_1d(T * gpt, 1), defines=defines, spec=(wg, cpt))]


@register
class HcPreGate(OpDef):
    """HC_PRE_GATE(x [T,4,D], mix [T,4], scale [1], base [4], eps=) -> u [T,D] = Σ_s pre[t,s]·x[t,s,:]
    with pre = sigmoid(mix·scale[0] + base) + eps: HC_PRE with the pre gates formed from the mixes
    (hc_pre.comp -D GATE), so that the three-op site's collapse does not wait for HC_COEFS.
    Decomposition: the gates (MUL, ADD, SIGMOID, SCALE) then HC_PRE."""
    name, n_inputs = "HC_PRE_GATE", 4

    def infer(self, inputs, params):
        x, mix, scale, base = inputs
        check_params(self.name, params, ("eps",))
        check_eps("eps", params.get("eps", 1e-6))
        check_shape("x", x.shape, (None, HC, None))
        check_shape("mix", mix.shape, (None, HC))
        check_shape("scale", scale.shape, (1,))
        check_shape("base", base.shape, (HC,))
        check_same("x", x.shape[0], "mix", mix.shape[0], "T (tokens)")
        check_unit_inner(self.name, "x", x)
        return (x.shape[0], x.shape[2]), "f32"

    def lower(self, node, device):
        return pre_launch(node, *node.inputs)

    def reference(self, x, mix, scale, base, eps=1e-6):
        return reference_pre(x, _sigmoid(as_f64(mix) * as_f64(scale)[0] + as_f64(base)) + eps)


def check_post_shapes(f, residual, post, comb):
    """Validate HC_POST argument shapes (f [T,D], residual [T,4,D], post [T,4], comb [T,4,4]); (T, D)."""
    check_shape("f", f, (None, None))
    check_shape("residual", residual, (None, HC, None))
    check_shape("post", post, (None, HC))
    check_shape("comb", comb, (None, HC, HC))
    T, D = f
    check_same("f", T, "residual", residual[0], "T (tokens)")
    check_same("f", T, "post", post[0], "T (tokens)")
    check_same("f", T, "comb", comb[0], "T (tokens)")
    check_same("f", D, "residual", residual[2], "D (hidden size)")
    return T, D


def post_launch(node, device, f, res, post, comb, out, fn=None, part=None, wg=None):
    """HC_POST's launch; with fn / part also the next site's mixes partials (-D MIX_NEXT, one chunk
    per invocation)."""
    check_unit_inner(node.op.name, "output", out)
    T, D = f.shape
    tensors = [f, res, out] + ([fn] if fn is not None else [])
    if wg is None:
        vec4, chunks, wg, gpt, cpt = _slice_launch_layout(D, tensors)
    else:                           # HC_POST_MIX: one destination stream per invocation, wg/4 chunks a group
        vec4 = vec4_ok(D, tensors)
        chunks = D // 4 if vec4 else D
        gpt, cpt = -(-chunks // post_mix_split(wg)), 1
    unit = 4 if vec4 else 1
    fields = {"T": T, "n_chunks": chunks, "groups_per_token": gpt,
              **view_fields("f", f.offset // unit, strides_in(f, unit), ("st",)),
              **view_fields("r", res.offset // unit, strides_in(res, unit), ("st", "ss")),
              **view_fields("p", post.offset, post.strides, ("st", "sd")),
              **view_fields("c", comb.offset, comb.strides, ("st", "ss", "sd")),
              **view_fields("o", out.offset // unit, strides_in(out, unit), ("st", "sd"))}
    defines = {"VEC4": 1} if vec4 else {}
    args, writes, spec, extra = [f, res, post, comb, out], (4,), (wg, cpt), {}
    if fn is not None:
        fields |= {**view_fields("fn", fn.offset // unit, (fn.strides[0] // unit,), ("sj",)),
                   **view_fields("q", part.offset, part.strides[:2], ("st", "sg"))}
        defines["MIX_NEXT"] = 1
        check_shared(device, node.op.name, wg, fn.shape[0] + 1)
        args, writes, spec = [f, res, post, comb, fn, out, part], (5, 6), (wg, cpt, fn.shape[0])
        extra = {"full_subgroups": full_subgroups_for(device, wg)}
    return [Launch("hc_post", args, writes, fields, grid_1d(T * gpt, 1), defines=defines, spec=spec,
                   **extra)]


@register
class HcPost(OpDef):
    """HC_POST(f [T,D], residual [T,4,D], post [T,4], comb [T,4,4]) -> [T,4,D]."""
    name, n_inputs = "HC_POST", 4

    def infer(self, inputs, params):
        f, res, post, comb = inputs
        T, D = check_post_shapes(f.shape, res.shape, post.shape, comb.shape)
        check_unit_inner("HC_POST", "f", f)
        check_unit_inner("HC_POST", "residual", res)
        return (T, HC, D), "f32"

    def lower(self, node, device):
        return post_launch(node, device, *node.inputs, node.output)

    def reference(self, f, residual, post, comb):
        return reference_post(f, residual, post, comb)


def post_mix_split(wg, split=0):
    """Chunks per split of HC_POST_MIX's partials: KSPLIT's `split` (many tokens), else a workgroup's
    wg/4 chunks (hc_post.comp -D MIX_NEXT: one destination stream per invocation)."""
    return split or wg // HC


def post_mix_groups(D, tensors, wg, split=0):
    """Splits of HC_POST_MIX's partials per token (workgroups per token at few tokens)."""
    chunks = D // 4 if vec4_ok(D, tensors) else D
    return -(-chunks // post_mix_split(wg, split))
