"""The mixes kernels as ops: HC_MIX, HC_MIX_PART, HC_MIX_REDUCE and HC_POST_MIX, with their layouts
and launches — the per-token kernel, KSPLIT (fn slices staged in shared memory, blocks of tokens
streamed through them), the tensor-core kernel (tc = 1 on cooperative matrices, 2 with FMA
products), the partials' reduction, and the post that carries the next site's mixes (hc_post.comp
-D MIX_NEXT at few tokens, hc_mix_ksplit.comp / hc_mix_tc.comp -D POST at many) — and the tuning
table they read (tools/hc_tune.py sweeps it). Which kernel runs: `plan`. TCR: `tcr`.
"""
import numpy as np

from ..core.tuning import knob_table
from .kernels import (HC, N_MIX, as_f64, check_eps, check_fn_rows, check_layout_param, check_partials, mix_fields,
                      check_post_shapes, check_shared, check_unit_inner, post_launch, post_mix_groups, post_mix_split,
                      reference_mix_partials, reference_mixes, reference_post, require_support, strides_in, vec4_ok)
from .policy import HCUnsupported, ksplit_runs, mix_supported, site_supported
from . import tcr
from .tcr import TCR_H200_LAYOUT, TCR_TT, tc_tile_n, tcr_split_chunks
from ..ops.base import Launch, OpDef, check_params, check_shape, grid_1d, register, view_fields


# HC_MIX layout knobs (tools/hc_tune.py sweeps them); None: the rule of mix_layout. "kernel" and
# "split" also pick the kernel (hc.plan.mix_kernel).
MIX_TUNING = knob_table(
    "mix",
    wg=(None, "workgroup size"), groups=(None, "D splits (G)"), split=(None, "chunks per split (KSPLIT: 16)"),
    lpt=(None, "KSPLIT lanes per token group"), tb=(None, "KSPLIT / TC tokens a block"),
    tpl=(None, "KSPLIT tokens a lane group"), rh=(None, "KSPLIT row groups (1 or 2)"),
    kernel=(None, "the mixes kernel: token, ksplit, tc or tcr (None: the plan's choice)"),
    tt=(None, "TCR tiles a subgroup"))
MIX_KERNELS = ("token", "ksplit", "tc", "tcr")
# The shader of each mixes kernel (shaders/<name>.comp): the names lowering, profiles and `info` share.
MIX_SHADERS = {"token": "hc_mix_token", "ksplit": "hc_mix_ksplit", "tc": "hc_mix_tc", "tcr": "hc_mix_tcr",
               "fn_split": "hc_mix_fn_split", "probe": "hc_mix_probe", "reduce": "hc_mix_reduce"}
# Workgroups a mixes pass aims for (a few per compute unit of a large GPU; a CPU device runs
# workgroups on its cores one after another, so a few suffice there).
MIX_TARGET_GROUPS = {"cpu": 4}
MIX_TARGET_GROUPS_DEFAULT = 256
# Chunks per split and stream of KSPLIT (a constant in hc_mix_ksplit.comp: its shared fn slice); splits
# of 32 were slower on the H200.
KSPLIT_S = 16
# KSPLIT's row groups (rh): 2 groups of lpt lanes take the same tokens, each half of the fn rows (M a
# multiple of 8; other M run one group), so that a lane holds half the sums and tpl can double: 4 tokens
# × 12 rows a lane, 3 products per fn operand loaded from shared memory against 1.85 with 2 × 24. On
# GPUs where 2·lpt lanes fit in a subgroup (faster there at every size measured). The prefill carry
# keeps 1 (plan.PREFILL_CARRY).
KSPLIT_RH = 2
# TC (hc_mix_tc.comp): the mixes on 16-bit tensor cores with fp32 accuracy (each operand split into
# fp16 hi and lo parts, three products). 128 invocations, blocks of 64 tokens, 64 chunks per stream
# and split (G = D / 4 / 64: 16 splits at D = 4096, partials 1/40 of X's bytes). Only when asked for:
# its staging makes it slower than KSPLIT on the H200. tc = 1 runs it on VK_NV_cooperative_matrix,
# tc = 2 forms the same products with FMA loops on any device (its arithmetic, for tests).
TC_WG, TC_TOKENS, TC_SPLIT = 128, 64, 64
TC_STEP = 16                    # chunks per staging step (KC in hc_mix_tc.comp): also Σx² lanes per token
TC_XS = 4 * TC_STEP + 8         # halves between staged rows (XS in hc_mix_tc.comp)
TC_VARIANTS = {1: "cooperative matrices", 2: "FMA products"}


def mix_layout(device, T, chunks, kernel):
    """The node params of mixes kernel `kernel` (hc.plan.mix_kernel picks it) for T tokens of `chunks`
    chunks per stream: wg, groups G, and per kernel
    - "tcr": tt = TCR_TT tiles a subgroup, the split from tcr_split_chunks (about one wave of workgroups);
    - "ksplit": G = chunks/S splits each staging its fn slice (16 chunks) in shared memory, blocks of tb
      tokens streaming through it, lpt lanes per group of tpl tokens (each fn load from shared memory
      serves tpl products); on GPUs with 8-lane subgroups or wider, rh = 2 row groups of 4 lanes with 4
      tokens (KSPLIT_RH); CPU devices: 4 lanes, 2 tokens, one group;
    - "tc": the tensor-core kernel (tc = 1 with cooperative matrices, else its FMA form tc = 2);
    - "token": one token per workgroup of 64 invocations (4 streams × 16) and D split into G slices of
      ≥ one chunk per invocation until about the target number of workgroups is reached (decode: a
      token's fn is the data to stream, spread over many workgroups; at D = 4096, 64 splits as
      HC_POST_MIX makes)."""
    t = MIX_TUNING
    target = MIX_TARGET_GROUPS.get(device.caps.type, MIX_TARGET_GROUPS_DEFAULT)
    cpu = device.caps.is_cpu
    if kernel not in MIX_KERNELS:
        raise ValueError(f"the mixes kernel must be one of {MIX_KERNELS}, got {kernel!r}")
    if kernel == "tc":
        split = t["split"] or TC_SPLIT
        return {"wg": TC_WG, "groups": -(-chunks // split), "split": split, "lpt": 1, "tb": TC_TOKENS,
                "tpl": 1, "tc": 1 if tc_tile_n(device) else 2}
    if kernel == "tcr":
        tt = t["tt"] or TCR_TT
        split = t["split"] or tcr_split_chunks(T, chunks, tt, target)
        lay = tcr.tcr_layout(device)
        return {"tcr": 1, "groups": -(-chunks // split), "split": split, "tt": tt,
                "cm": int(isinstance(lay, tuple)), "layout": lay if isinstance(lay, tuple) else TCR_H200_LAYOUT}
    if kernel == "ksplit":
        lpt = t["lpt"] or 4
        rh = t["rh"] or (KSPLIT_RH if not cpu and lpt * KSPLIT_RH <= device.caps.subgroup.min_size else 1)
        split = t["split"] or KSPLIT_S            # (any other is refused by name when lowered)
        return {"wg": t["wg"] or (64 if cpu else 256), "groups": -(-chunks // split), "split": split,
                "lpt": lpt, "tb": t["tb"] or (64 if cpu else 256), "tpl": t["tpl"] or (4 if rh == 2 else 2), "rh": rh}
    wg = t["wg"] or max(64, device.caps.subgroup.max_size)     # (whole subgroups)
    groups = t["groups"] or max(1, min(-(-target // T), -(-chunks // max(1, wg // HC))))
    return {"wg": wg, "groups": groups, "split": 0, "lpt": 1, "tb": 1, "tpl": 1}



def _check_stream_groups(op, params):
    """The per-token kernel's workgroup is 4 groups of invocations, one per stream."""
    wg = params["wg"]
    if wg % HC:
        raise ValueError(f"{op}: the per-token kernel's workgroup is 4 groups of invocations, one per stream: "
                         f"wg must be a multiple of 4, got {wg}")


def _check_mix_args(X, fn):
    check_shape("X", X.shape, (None, HC, None))
    check_shape("fn", fn.shape, (None, HC * X.shape[2]))
    check_fn_rows("HC_MIX", "fn", fn)
    check_unit_inner("HC_MIX", "X", X)
    check_unit_inner("HC_MIX", "fn", fn)



def _ksplit_pipeline(op, device, chunks, groups, m, unit, pr, tpls):
    """The KSPLIT layout's constraints (hc_mix_ksplit.comp, with or without POST), then its defines
    and specialization constants (wg, m, lpt, tpl, row groups)."""
    split, wg, lpt, tpl, rh = pr.get("split", 0), pr["wg"], pr.get("lpt", 1), pr.get("tpl", 1), pr.get("rh", 1)
    if split != KSPLIT_S or groups != -(-chunks // split):
        raise ValueError(f"{op}: split must be {KSPLIT_S} with partials of groups = ceil({chunks} / {KSPLIT_S}), "
                         f"got split {split}, groups {groups}")
    if not ksplit_runs(device):
        raise HCUnsupported(f"{op}: KSPLIT needs subgroup shuffles and full subgroups, {device.name} has not")
    min_size = device.caps.subgroup.min_size
    if lpt & (lpt - 1) or wg % lpt or lpt > min_size:
        raise ValueError(f"{op}: lpt ({lpt}) must be a power of two dividing wg ({wg}) and at most "
                         f"the subgroup size ({min_size})")
    if isinstance(rh, bool) or rh not in (1, 2) or wg % (lpt * rh) or lpt * rh > min_size:
        raise ValueError(f"{op}: rh (row groups) must be 1 or 2 with lpt·rh ({lpt}·{rh}) dividing wg ({wg}) and at "
                         f"most the subgroup size ({min_size})")
    need = m * HC * split * unit * 4
    if need > device.caps.limits.max_shared_memory:
        raise HCUnsupported(f"{op}: split {split} stages {need} B of fn in shared memory, "
                            f"{device.name} has {device.caps.limits.max_shared_memory} B")
    if tpl not in tpls:
        raise ValueError(f"{op}: tpl (tokens per lane group) must be one of {tpls}, got {tpl}")
    return {}, (wg, m, lpt, tpl, ksplit_row_groups(pr, m))


def ksplit_row_groups(params, m):
    """KSPLIT's row groups for m fn rows: rh where each group's m / rh rows are whole quads, else 1."""
    rh = params.get("rh", 1)
    return rh if m % (4 * rh) == 0 else 1


def _mix_launch(node, device, final, groups):
    """The launch of HC_MIX (final) or HC_MIX_PART: the per-token kernel, or KSPLIT (param split > 0)."""
    X, fn = node.inputs
    out = node.output
    require_support(node.op.name, device, mix_supported(device))
    T, _, D = X.shape
    m = fn.shape[0]
    vec4 = vec4_ok(D, [X, fn])
    unit = 4 if vec4 else 1
    chunks = D // unit
    pr = node.params
    wg, split, tb = pr["wg"], pr.get("split", 0), pr.get("tb", 1)
    defines = {"VEC4": 1} if vec4 else {}
    if pr.get("tc"):
        return [_tc_launch(node, device, final, groups, vec4, chunks)]
    if split:
        if final:
            raise ValueError(f"{node.op.name}: KSPLIT writes partials, not the final mixes")
        ksplit_defines, spec = _ksplit_pipeline(node.op.name, device, chunks, groups, m, unit, pr, (1, 2, 4))
        defines.update(ksplit_defines)
        grid = grid_1d(-(-T // tb) * groups, 1)
    else:
        _check_stream_groups(node.op.name, pr)
        check_shared(device, node.op.name, wg, m + 1)
        grid, spec = grid_1d(T * groups, 1), (wg, m)
    if final:
        defines["FINAL"] = 1
    push = mix_fields(T, chunks, -(-chunks // groups), groups, 1.0 / (HC * D), check_eps("norm_eps", pr.get("norm_eps", 1e-6)),
                      (X.offset // unit, *strides_in(X, unit)), (fn.offset // unit, fn.strides[0] // unit),
                      (out.offset, out.strides[0], out.strides[1]), tb)
    return [Launch(MIX_SHADERS["ksplit" if split else "token"], [X, fn, out], (2,), push, grid, defines=defines, spec=spec,
                   full_subgroups=device.caps.subgroup.full_subgroups)]


def _tc_defines(name, device, tc):
    """The tensor-core kernel's defines and whether it needs full subgroups (tc = 1 on cooperative
    matrices, 2 with FMA products); HCUnsupported where the device cannot run it."""
    defines, full = {"VEC4": 1}, False
    if tc == 1:
        n = tc_tile_n(device)
        if n is None:
            raise HCUnsupported(f"{name}: tc = 1 needs VK_NV_cooperative_matrix with a 16 × 8 or 16 × 16 × 16 fp16 "
                                f"shape accumulating in fp32 and 32-lane subgroups; {device.name} has "
                                f"{len(device.caps.coopmat)} shapes and subgroups of {device.caps.subgroup.min_size}–"
                                f"{device.caps.subgroup.max_size} (tc = 2 forms the same products without them)")
        defines.update(CM_NV=1, CM_N=n)
        full = True                        # 4 whole subgroups: gl_SubgroupID picks the token tile
        rows = -(-N_MIX // n) * n
        need = (2 * 2 * (TC_TOKENS + rows) * TC_XS) + 4 * (2 * TC_TOKENS * rows + TC_TOKENS * TC_STEP)
    else:
        need = 4 * (TC_TOKENS + N_MIX) * TC_XS
    if need > device.caps.limits.max_shared_memory:
        raise HCUnsupported(f"{name}: the tensor-core kernel stages {need} B in shared memory, "
                            f"{device.name} has {device.caps.limits.max_shared_memory} B")
    return defines, full


def _tc_checks(name, pr, chunks, groups, vec4, D):
    split = pr.get("split", 0)
    if not split or groups != -(-chunks // split) or pr["wg"] != TC_WG or pr.get("tb", 1) != TC_TOKENS:
        raise ValueError(f"{name}: the tensor-core kernel writes partials and takes wg {TC_WG}, tb {TC_TOKENS} and "
                         f"groups = ceil({chunks} / split), got wg {pr['wg']}, tb {pr.get('tb', 1)}, split {split}, "
                         f"groups {groups}")
    if not vec4:
        raise ValueError(f"{name}: the tensor-core kernel stages chunks of 4 floats: D and every offset and stride "
                         f"but the last must be multiples of 4, got D = {D}")


def _tc_launch(node, device, final, groups, vec4, chunks):
    """HC_MIX_PART's tensor-core kernel (hc_mix_tc.comp)."""
    name, pr = node.op.name, node.params
    X, fn = node.inputs
    T, m = X.shape[0], fn.shape[0]
    if final:
        raise ValueError(f"{name}: the tensor-core kernel writes partials, not the final mixes")
    _tc_checks(name, pr, chunks, groups, vec4, X.shape[2])
    defines, full = _tc_defines(name, device, pr["tc"])
    out = node.output
    push = mix_fields(T, chunks, pr["split"], groups, 1.0 / (HC * X.shape[2]), check_eps("norm_eps", pr.get("norm_eps", 1e-6)),
                      (X.offset // 4, *strides_in(X, 4)), (fn.offset // 4, fn.strides[0] // 4),
                      (out.offset, out.strides[0], out.strides[1]), TC_TOKENS)
    return Launch(MIX_SHADERS["tc"], [X, fn, node.output], (2,), push, grid_1d(-(-T // TC_TOKENS) * groups, 1),
                  defines=defines, spec=(TC_WG, m), full_subgroups=full)


def _check_tc_param(op, params):
    tc = params.get("tc", 0)
    if isinstance(tc, bool) or tc not in (0, *TC_VARIANTS):
        raise ValueError(f"{op}: tc must be 0 (no tensor-core kernel) or one of {TC_VARIANTS}, got {tc!r}")
    return tc


@register
class HcMix(OpDef):
    """HC_MIX(X [T,4,D], fn [m,4D], norm_eps=, wg=) -> mix [T,m] = (x @ fnᵀ) / sqrt(mean(x²) + norm_eps),
    x = X flattened per token: the site's flat RMS norm and mixes mat-mul in one dispatch, one
    workgroup per token reading its X once (hc_mix_token.comp -D FINAL)."""
    name, n_inputs = "HC_MIX", 2

    def infer(self, inputs, params):
        X, fn = inputs
        _check_mix_args(X, fn)
        check_eps("norm_eps", params.get("norm_eps", 1e-6))
        check_layout_param(self.name, params, "wg")
        _check_stream_groups(self.name, params)
        return (X.shape[0], fn.shape[0]), "f32"

    def lower(self, node, device):
        return _mix_launch(node, device, True, 1)

    def reference(self, X, fn, norm_eps=1e-6, wg=1):
        return reference_mixes(X, fn, norm_eps)


@register
class HcMixPartials(OpDef):
    """HC_MIX_PART(X [T,4,D], fn [m,4D], groups=G, wg=, split=, lpt=, tb=, tpl=, rh=, tc=, norm_eps=) -> partials
    [T,G,m+1]: per split of D the dot products with the m fn rows and Σx² (hc_mix_token.comp: the per-token
    kernel, KSPLIT, with tc=1 or 2 the tensor-core kernel TC). Decode splits D over many workgroups;
    HC_SITE or HC_MIX_REDUCE finish."""
    name, n_inputs = "HC_MIX_PART", 2

    def infer(self, inputs, params):
        X, fn = inputs
        _check_mix_args(X, fn)
        check_params(self.name, params, ("groups", "wg", "split", "lpt", "tb", "tpl", "rh", "tc", "norm_eps"))
        check_layout_param(self.name, params, "wg")
        for k in ("lpt", "tb", "tpl", "rh"):
            check_layout_param(self.name, {k: 1, **params}, k)
        if params.get("split", 0):
            check_layout_param(self.name, params, "split")
        _check_tc_param(self.name, params)
        G = check_layout_param(self.name, params, "groups")
        if not (params.get("split", 0) or params.get("tc", 0)):
            _check_stream_groups(self.name, params)
        return (X.shape[0], G, fn.shape[0] + 1), "f32"

    def lower(self, node, device):
        check_partials(self.name, node.output)
        return _mix_launch(node, device, False, node.params["groups"])

    def reference(self, X, fn, groups=1, wg=1, split=0, lpt=1, tb=1, tpl=1, rh=1, tc=0, norm_eps=1e-6):
        D = np.shape(X)[2]
        return reference_mix_partials(X, fn, groups, 4 if D % 4 == 0 else 1, split)


def mix_partials(g, X, fn, layout):
    """partials [T,G,m+1] of the mixes of X (unit inner stride) with fn in `layout` (mix_layout's): HC_MIX_PART,
    or with TCR's layout HC_MIX_FN_SPLIT + HC_MIX_TCR."""
    if not layout.get("tcr"):
        return g.op("HC_MIX_PART", X, fn, **layout)
    lay = {k: v for k, v in layout.items() if k != "tcr"}
    fw = g.op("HC_MIX_FN_SPLIT", fn, layout=lay["layout"])
    return g.op("HC_MIX_TCR", X, fw, m=fn.shape[0], **lay)


@register
class HcMixReduce(OpDef):
    """HC_MIX_REDUCE(partials [T,G,m+1], norm_eps=, width=4·D) -> mix [T,m] = Σ dots / sqrt(Σ Σx² / width + norm_eps)."""
    name, n_inputs = "HC_MIX_REDUCE", 1

    def infer(self, inputs, params):
        (part,) = inputs
        check_shape("partials", part.shape, (None, None, None))
        if part.shape[2] < 2:
            raise ValueError(f"{self.name}: partials need m ≥ 1 dot products and Σx², got shape {part.shape}")
        check_eps("norm_eps", params.get("norm_eps", 1e-6))
        check_layout_param(self.name, params, "width")
        return (part.shape[0], part.shape[2] - 1), "f32"

    def lower(self, node, device):
        (part,) = node.inputs
        out = node.output
        check_partials(self.name, part)
        T, G, m1 = part.shape
        push = {"T": T, "G": G, "inv_k": 1.0 / node.params["width"],
                "norm_eps": check_eps("norm_eps", node.params.get("norm_eps", 1e-6)),
                **view_fields("p", part.offset, part.strides[:2], ("st", "sg")),
                **view_fields("o", out.offset, out.strides, ("st", "sj"))}
        return [Launch(MIX_SHADERS["reduce"], [part, out], (1,), push, grid_1d(T * (m1 - 1), 64), defines={},
                       spec=(64, m1 - 1, 1))]

    def reference(self, part, norm_eps=1e-6, width=1):
        p = as_f64(part).sum(axis=1)
        return p[:, :-1] / np.sqrt(p[:, -1:] / width + norm_eps)



def _post_mix_many_tokens_launch(node, device, f, res, post, comb, fn, out, part):
    """HC_POST_MIX for many tokens: hc_mix_ksplit.comp -D POST (blocks of tokens through the next
    fn's D split staged in shared memory, the new streams made and written on the way), or with
    tc = 1 / 2 hc_mix_tc.comp -D POST (the tensor-core kernel, steps of 4 chunks of the 4 streams)."""
    T, D = f.shape
    vec4 = vec4_ok(D, [f, res, out, fn])
    unit = 4 if vec4 else 1
    chunks = D // unit
    pr = node.params
    m, groups = fn.shape[0], part.shape[1]
    if pr.get("tc"):
        _tc_checks(node.op.name, pr, chunks, groups, vec4, D)
        defines, full = _tc_defines(node.op.name, device, pr["tc"])
        split, wg, tb, spec = pr["split"], TC_WG, TC_TOKENS, (TC_WG, m)
    else:
        defines, spec = _ksplit_pipeline(node.op.name, device, chunks, groups, m, unit, pr, (1, 2))
        defines, full = {**defines, **({"VEC4": 1} if vec4 else {})}, True
        split, wg, tb = pr["split"], pr["wg"], pr["tb"]
    push = {**mix_fields(T, chunks, split, groups, 1.0 / (HC * D), 0.0, (res.offset // unit, *strides_in(res, unit)),
                         (fn.offset // unit, fn.strides[0] // unit), (part.offset, part.strides[0], part.strides[1]), tb),
            **view_fields("s", f.offset // unit, strides_in(f, unit), ("st",)),
            **view_fields("pw", post.offset, post.strides, ("st", "sd")),
            **view_fields("cw", comb.offset, comb.strides, ("st", "ss", "sd")),
            **view_fields("n", out.offset // unit, strides_in(out, unit), ("st", "sd"))}
    return [Launch(MIX_SHADERS["tc" if pr.get("tc") else "ksplit"], [f, fn, part, res, post, comb, out], (2, 6), push,
                   grid_1d(-(-T // tb) * groups, 1),
                   defines={**defines, "POST": 1}, spec=spec, full_subgroups=full)]


@register
class HcPostMix(OpDef):
    """HC_POST_MIX(f, residual, post, comb, fn_next [m,4D], out [T,4,D], wg=[, split=, lpt=, tb=, tpl=, tc=])
    -> partials [T,G,m+1].

    A layer boundary in one pass: HC_POST writes the new streams into its argument `out` (an empty
    tensor the graph function made: written_inputs) and, from the values still in registers, the
    next site's mixes partials, which HC_SITE or HC_MIX_REDUCE finish. Few tokens: hc_post.comp
    -D MIX_NEXT, G = workgroups per token (one destination stream of one chunk per invocation, wg/4
    chunks per workgroup). With split (KSPLIT's layout,
    `mix_layout(..., kernel="ksplit")`, tpl ≤ 2): hc_mix_ksplit.comp -D POST, G = D splits; with
    `mix_layout(..., kernel="tc")` (tc = 1 or 2): hc_mix_tc.comp -D POST, the tensor-core kernel."""
    name, n_inputs = "HC_POST_MIX", 6
    written_inputs = (5,)

    def infer(self, inputs, params):
        f, res, post, comb, fn, out = inputs
        T, D = check_post_shapes(f.shape, res.shape, post.shape, comb.shape)
        check_shape("fn_next", fn.shape, (None, HC * D))
        check_shape("out", out.shape, (T, HC, D))
        for name, t in (("f", f), ("residual", res), ("fn_next", fn), ("out", out)):
            check_unit_inner(self.name, name, t)
        check_fn_rows(self.name, "fn_next", fn)
        wg = check_layout_param(self.name, params, "wg")
        split = 0
        if params.get("split", 0):
            split = check_layout_param(self.name, params, "split")
            for k in ("lpt", "tb", "tpl"):
                check_layout_param(self.name, params, k)
            check_layout_param(self.name, {"rh": 1, **params}, "rh")
            _check_tc_param(self.name, params)
        elif params.get("tc", 0):
            raise ValueError(f"{self.name}: the tensor-core kernel (tc) takes a split (many tokens)")
        elif wg % HC:
            raise ValueError(f"{self.name}: wg must be a multiple of {HC} (one destination stream per "
                             f"invocation), got {wg}")
        return (T, post_mix_groups(D, [f, res, out, fn], wg, split), fn.shape[0] + 1), "f32"

    def lower(self, node, device):
        f, res, post, comb, fn, out = node.inputs
        if node.params.get("split", 0):
            require_support(self.name, device, mix_supported(device))
            return _post_mix_many_tokens_launch(node, device, f, res, post, comb, fn, out, node.output)
        require_support(self.name, device, site_supported(device))
        return post_launch(node, device, f, res, post, comb, out, fn, node.output, node.params["wg"])

    def reference(self, f, residual, post, comb, fn_next, out=None, wg=HC, split=0, lpt=1, tb=1, tpl=1, tc=0):
        x = reference_post(f, residual, post, comb)
        D = np.shape(f)[1]
        chunk = 4 if D % 4 == 0 else 1
        per = post_mix_split(wg, split)
        return reference_mix_partials(x, fn_next, -(-(D // chunk) // per), chunk, per)
