"""MUL_MAT(x[..., T, K], w[..., N, K]) -> [..., T, N] = x @ wᵀ (torch-style linear weight).

Batch dims broadcast; x and w may be any strided views (e.g. a transposed V for attention).
Kernels (shaders/mul_mat.comp), chosen per call by `pick_kernel` unless `kernel=` forces one:
- "gemv" for few tokens: a subgroup-lane cluster per output reduces over K, up to 8 tokens per
  cluster (GPUs: T ≤ 64, or any T when N < 64), or one
  invocation per output on CPU devices (T = 1), where lavapipe runs invocations as SIMD lanes;
- "gemm_regs" (CPU devices such as lavapipe, where shared memory + barrier is slow) or
  "gemm_shared" (GPUs) for more tokens; kernel="gemm" picks between them by device type;
- "coopmat" (shaders/mul_mat_coopmat.comp) from COOPMAT["min_tokens"] tokens over bf16 / f16 / FP8 / FP4
  weights where the device has VK_NV_cooperative_matrix's 16 × 16 × 16 fp16 shape (and
  DSV4_VK_DISABLE_COOPMAT is unset; knob coopmat.auto, on by default): fp16 products of rows scaled by
  powers of two, f32 sums, FP8 block scales applied per block (ops.mul_mat_coopmat, docs/tensor_cores.md);
  "coopmat_fma" forms the same products with FMA on any device (the tests' stand-in).
Weights are f32, bf16, f16 or one of DeepSeek's quantised formats (`QUANT`, params `wq="fp8"` or
`"fp4"`): w is then the i32 tensor of packed codes [..., N, ceil(K / codes a word)] and the last
input the tensor of its E8M0 scale bytes, 4 a word (ops.quant: `quant_arrays` makes both from the
published bytes; `dequantize` is the float64 meaning).
lavapipe, 2 cores, 4096×4096 f32 weight: T=1 gemv 16.7 ms (32.5 ms with 8-lane clusters), gemm_regs
19.4 ms; T=8, N=1024: gemv 13.2 ms, gemm_regs 5.0 ms; gemm_shared 10-30× slower than either.
"""
from dataclasses import dataclass

import numpy as np

from ..core.tuning import knob_table
from .base import (Launch, OpDef, broadcast_shapes, coopmat_unavailable, check_finite, check_params, cluster_lanes,
                   expect, grid_1d, is_cpu, next_pow2, nonempty, register, tensor_fields, unit_last, weight_defines,
                   workgroup_cluster_max, WEIGHT_DTYPES)
from .mul_mat_coopmat import (COOPMAT, COOPMAT_DTYPES, X_HALF_OFF, coopmat_chunk, coopmat_launches,
                              coopmat_tiling, coopmat_weight_refusal, x_half_refusal, x_half_scratch)
from .quant import QUANT, QuantFormat, check_quant, dequantize, quant_fields
from .reduce_rows import reference_rms_norm

GEMV_MAX_T = 8          # TB, the tokens one GEMV cluster carries, is at most this
CPU_GEMV_MAX_T = 1
# GPUs: GEMV up to this many tokens, and at any T when N is below one 64-wide GEMM tile (where the
# H200 measured it faster than the GEMM kernels: tools/bench_primitives.py).
GPU_GEMV_MAX_T = 64
GEMM_TILE_N = 64
F32_KERNELS = ("auto", "gemv", "gemm", "gemm_regs", "gemm_shared")
# the tensor-core kernel: "coopmat" on the matrix units, "coopmat_fma" its data flow and fp16 rounding
# with FMA products (any device; for tests)
COOPMAT_KERNELS = ("coopmat", "coopmat_fma")
KERNELS = F32_KERNELS + COOPMAT_KERNELS
WORKGROUP = 256


@dataclass(frozen=True)
class KernelChoice:
    """The MUL_MAT kernel a call gets (one of KERNELS but "auto" / "gemm") and why."""
    kernel: str
    reason: str


def x_half_note(device, kernel: str, T: int, N: int | None, chunk: int) -> str:
    """What a tensor-core choice's reason adds about coopmat.x_half (x_half_refusal decides): nothing
    where the knob is off."""
    why = x_half_refusal(device, kernel, T, N, chunk)
    if why is None:
        return "; x rounded to fp16 once, by the first pass (coopmat.x_half)"
    return "" if why == X_HALF_OFF else f"; coopmat.x_half not used: {why}"


def pick_kernel(device, T, N=None, kernel="auto", w_dtype="f32", quant=False, norm=False,
                refusal: str | None = None, chunk: int = 8) -> KernelChoice:
    """The one place that decides which kernel a MUL_MAT of T tokens and N outputs gets: the GEMV
    with a folded norm; the tensor-core kernel for T ≥ coopmat.min_tokens where the device has the
    cooperative-matrix shape (coopmat_unavailable), coopmat.auto is on and the weights suit it (bf16,
    f16, FP8 or FP4: `quant` the format's name; `refusal`, from coopmat_weight_refusal, says why
    not); coopmat.emulate: coopmat_fma where the device has no matrix units; else the f32 kernels
    by device type and T. `kernel` forces one (coopmat* only over weights it takes, "coopmat" only
    where the device runs it: ValueError naming what is missing). `chunk`: the inputs the tensor-core
    kernel would load at once (coopmat_chunk; 8 for aligned rows of K % 8 == 0), for what the reason
    says of coopmat.x_half."""
    what = (f"{quant.upper()} " if isinstance(quant, str) else "quantised " if quant else f"{w_dtype} ") + "weights"
    if refusal is None and not quant:
        refusal = coopmat_weight_refusal(device, w_dtype)
    elif refusal is None and isinstance(quant, str):
        refusal = coopmat_weight_refusal(device, w_dtype, QUANT[quant])
    if norm:
        return KernelChoice("gemv", "a folded RMS norm runs in the GEMV")
    if kernel in COOPMAT_KERNELS:
        if refusal:
            raise ValueError(f"MUL_MAT kernel={kernel!r} cannot take these weights: {refusal}")
        why = coopmat_unavailable(device) if kernel == "coopmat" else None
        if why:
            raise ValueError(f"MUL_MAT kernel='coopmat' cannot run on {device.name}: {why} (kernel='coopmat_fma' "
                             "forms the same products with FMA)")
        return KernelChoice(kernel, "asked for" + x_half_note(device, kernel, T, N, chunk))
    reason = "asked for"
    if kernel == "auto":
        if T >= COOPMAT["min_tokens"] and not refusal:
            why = coopmat_unavailable(device)
            if why is None and COOPMAT["auto"]:
                t = coopmat_tiling(device)
                return KernelChoice("coopmat", f"matrix units: T ≥ {COOPMAT['min_tokens']} over {what}, tiles "
                                               f"{t['tokens']} × {t['outputs']} ({device.caps.limits.max_shared_memory}"
                                               f" B of shared memory)" + x_half_note(device, "coopmat", T, N, chunk))
            if why is None:
                why = "coopmat.auto is off (kernel='coopmat' takes the matrix units)"
            elif COOPMAT["emulate"]:
                return KernelChoice("coopmat_fma", f"the matrix units' data flow with FMA products (coopmat.emulate; "
                                                   f"{why})" + x_half_note(device, "coopmat_fma", T, N, chunk))
            reason = f"f32 lanes, since {why}"
        elif T >= COOPMAT["min_tokens"]:
            reason = f"f32 lanes: {refusal}"
        else:
            reason = f"f32 lanes: T < {COOPMAT['min_tokens']} (coopmat.min_tokens)"
        if is_cpu(device):
            gemv = T <= CPU_GEMV_MAX_T
        else:
            gemv = T <= GPU_GEMV_MAX_T or (N is not None and N < GEMM_TILE_N)
        kernel = "gemv" if gemv else "gemm"
    if kernel == "gemm":
        kernel = "gemm_regs" if is_cpu(device) else "gemm_shared"
    return KernelChoice(kernel, reason)


def node_kernel(node, device) -> KernelChoice:
    """The kernel (and why) a MUL_MAT graph node gets on `device`: pick_kernel with the node's tokens,
    outputs, weights and norm (what lower runs, and what tools label a profile with). The quantised
    GEMV without vec4 loads is lowered to a GEMM kernel further on; this gives pick_kernel's word."""
    fmt = QUANT[node.params["wq"]] if "wq" in node.params else None
    inputs = node.inputs[:-1] if fmt else node.inputs
    T, N = node.output.shape[-2:]
    refusal = None
    batch = node.output.shape[:-2]
    w = inputs[1].broadcast_to(batch + (N, inputs[1].shape[-1]))
    if fmt is not None:
        refusal = coopmat_weight_refusal(device, "i32", fmt, w, N,
                                         node.params.get("grid_rows", int(np.prod(inputs[1].shape[:-1]))))
    chunk = coopmat_chunk(inputs[0], w, inputs[0].shape[-1], fmt)
    return pick_kernel(device, T, N, node.params.get("kernel", "auto"), "i32" if fmt else inputs[1].dtype,
                       quant=fmt.name if fmt else False, norm=len(inputs) == 3, refusal=refusal, chunk=chunk)


def describe(device) -> dict:
    """What `info` prints of MUL_MAT: the kernel 512 tokens over bf16, FP8, FP4 and f32 weights [4096, 4096]
    take on `device`, and why (the bf16 choice at the top level, the others under "quant" and "f32")."""
    c = pick_kernel(device, 512, 4096, w_dtype="bf16")
    out = {"kernel": c.kernel, "reason": c.reason, "from_tokens": COOPMAT["min_tokens"]}
    if c.kernel in COOPMAT_KERNELS:
        t = coopmat_tiling(device)
        out["tile"] = [t["tokens"], t["outputs"]]
        out["tiling"] = t
    out["quant"] = {f: {"kernel": q.kernel, "reason": q.reason}
                    for f in QUANT for q in [pick_kernel(device, 512, 4096, w_dtype="i32", quant=f)]}
    f32 = pick_kernel(device, 512, 4096, w_dtype="f32")
    out["f32"] = {"kernel": f32.kernel, "reason": f32.reason}
    return out


def describe_quant(device, N: int = 4096, K: int = 4096) -> dict:
    """What `info` prints of the one-token GEMV over FP8 weights [N, K]: the staged kernel (x in shared
    memory, staged_gemv_launch) or the word loads, and why."""
    launch = staged_gemv_launch(device, QUANT["fp8"], 1, N, K, False)
    if launch is not None:
        return {"N": N, "K": K, "kernel": "staged", "rows": launch[1][2],
                "reason": "x staged in shared memory, 16-byte code loads (knob gemv_quant.x_shared)"}
    on = GEMV_QUANT_ROWS["x_shared"]
    why = ("x does not fit the device's shared memory" if staged_on(device, on) else
           "CPU devices keep it off (knob gemv_quant.x_shared None)" if on is None else "knob gemv_quant.x_shared off")
    return {"N": N, "K": K, "kernel": "word loads", "reason": why}


def vec4_ok(*views):
    """True when every view has k contiguous and every row starting on a 16-byte boundary."""
    for t in views:
        if t.strides[-1] != 1 or t.offset % 4:
            return False
        if any(s % 4 for n, s in zip(t.shape[:-1], t.strides[:-1]) if n > 1):
            return False
    return True


# GEMV loads (8-byte weight loads: 16-byte loads of 8 bf16 were slower in the model). Spread: outputs
# too few to give every one a subgroup of lanes that many are reduced by a whole workgroup each,
# 64-256 lanes, each walking fewer of K's loads one after the other (a chain of memory latencies
# otherwise), faster for those shapes on the H200 (results/h200/gemv_spread_h200.txt).
GEMV_UNROLL = knob_table(
    "gemv",
    unroll=(None, "steps a lane loads before adding them at one token per cluster (None: 4 on GPUs, 1 on CPU devices)"),
    spread=(None, "lanes the device should have at work before outputs take a workgroup each (None: GEMV_SPREAD "
                  "on GPUs; 0: off)"))
GEMV_QUANT_ROWS = knob_table(
    "gemv_quant",
    rows=(1, "output rows a GEMV cluster computes over quantised weights at one token (1, 2 or 4; spec constant "
             "NR): each x load then serves that many rows; 1 until measured on a GPU"),
    load=(4, "bytes of codes a GEMV lane loads a step over quantised weights at one token (spec constant WIDE): "
             "4 (a word, its scale looked up each time) or 16 (a uvec4 and one scale byte, where K % 16 (FP8) "
             "or K % 32 (FP4) is 0 and the rows are 16-byte aligned; else 4); 4 until measured on a GPU"),
    x_shared=(None, "the staged GEMV over quantised weights at one token (-D X_SHARED): x (normalised with a "
                    "norm weight) staged once per workgroup in shared memory, 16-byte code loads, persistent "
                    "clusters; where the rows are whole uvec4s and x fits the device's shared memory (else the "
                    "GEMV above). None: on GPUs (on the H200 1.2-1.5x faster than the GEMV above at the model's "
                    "FP8/FP4 shapes, results/h200/quant/gemv_xshared_h200.txt), off on CPU devices"),
    x_shared_rows=(None, "the staged GEMV: output rows a cluster computes together (1, 2 or 4; spec constant NR), "
                         "each staged x read serving that many rows. None: 4 where N and K are both at least "
                         "4096, else 1 (the fastest of 1/2/4 at each of the model's shapes on the H200)"),
    x_shared_unroll=(2, "the staged GEMV: uvec4 steps of each row a lane loads together (1 to 8; spec constant "
                        "UNROLL)"),
    x_shared_groups=(1024, "the staged GEMV: workgroups per batch item at most (≥ 1); past it clusters loop over "
                           "row blocks, so x is staged fewer times"),
    x_shared_wg=(256, "the staged GEMV: invocations a workgroup (a power of two ≤ 256; at least one cluster): "
                      "smaller ones spread few rows (wq_a, wkv) over more workgroups, each staging x again"),
    x_shared_lanes=(None, "the staged GEMV: lanes a cluster (spec constant LANES; a power of two from 2 to the "
                          "device's smallest subgroup): fewer lanes walk more uvec4s of each row, one reduction "
                          "step fewer per halving, several clusters of a subgroup reading the same staged x. None: "
                          "a whole subgroup on GPUs (at most a row's uvec4s), 1 on CPU devices; unmeasured"),
    x_shared_one_scale=(False, "the staged GEMV over FP8 weights at 2 or 4 rows a cluster: one scale word loaded and "
                               "decoded a uvec4 step for all of the cluster's rows (spec constant ONE_SCALE), where "
                               "each block of them lies in one 128-row block of the scale grid (consecutive rows, "
                               "the matrices' rows and the batch items' first rows multiples of the rows a cluster); "
                               "elsewhere one a row. Same results; unmeasured"))
GEMV_SPREAD = 1 << 18                   # (an H200 holds 132 SMs × 2048 invocations)
GEMV_WG_MAX = 256


def gemv_workgroup_lanes(device, rows: int, K: int) -> int | None:
    """Lanes of a workgroup-wide cluster for each of `rows` GEMV outputs over K, or None for the
    subgroup-lane clusters: where rows × a subgroup falls short of the spread, a power of two up to
    GEMV_WG_MAX lanes and the device's workgroup limits, at least 8 of K per lane (needs subgroup
    arithmetic, as the row ops' workgroup reduction)."""
    spread = GEMV_UNROLL["spread"]
    spread = (0 if is_cpu(device) else GEMV_SPREAD) if spread is None else spread
    wg_max = workgroup_cluster_max(device, GEMV_WG_MAX)
    if not spread or not wg_max:
        return None
    lanes = min(wg_max, next_pow2(-(-spread // max(rows, 1))), 1 << (max(K // 8, 1).bit_length() - 1))
    return lanes if lanes > device.caps.subgroup.max_size else None


def staged_on(device, knob) -> bool:
    """Whether a staged kernel's knob (gemv_quant.x_shared, mul_mat_id.x_shared) turns it on: None, the
    default, on GPUs and off on CPU devices; else as given."""
    return not is_cpu(device) if knob is None else bool(knob)


def check_staged_knobs(prefix: str, rows, unroll, groups) -> None:
    """ValueError naming the knob where a staged kernel's rows (1, 2 or 4), unroll (1 to 8) or groups
    (≥ 1) under `prefix` is not one of its values."""
    if type(rows) is not int or rows not in (1, 2, 4):      # (not True, nor 4.0)
        raise ValueError(f"tuning knob '{prefix}.x_shared_rows' must be 1, 2 or 4, got {rows!r}")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or not 1 <= unroll <= 8:
        raise ValueError(f"tuning knob '{prefix}.x_shared_unroll' must be an integer in [1, 8], got {unroll!r}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"tuning knob '{prefix}.x_shared_groups' must be an integer ≥ 1, got {groups!r}")


def staged_x_vec4s(device, fmt: QuantFormat, K: int, norm: bool) -> int | None:
    """vec4s of x the staged GEMV (mul_mat.comp -D X_SHARED) keeps in shared memory for rows of K
    codes, or None where it cannot run: rows not whole uvec4s of codes (16-byte loads), or x (and
    the norm's per-cluster sums) past the device's maxComputeSharedMemorySize."""
    words = fmt.words(K)
    if words % 4:
        return None
    xs = words * fmt.per_word // 4
    need = 16 * xs + (4 * 256 if norm else 0)
    return xs if need <= device.caps.limits.max_shared_memory else None


def staged_lanes(device, row_uvec4s: int) -> tuple[dict, dict]:
    """cluster_lanes' (defines, launch kwargs) for the staged GEMV over rows of `row_uvec4s` uvec4s of
    codes: by knob gemv_quant.x_shared_lanes, else a whole subgroup at most (one lane on CPU devices).
    ValueError naming the knob where its value is not a power of two from 2 to the device's smallest
    subgroup, or the device cannot reduce such clusters (no subgroup shuffles)."""
    lanes = GEMV_QUANT_ROWS["x_shared_lanes"]
    if lanes is None:
        return cluster_lanes(device, row_uvec4s, per_lane=1, max_lanes=1 if is_cpu(device) else None)
    sg = device.caps.subgroup
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 2 or lanes & (lanes - 1) or lanes > sg.min_size:
        raise ValueError(f"tuning knob 'gemv_quant.x_shared_lanes' must be None or a power of two from 2 to the "
                         f"device's smallest subgroup ({sg.min_size} lanes), got {lanes!r}")
    defines, extra = cluster_lanes(device, lanes, per_lane=1, max_lanes=lanes)
    if defines["LANES"] != lanes:
        raise ValueError(f"tuning knob 'gemv_quant.x_shared_lanes' = {lanes}: clusters of {lanes} lanes need subgroup "
                         f"shuffles, which {device.name} lacks")
    return defines, extra


def rows_share_scales(fmt: QuantFormat, rows: int, push: dict[str, int], w_rows: int) -> bool:
    """Whether every block of `rows` rows a staged GEMV cluster computes (rows n0 .. n0 + rows − 1,
    n0 a multiple of rows, those past N clamped to N − 1) lies in one 128-row block of an FP8 scale
    grid: the rows consecutive (row stride q_kw words), each batch item's first row (w_off, w_s0,
    w_s1 in words; 0 for a broadcast) a multiple of `rows` (which divides 128), and so each matrix's
    rows (q_rows) where the bound tensor of `w_rows` rows holds more than one grid."""
    if fmt.name != "fp8" or rows < 2:
        return False
    kw, unit = push["q_kw"], rows * push["q_kw"]
    return (push["w_s2"] == kw and (push["q_rows"] % rows == 0 or push["q_rows"] >= w_rows)
            and push["w_off"] % unit == 0
            and all(push[s] % unit == 0 for s, n in (("w_s0", "ne0"), ("w_s1", "ne1")) if push[n] > 1))


def staged_gemv_launch(device, fmt: QuantFormat, batch: int, N: int, K: int, norm: bool,
                       push: dict[str, int] | None = None, w_rows: int = 0) -> tuple | None:
    """(defines, spec, grid, push fields, launch kwargs) of the staged GEMV at one token, or None
    where the knob gemv_quant.x_shared is off or it cannot run (staged_x_vec4s). `push`: the
    launch's push fields so far (the weights' view and grid) and `w_rows` the rows of the bound
    weight tensor, for gemv_quant.x_shared_one_scale (rows_share_scales)."""
    if not staged_on(device, GEMV_QUANT_ROWS["x_shared"]):
        return None
    xs = staged_x_vec4s(device, fmt, K, norm)
    if xs is None:
        return None
    nr, unroll, groups, wg = (GEMV_QUANT_ROWS[k] for k in ("x_shared_rows", "x_shared_unroll", "x_shared_groups",
                                                            "x_shared_wg"))
    if nr is None:
        nr = 4 if N >= 4096 and K >= 4096 else 1
    check_staged_knobs("gemv_quant", nr, unroll, groups)
    if isinstance(wg, bool) or not isinstance(wg, int) or wg < 1 or wg > WORKGROUP or wg & (wg - 1):
        raise ValueError(f"tuning knob 'gemv_quant.x_shared_wg' must be a power of two ≤ {WORKGROUP}, got {wg!r}")
    lane_defs, extra = staged_lanes(device, fmt.words(K) // 4)
    wg = max(wg, device.caps.subgroup.max_size if lane_defs["LANES"] > 1 else 1)   # whole subgroups (lanes.glsl)
    clusters = wg // lane_defs["LANES"]
    blocks = -(-N // nr)
    per_item = min(groups, -(-blocks // clusters))
    one = GEMV_QUANT_ROWS["x_shared_one_scale"]
    if not isinstance(one, bool):
        raise ValueError(f"tuning knob 'gemv_quant.x_shared_one_scale' must be True or False, got {one!r}")
    spec: tuple[int, ...] = (wg, unroll, nr, 0, xs)
    if one and push is not None and rows_share_scales(fmt, nr, push, w_rows):
        spec += (1,)                    # ONE_SCALE (spec constant 5)
    defines = {**lane_defs, "X_SHARED": 1}
    return defines, spec, grid_1d(batch * per_item, 1), {"xs_groups": per_item}, extra


def rms_weight(op, x, g, params):
    """Checks the optional RMS-norm weight g of a row-normalising mat-mul (x rows of K values)."""
    if g is None:
        if "rms_eps" in params:
            raise ValueError(f"{op}: rms_eps is given without a norm weight input")
        return
    expect(op, "norm weight g ([K])", g, (x.shape[-1],))
    unit_last(op, "norm weight g", g)
    if "rms_eps" not in params:
        raise ValueError(f"{op}: a norm weight needs rms_eps=<finite number ≥ 0>")
    if check_finite(f"{op} rms_eps", params["rms_eps"]) < 0:
        raise ValueError(f"{op}: rms_eps must be ≥ 0, got {params['rms_eps']!r}")


@register
class MulMat(OpDef):
    """x @ wᵀ over the last two dims: x [..., T, K], w [..., N, K] -> [..., T, N]; batch dims broadcast.
    With a third input g [K] and rms_eps=: RMS_NORM(x, g, rms_eps) @ wᵀ in the same dispatch (the
    GEMV kernel normalises each x row as it reads it; decode's norm → projection pairs).
    With wq="fp8" | "fp4": w holds packed quantised codes and the last input their scale bytes, one
    grid per grid_rows rows (default: w's rows, batch dims included, are one matrix).
    """
    name, n_inputs = "MUL_MAT", None
    dtypes = WEIGHT_DTYPES + ("i32",)   # x f32; w f32, bf16 or f16 (widened to f32 as it is read), or quantised

    def infer(self, inputs, params):
        check_params(self.name, params, ("kernel", "rms_eps", "wq", "grid_rows"))
        quant = "wq" in params
        if len(inputs) - quant not in (2, 3):
            raise ValueError(f"MUL_MAT takes x, w[, norm weight g]{', scale' if quant else ''}; got {len(inputs)} "
                             "inputs")
        nonempty(self.name, inputs)
        inputs, scale = (inputs[:-1], inputs[-1]) if quant else (inputs, None)
        x, w = inputs[:2]
        if params.get("kernel", "auto") not in KERNELS:
            raise ValueError(f"MUL_MAT kernel must be one of {KERNELS}, got {params['kernel']!r}")
        if params.get("kernel") in COOPMAT_KERNELS and not quant and inputs[1].dtype not in COOPMAT_DTYPES:
            raise ValueError(f"MUL_MAT kernel={params['kernel']!r} takes bf16, f16, FP8 or FP4 weights, got "
                             f"{inputs[1].dtype} (fp16 products would round f32 weights)")
        if len(inputs) == 3 and params.get("kernel", "auto") not in ("auto", "gemv"):
            raise ValueError(f"MUL_MAT with a norm weight runs the gemv kernel, got kernel={params['kernel']!r}")
        rms_weight(self.name, x, inputs[2] if len(inputs) == 3 else None, params)
        for i, (t, what) in enumerate(((x, "x [..., T, K]"), (w, "w [..., N, K]"))):
            if t.ndim < 2:
                raise ValueError(f"MUL_MAT: input {i} has shape {t.shape}; expected {what} with at least 2 dims")
        if x.dtype != "f32":
            raise ValueError(f"MUL_MAT: input 0 (x) must be f32, got {x.dtype} (only the weights may be 16-bit)")
        if quant:
            check_quant(self.name, params, w, scale, x.shape[-1], int(np.prod(w.shape[:-1])))
        elif w.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"MUL_MAT: input 1 (w) must be one of {WEIGHT_DTYPES}, got {w.dtype} (quantised "
                             "weights: wq=)")
        elif x.shape[-1] != w.shape[-1]:
            raise ValueError(f"MUL_MAT: K differs: input 0 (x) {x.shape} has K={x.shape[-1]}, "
                             f"input 1 (w) {w.shape} has K={w.shape[-1]}")
        batch = broadcast_shapes(self.name, x.shape[:-2], w.shape[:-2])
        return batch + (x.shape[-2], w.shape[-2]), "f32"

    def scratch(self, inputs, params):
        """coopmat.x_half's fp16 x rows (x_half_scratch) where the node may take the tensor-core kernel: no
        norm weight, bf16 / f16 / quantised weights, kernel coopmat* or auto from coopmat.min_tokens (the
        device, unknown here, may still keep it on the f32 lanes: then the pool is left unused)."""
        fmt = QUANT[params["wq"]] if "wq" in params else None
        inputs = inputs[:-1] if fmt else inputs
        x, w = inputs[:2]
        T, K = x.shape[-2:]
        kernel = params.get("kernel", "auto")
        if len(inputs) == 3 or (fmt is None and w.dtype not in COOPMAT_DTYPES) or not (
                kernel in COOPMAT_KERNELS or (kernel == "auto" and T >= COOPMAT["min_tokens"])):
            return {}
        batch = int(np.prod(broadcast_shapes(self.name, x.shape[:-2], w.shape[:-2])))
        return x_half_scratch(x, w, batch, T, K, fmt)

    def lower(self, node, device):
        out = node.output
        fmt = QUANT[node.params["wq"]] if "wq" in node.params else None
        inputs = node.inputs[:-1] if fmt else node.inputs
        T, N = out.shape[-2:]
        K = inputs[0].shape[-1]
        batch = out.shape[:-2]
        x = inputs[0].broadcast_to(batch + (T, K))
        w = inputs[1].broadcast_to(batch + (N, inputs[1].shape[-1]))
        g = inputs[2] if len(inputs) == 3 else None
        b = (1,) * (2 - len(batch)) + batch
        push = {"ne0": b[0], "ne1": b[1], "T": T, "N": N, "K": K, **tensor_fields("x", x), **tensor_fields("w", w),
                **tensor_fields("d", out)}
        kernel = node_kernel(node, device).kernel
        if kernel in COOPMAT_KERNELS:
            if fmt:
                push |= quant_fields(fmt, K, node.params.get("grid_rows", int(np.prod(inputs[1].shape[:-1]))))
            return coopmat_launches(device, kernel, x, w, out, push, b[0] * b[1], T, N, K, fmt,
                                    node.inputs[-1] if fmt else None)
        aligned = vec4_ok(x, *([g] if g is not None else [])) and (K % 4 == 0 if fmt else vec4_ok(w))
        defines = {"VEC4": 1} if K >= 4 and aligned else {}
        if fmt and kernel == "gemv" and not defines:    # the quantised GEMV variants: vec4 loads, or
            if g is None:                               # one token with the norm folded in
                kernel = pick_kernel(device, T, N, "gemm").kernel
            elif T > 1:
                raise ValueError(f"MUL_MAT over quantised weights with a norm weight and {T} tokens needs K % 4 "
                                 f"== 0 and 16-byte aligned x, g rows; got K={K}")
        extra, args, spec = {}, [x, w, out], (WORKGROUP,)
        if g is not None:
            defines["NORM_X"] = 1
            push |= {"g_off": g.offset, "eps": float(node.params["rms_eps"])}
            args.append(g)
        if fmt:
            push |= quant_fields(fmt, K, node.params.get("grid_rows", int(np.prod(inputs[1].shape[:-1]))))
            args.append(node.inputs[-1])
        if kernel == "gemv":
            # quantised weights: 1 or 8 tokens a cluster (the variants built), a partial block clamped
            tb = min(next_pow2(T), GEMV_MAX_T) if not fmt else (1 if T == 1 else GEMV_MAX_T)
            nr = GEMV_QUANT_ROWS["rows"] if fmt and tb == 1 and "VEC4" in defines else 1
            if nr not in (1, 2, 4):
                raise ValueError(f"tuning knob 'gemv_quant.rows' must be 1, 2 or 4, got {nr!r}")
            rows = b[0] * b[1] * -(-T // tb) * -(-N // nr)
            unroll = GEMV_UNROLL["unroll"] or (1 if is_cpu(device) else 4)
            wg_lanes = gemv_workgroup_lanes(device, rows, K)
            staged = staged_gemv_launch(device, fmt, b[0] * b[1], N, K, g is not None, push,
                                        int(np.prod(inputs[1].shape[:-1]))) \
                if fmt and tb == 1 and "VEC4" in defines else None
            if staged:
                lane_defs, spec, grid, fields, extra = staged
                push |= fields
                defines.update(lane_defs, MODE_GEMV=1, TB=1)
                defines.update(fmt.define())
                return [Launch("mul_mat", args, (2,), push, grid, defines=defines, spec=spec, **extra)]
            if wg_lanes:
                lane_defs, extra = {"LANES_WORKGROUP": 1}, {}
                grid, spec = grid_1d(rows, 1), (wg_lanes, unroll)
            else:
                lane_defs, extra = cluster_lanes(device, K, per_lane=8, max_lanes=1 if is_cpu(device) else None)
                grid, spec = grid_1d(rows, WORKGROUP // lane_defs["LANES"]), (WORKGROUP, unroll)
            defines.update(lane_defs, MODE_GEMV=1, TB=tb)
            if fmt and tb == 1 and "VEC4" in defines:
                load = GEMV_QUANT_ROWS["load"]
                if load not in (4, 16):
                    raise ValueError(f"tuning knob 'gemv_quant.load' must be 4 or 16, got {load!r}")
                wide = load == 16 and K % (16 if fmt.bits == 8 else 32) == 0 and vec4_ok(w)
                spec = spec + (nr, int(wide))   # the rows a cluster, the 16-byte loads (spec constants 2, 3)
        elif kernel == "gemm_regs":
            defines["MODE_GEMM_REGS"] = 1
            grid = grid_1d(b[0] * b[1] * -(-T // 4) * -(-N // 4), WORKGROUP)
        else:
            defines = {"MODE_GEMM_SHARED": 1}
            grid = grid_1d(b[0] * b[1] * -(-T // 64) * -(-N // 64), 1)
        defines.update(fmt.define() if fmt else weight_defines(w))
        return [Launch("mul_mat", args, (2,), push, grid, defines=defines, spec=spec, **extra)]

    def reference(self, x, w, *rest, kernel="auto", rms_eps=None, wq=None, grid_rows=None):
        if wq is not None:
            *rest, scale = rest
            rows = int(np.prod(np.shape(w)[:-1]))
            w = dequantize(wq, w, scale, np.shape(x)[-1], rows // (grid_rows or rows))
        g = rest[0] if rest else None
        x = np.asarray(x, np.float64) if g is None else reference_rms_norm(x, g, rms_eps)
        return np.matmul(x, np.swapaxes(np.asarray(w, np.float64), -1, -2))
