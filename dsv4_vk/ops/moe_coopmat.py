"""MUL_MAT_ID's grouped GEMM on 16-bit matrix units (shaders/mul_mat_id_coopmat.comp): the grouped path of
ops/moe_grouped.py (the routing sort, one GEMM per expert's routes, the route sum) with the GEMM's products
in fp16 on VK_NV_cooperative_matrix and f32 sums, every row scaled by a power of two before it is rounded
to fp16 (docs/tensor_cores.md). `expert_gemm` decides which GEMM a grouped MUL_MAT_ID runs: "coopmat" where
the device has the matrix units (the check MUL_MAT's tensor-core kernel uses, DSV4_VK_DISABLE_COOPMAT
respected), "coopmat_fma" (its data flow with FMA products on any device: knob emulate, for tests), else
"f32" (mul_mat_id_grouped.comp).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.tuning import knob_table, tuned
from .base import Launch, MAX_GROUPS, grid_1d, next_pow2, view_fields
from .moe_grouped import buckets, gemm_fields, grouped_launches, max_tiles, sort_layout
from .base import coopmat_unavailable
from .mul_mat_coopmat import COOPMAT_DTYPES

COOPMAT_GROUPED = knob_table(
    "mul_mat_id_coopmat",
    auto=(True, "the grouped MUL_MAT_ID takes the matrix units where the device has them (True, the default; "
                "False: the f32 grouped kernel everywhere)"),
    emulate=(False, "the grouped MUL_MAT_ID runs the cooperative-matrix kernel's data flow with FMA products "
                    "(coopmat_fma) in place of the matrix units, on any device (with auto on): its numerics, "
                    "for tests"),
    tokens=(None, "route slots of a tile, BT (a multiple of warp_tokens; None: on GPUs the routes an expert gets "
                  "on average as a power of two within 16..64, 16 on CPU devices)"),
    outputs=(None, "outputs of a tile, BN (SwiGLU: BN gate and BN up rows; None: 64 on GPUs, 16 on CPU devices)"),
    warp_tokens=(None, "route slots of a warp's (32 lanes') tile, WM (a multiple of 16; None: min(tokens, 32))"),
    warp_outputs=(None, "weight rows of a warp's tile, WN (a multiple of 16; None: 32 on GPUs, 16 on CPU devices)"),
    k_step=(None, "inputs staged a step, BK (a multiple of 16; None: 32)"),
    output_tiles=(1, "output tiles a workgroup takes in turn, NT (≥ 1): its x rows' scales found once for all of "
                     "them"),
    x_half=(False, "a pass before the GEMM writes each x row (per token where the routes share it, else per route) "
                   "scaled by its power of two and rounded to fp16 once, with its shift and 1/rms (T or T·R rows "
                   "× (K/2 + 4) words of scratch), and the GEMM stages x from those halves instead of converting "
                   "f32 x in every output tile (the same values: the same outputs bit for bit); off until "
                   "measured on a GPU"))
KERNELS = ("coopmat", "coopmat_fma", "f32")
X_HALF_POOL = "mul_mat_id.x_half"       # mul_mat_id_coopmat.x_half's x rows as fp16 (OpDef.scratch)
X_HALF_OFF = "mul_mat_id_coopmat.x_half is off"
X_HALF_ON = "x rounded to fp16 once, by a pass before it (mul_mat_id_coopmat.x_half)"
X_ROWS_PER_GROUP = 16                   # x rows a workgroup of the X_ROWS pass (BK/8 invocations a row)


def x_half_on() -> bool:
    """The knob mul_mat_id_coopmat.x_half (ValueError naming it where it is not a bool)."""
    on = COOPMAT_GROUPED["x_half"]
    if not isinstance(on, bool):
        raise ValueError(f"tuning knob 'mul_mat_id_coopmat.x_half' must be True or False, got {on!r}")
    return on


def x_half_refusal(gemm: str, refusal: str | None = None) -> str | None:
    """The one place that decides whether the grouped GEMM stages x from fp16 rows a pass rounded once (knob
    mul_mat_id_coopmat.x_half): None where it does, else why not (X_HALF_OFF where the knob is off). It
    needs the cooperative-matrix GEMM (`gemm`, of KERNELS), whose own conditions (K % 8 == 0, 16-byte
    aligned x rows and norm weight: `refusal`, gemm_refusal's word) are the halves' too."""
    if not x_half_on():
        return X_HALF_OFF
    if refusal:
        return refusal
    if gemm == "f32":
        return "it needs the cooperative-matrix GEMM (the f32 grouped kernel runs)"
    return None


def x_half_rows(x) -> int:
    """The x rows the X_ROWS pass writes for the x view [T, R, K]: one a token where the routes share it
    (route stride 0: the SwiGLU's x [T, 1, K]), else one a route slot."""
    T, R = x.shape[:2]
    return T if x.strides[1] == 0 and R > 1 else T * R


def x_half_words(x) -> int:
    """32-bit words of the X_ROWS records for the x view [T, R, K]: K/8 + 1 uvec4s a row."""
    return x_half_rows(x) * (x.shape[-1] // 8 + 1) * 4


@dataclass(frozen=True)
class ExpertGemm:
    """The grouped MUL_MAT_ID's GEMM (one of KERNELS) and why."""
    kernel: str
    reason: str


def gemm_refusal(w_dtype: str, fmt, K: int, x=None, w=None, g=None) -> str | None:
    """Why the cooperative-matrix grouped GEMM does not take these operands (None: it does): f32 weights
    (fp16 products would round them), K % 8 != 0, x rows (and the norm weight) or bf16 / f16 weight rows
    not 16-byte aligned (the kernel loads and stages 8 inputs at a time)."""
    if fmt is None and w_dtype not in COOPMAT_DTYPES:
        return f"{w_dtype} experts stay off the matrix units (fp16 products would round them)"
    if K % 8:
        return f"K = {K} is not a multiple of 8 (the kernel stages 8 inputs at a time)"
    if x is not None and (x.offset % 4 or any(s % 4 for s in x.strides[:2]) or x.strides[2] != 1):
        return "x rows not 16-byte aligned"
    if g is not None and g.offset % 4:
        return "the norm weight not 16-byte aligned"
    if fmt is None and w is not None and (w.offset % 8 or any(s % 8 for s in w.strides[:2])):
        return "weight rows not 16-byte aligned"
    return None


def expert_gemm(device, w_dtype: str = "bf16", fmt=None, K: int = 4096, refusal: str | None = None) -> ExpertGemm:
    """The one place that decides the grouped MUL_MAT_ID's GEMM on `device` (beside moe_grouped.expert_kernel,
    which decides grouped or per route): the matrix units where the device has them (mul_mat's
    coopmat_unavailable: the 16 × 16 × 16 fp16 shape, 32-lane subgroups, DSV4_VK_DISABLE_COOPMAT unset), knob
    mul_mat_id_coopmat.auto on (the default; off: the f32 grouped kernel)
    and the operands suit it (`refusal`, else gemm_refusal of the weights); coopmat_fma on any device under
    mul_mat_id_coopmat.emulate; else the f32 grouped kernel."""
    refusal = refusal if refusal is not None else gemm_refusal(w_dtype, fmt, K)
    x_half_on()                                         # (a bad value refused whatever the GEMM)
    if refusal:
        return ExpertGemm("f32", f"f32 lanes: {refusal}")
    why = coopmat_unavailable(device)
    if why is not None and not COOPMAT_GROUPED["emulate"]:
        return ExpertGemm("f32", f"f32 lanes, since {why}")
    if not COOPMAT_GROUPED["auto"]:
        return ExpertGemm("f32", "f32 lanes: mul_mat_id_coopmat.auto is off")
    note = "; " + X_HALF_ON if x_half_on() else ""
    if COOPMAT_GROUPED["emulate"]:
        return ExpertGemm("coopmat_fma", "the matrix units' data flow with FMA products (mul_mat_id_coopmat.emulate)"
                          + note)
    return ExpertGemm("coopmat", "matrix units (fp16 products of rows scaled by powers of two, f32 sums)" + note)


def gemm_operands(inputs, params) -> tuple:
    """(x as the GEMM views it [T, R, K], w, the norm weight or None, the quantised format's name or None) of a
    MUL_MAT_ID's inputs and params."""
    fmt_name = params.get("wq")
    n_extra = 2 if "shared_wq" in params else 0
    ins = inputs[:len(inputs) - n_extra - (1 if fmt_name else 0)]
    x, w = ins[0], ins[1]
    g = ins[3] if len(ins) == 4 and params["mode"] == "swiglu" else None
    T, R = inputs[2].shape[:2]
    xv = x.broadcast_to((T, R, x.shape[-1])) if x.shape[1] == 1 else x
    return xv, w, g, fmt_name


def node_gemm(node, device) -> ExpertGemm:
    """expert_gemm for a MUL_MAT_ID graph node (its weights, x, norm weight)."""
    xv, w, g, fmt_name = gemm_operands(node.inputs, node.params)
    K = xv.shape[-1]
    return expert_gemm(device, w.dtype, fmt_name, K, gemm_refusal(w.dtype, fmt_name, K, xv, w, g))


def x_half_scratch(inputs, params) -> dict[str, tuple]:
    """The scratch a grouped MUL_MAT_ID asks for (OpDef.scratch, before the device is known): the X_ROWS
    records of mul_mat_id_coopmat.x_half where the knob is on and the operands suit the cooperative-matrix
    GEMM; whether they are used is x_half_refusal's word when the node is lowered."""
    if not x_half_on():
        return {}
    xv, w, g, fmt_name = gemm_operands(inputs, params)
    if gemm_refusal(w.dtype, fmt_name, xv.shape[-1], xv, w, g):
        return {}
    return {X_HALF_POOL: (x_half_words(xv), "i32")}


def tiling(device, S: int = 0, B: int = 2, wr: int = 2) -> tuple[int, int, int, int, int, int, int]:
    """(BT, BN, WM, WN, BK, EP, NT) from the knobs (device defaults where None) for S route slots in B buckets
    and wr weight rows an output, EP the slots an epilogue pass takes (the most the shared memory holds), NT
    the output tiles a workgroup takes;
    ValueError naming the knob that does not fit (or the device's limits). With mul_mat_id_coopmat.outputs
    None, a GPU takes 64 outputs, or 32 / 16 where its shared memory needs."""
    cpu = device.caps.is_cpu
    bt = COOPMAT_GROUPED["tokens"] or (16 if cpu else min(64, max(16, next_pow2(-(-S // max(B - 1, 1))))))
    wm = COOPMAT_GROUPED["warp_tokens"] or (min(bt, 32) if isinstance(bt, int) else bt)
    wn = COOPMAT_GROUPED["warp_outputs"] or (16 if cpu else 32)
    bk = COOPMAT_GROUPED["k_step"] or 32
    bn = COOPMAT_GROUPED["outputs"]
    if bn is not None:
        return check_tiling(device, bt, bn, wm, wn, bk, wr)
    for bn in (16,) if cpu else (64, 32, 16):
        try:
            return check_tiling(device, bt, bn, wm, wn, bk, wr)
        except ValueError:
            if bn == 16:
                raise
    raise AssertionError("unreachable")


def check_tiling(device, bt, bn, wm, wn, bk, wr: int) -> tuple[int, int, int, int, int, int, int]:
    """(bt, bn, wm, wn, bk, ep, nt) where they fit together and the device, else ValueError naming the knob."""
    if bn is not None and isinstance(wn, int) and isinstance(bn, int) and wn > wr * bn and \
            COOPMAT_GROUPED["warp_outputs"] is None:
        wn = wr * bn                                    # (a default warp no wider than the tile)
    for name, v in (("tokens", bt), ("outputs", bn), ("warp_tokens", wm), ("warp_outputs", wn), ("k_step", bk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v % 16:
            raise ValueError(f"tuning knob 'mul_mat_id_coopmat.{name}' must be a positive multiple of 16, got {v!r}")
    if bt % wm or (wr * bn) % wn:
        raise ValueError(f"tuning knobs mul_mat_id_coopmat: warp_tokens {wm} must divide tokens {bt} and warp_outputs "
                         f"{wn} the tile's {wr * bn} weight rows")
    wg = 32 * (bt // wm) * (wr * bn // wn)
    if wg % (bk // 8):
        raise ValueError(f"tuning knob 'mul_mat_id_coopmat.k_step' = {bk}: its {bk // 8} chunks of 8 inputs must "
                         f"divide the workgroup's {wg} invocations")
    lim = device.caps.limits
    rows = bt + wr * bn
    # the staging buffer (or an epilogue pass's f32 tile, the larger), rows' maxima and shifts, slots, the
    # norm's partial sums and factors, quantised rows' scale byte ranges, wbad
    def smem(ep):
        return (max(rows * (bk + 8) * 2, ep * wr * bn * 4) + rows * 8 + bt * 4 + bt * (bk // 8) * 4 + bt * 4
                + wr * bn * 8 + 4)
    ep = bt
    while ep > wm and smem(ep) > lim.max_shared_memory:
        ep -= wm
    if wg > min(lim.max_workgroup_invocations, lim.max_workgroup_size[0]) or smem(ep) > lim.max_shared_memory:
        raise ValueError(f"tuning knobs mul_mat_id_coopmat: tiles {bt} × {bn} (warps {wm} × {wn}, k step {bk}) need "
                         f"{wg} invocations and {smem(ep)} B of shared memory; {device.name} has "
                         f"{min(lim.max_workgroup_invocations, lim.max_workgroup_size[0])} and {lim.max_shared_memory} B")
    nt = COOPMAT_GROUPED["output_tiles"]
    if isinstance(nt, bool) or not isinstance(nt, int) or nt < 1:
        raise ValueError(f"tuning knob 'mul_mat_id_coopmat.output_tiles' must be an integer ≥ 1, got {nt!r}")
    return bt, bn, wm, wn, bk, ep, nt


def coopmat_grouped_launches(device, kernel: str, node, x, w, route, out, add, g, scale, shared, fmt, mode: str,
                             id_base: int, n_ids: int) -> list[Launch]:
    """The grouped path with the GEMM on the matrix units (kernel "coopmat") or their FMA twin: the routing
    sort and route sum as moe_grouped.grouped_launches makes them (the sort's tiles of this kernel's BT
    route slots), the GEMM mul_mat_id_coopmat.comp over the same route lists, push block and bindings."""
    T, R, _ = route.shape
    E, Nw, _ = w.shape
    wr = 2 if mode == "swiglu" else 1
    cols = Nw // wr
    S, B = T * R, buckets(E, bool(shared))
    bt, bn, wm, wn, bk, ep, nt = tiling(device, S, B, wr)
    tiles = max_tiles(S, B, bt)
    if tiles > MAX_GROUPS:
        raise ValueError(f"MUL_MAT_ID grouped: {tiles} tiles of {bt} route slots exceed {MAX_GROUPS} workgroups; "
                         "raise mul_mat_id_coopmat.tokens or use fewer tokens a call")
    with tuned({"mul_mat_id_grouped.tokens": bt}):      # the sort's tiles: BT route slots
        base = grouped_launches(device, node, x, w, route, out, add, g, scale, shared, fmt, mode, id_base, n_ids)
    at = [i for i, ln in enumerate(base) if ln.shader == "mul_mat_id_grouped"]
    if len(at) != 1:
        raise AssertionError(f"grouped_launches made {[ln.shader for ln in base]}: expected one mul_mat_id_grouped")
    lay = sort_layout(S, B)
    if mode == "sum":
        dst = base[at[0]].args[4]                       # the routes' products (the f32 kernel's output binding)
        d_view = {"d_off": 0, "d_s0": R * cols, "d_s1": cols, "d_s2": 1}
    else:
        dst = out
        d_view = view_fields("d", out.offset, out.strides)
    defs, push = gemm_fields(node, x, w, route, d_view, g, shared, fmt, mode, lay, B, id_base, n_ids)
    if kernel == "coopmat":
        defs["CM_NV"] = 1
    sort = base[at[0]].args[3]
    args = [x, w, route, sort, dst] + ([g] if g is not None else []) + ([scale] if fmt else []) + list(shared or [])
    half = x_half_refusal(kernel, gemm_refusal(w.dtype, fmt.name if fmt else None, x.shape[-1], x, w, g)) is None
    xh = out.graph.scratch(X_HALF_POOL)[:x_half_words(x)] if half else x
    args.append(xh)                                     # (x where X_HALF is 0: never read)
    wg = 32 * (bt // wm) * (wr * bn // wn)
    gemm = Launch("mul_mat_id_coopmat", args, (4,), push, (-(-cols // (bn * nt)), tiles, 1),
                  defines={**defs, **({"X_HALF": 1} if half else {})}, spec=(wg, bt, bn, wm, wn, bk, ep, nt),
                  full_subgroups=kernel == "coopmat", label=base[at[0]].label)
    rows = []
    if half:
        rows = [x_rows_launch(x, g, xh, node, R, bk, base[at[0]].label)]
    return base[:at[0]] + rows + [gemm] + base[at[0] + 1:]


def x_rows_launch(x, g, xh, node, R: int, bk: int, label: str) -> Launch:
    """mul_mat_id_coopmat.x_half's pass (-D X_ROWS): each x row of the view x [T, R, K] (per token where the
    routes share it) scaled, rounded to fp16 and written to xh with its shift and 1/rms (g: the folded norm's
    weight, or None), BK/8 invocations a row as the GEMM's k step bk lays its chunk columns."""
    kp = bk // 8
    per = max(1, min(X_ROWS_PER_GROUP, 256 // kp))
    push = {"rows": x_half_rows(x), "R": R, "K": x.shape[-1], "x_off": x.offset, "x_s0": x.strides[0],
            "x_s1": x.strides[1]}
    defines = {"X_ROWS": 1}
    if g is not None:
        push |= {"g_off": g.offset, "eps": float(node.params["rms_eps"])}
        defines["NORM_X"] = 1
    args = [x] + ([g] if g is not None else []) + [xh]
    return Launch("mul_mat_id_coopmat", args, (len(args) - 1,), push, grid_1d(x_half_rows(x), per), defines=defines,
                  spec=(kp * per, 16, 16, 16, 16, bk), label=label)


def describe(device, T: int = 512, routes: int = 7, experts: int = 257) -> dict:
    """What `info` prints of the grouped MUL_MAT_ID's GEMM on `device` over bf16 experts at DeepSeek-V4-Flash's
    prefill (T tokens, `routes` a token over `experts` with the shared one): its kernel, why, and its tile; whether
    mul_mat_id_coopmat.x_half is used (x_half) and why not (x_half_reason; the reason names it where the knob is
    on but unused)."""
    c = expert_gemm(device)
    why = x_half_refusal(c.kernel)
    reason = c.reason if why in (None, X_HALF_OFF) else f"{c.reason}; mul_mat_id_coopmat.x_half not used: {why}"
    out = {"T": T, "kernel": c.kernel, "reason": reason, "x_half": why is None,
           "x_half_reason": X_HALF_ON if why is None else why}
    if c.kernel != "f32":
        out["tile"] = tiling(device, T * routes, experts + 1)
    return out
