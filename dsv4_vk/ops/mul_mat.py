"""MUL_MAT(x[..., T, K], w[..., N, K]) -> [..., T, N] = x @ wᵀ (torch-style linear weight).

Batch dims broadcast; x and w may be any strided views (e.g. a transposed V for attention).
Kernels (shaders/mul_mat.comp), chosen per call by `pick_kernel` unless `kernel=` forces one:
- "gemv" for few tokens: a subgroup-lane cluster per output reduces over K, up to 8 tokens per
  cluster (GPUs: T ≤ 64, or any T when N < 64), or one
  invocation per output on CPU devices (T = 1), where lavapipe runs invocations as SIMD lanes;
- "gemm_regs" (CPU devices such as lavapipe, where shared memory + barrier is slow) or
  "gemm_shared" (GPUs) for more tokens; kernel="gemm" picks between them by device type.
lavapipe, 2 cores, 4096×4096 f32 weight: T=1 gemv 16.7 ms (32.5 ms with 8-lane clusters), gemm_regs
19.4 ms; T=8, N=1024: gemv 13.2 ms, gemm_regs 5.0 ms; gemm_shared 10-30× slower than either.
"""
import numpy as np

from .base import (Launch, OpDef, broadcast_shapes, check_finite, check_params, cluster_lanes, expect, grid_1d, is_cpu,
                   next_pow2, nonempty, pack_push, register, tensor_push, unit_last, weight_defines,
                   workgroup_cluster_max, WEIGHT_DTYPES)
from .reduce_rows import reference_rms_norm

GEMV_MAX_T = 8          # TB, the tokens one GEMV cluster carries, is at most this
CPU_GEMV_MAX_T = 1
# GPUs: GEMV up to this many tokens, and at any T when N is below one 64-wide GEMM tile (where the
# H200 measured it faster than the GEMM kernels: tools/bench_primitives.py).
GPU_GEMV_MAX_T = 64
GEMM_TILE_N = 64
KERNELS = ("auto", "gemv", "gemm", "gemm_regs", "gemm_shared")
WORKGROUP = 256


def pick_kernel(device, T, kernel="auto", N=None):
    if kernel == "auto":
        if is_cpu(device):
            gemv = T <= CPU_GEMV_MAX_T
        else:
            gemv = T <= GPU_GEMV_MAX_T or (N is not None and N < GEMM_TILE_N)
        kernel = "gemv" if gemv else "gemm"
    if kernel == "gemm":
        kernel = "gemm_regs" if is_cpu(device) else "gemm_shared"
    return kernel


def vec4_ok(*views):
    """True when every view has k contiguous and every row starting on a 16-byte boundary."""
    for t in views:
        if t.strides[-1] != 1 or t.offset % 4:
            return False
        if any(s % 4 for n, s in zip(t.shape[:-1], t.strides[:-1]) if n > 1):
            return False
    return True


# GEMV loads: unroll, the steps a lane loads before adding them at one token per cluster (None: 4
# on GPUs, 1 on CPU devices); spread, the lanes the device should have at work (None: GEMV_SPREAD on
# GPUs; 0: off): outputs too few to give every one a subgroup of lanes that many are reduced by a
# whole workgroup each, 64-256 lanes, each walking fewer of K's loads one after the other (a chain of
# memory latencies otherwise), faster for those shapes on the H200 (results/h200/gemv_spread_h200.txt).
# 8-byte weight loads: 16-byte loads of 8 bf16 were slower in the model. Tests and the benches set them.
GEMV_UNROLL = {"unroll": None, "spread": None}
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
    GEMV kernel normalises each x row as it reads it; decode's norm → projection pairs)."""
    name, n_inputs = "MUL_MAT", None
    dtypes = WEIGHT_DTYPES      # x f32; w f32, bf16 or f16 (widened to f32 as it is read)

    def infer(self, inputs, params):
        if len(inputs) not in (2, 3):
            raise ValueError(f"MUL_MAT takes x, w[, norm weight g]; got {len(inputs)} inputs")
        x, w = inputs[:2]
        nonempty(self.name, inputs)
        check_params(self.name, params, ("kernel", "rms_eps"))
        if params.get("kernel", "auto") not in KERNELS:
            raise ValueError(f"MUL_MAT kernel must be one of {KERNELS}, got {params['kernel']!r}")
        if len(inputs) == 3 and params.get("kernel", "auto") not in ("auto", "gemv"):
            raise ValueError(f"MUL_MAT with a norm weight runs the gemv kernel, got kernel={params['kernel']!r}")
        rms_weight(self.name, x, inputs[2] if len(inputs) == 3 else None, params)
        for i, (t, what) in enumerate(((x, "x [..., T, K]"), (w, "w [..., N, K]"))):
            if t.ndim < 2:
                raise ValueError(f"MUL_MAT: input {i} has shape {t.shape}; expected {what} with at least 2 dims")
        if x.dtype != "f32":
            raise ValueError(f"MUL_MAT: input 0 (x) must be f32, got {x.dtype} (only the weights may be 16-bit)")
        if x.shape[-1] != w.shape[-1]:
            raise ValueError(f"MUL_MAT: K differs: input 0 (x) {x.shape} has K={x.shape[-1]}, "
                             f"input 1 (w) {w.shape} has K={w.shape[-1]}")
        batch = broadcast_shapes(self.name, x.shape[:-2], w.shape[:-2])
        return batch + (x.shape[-2], w.shape[-2]), "f32"

    def lower(self, node, device):
        out = node.output
        T, N = out.shape[-2:]
        K = node.inputs[0].shape[-1]
        batch = out.shape[:-2]
        x = node.inputs[0].broadcast_to(batch + (T, K))
        w = node.inputs[1].broadcast_to(batch + (N, K))
        g = node.inputs[2] if len(node.inputs) == 3 else None
        b = (1,) * (2 - len(batch)) + batch
        push = [b[0], b[1], T, N, K, tensor_push(x), tensor_push(w), tensor_push(out)]
        kernel = "gemv" if g is not None else pick_kernel(device, T, node.params.get("kernel", "auto"), N)
        defines = {"VEC4": 1} if K >= 4 and vec4_ok(x, w, *([g] if g is not None else [])) else {}
        extra, args, spec = {}, [x, w, out], (WORKGROUP,)
        if g is not None:
            defines["NORM_X"] = 1
            push += [g.offset, float(node.params["rms_eps"])]
            args.append(g)
        if kernel == "gemv":
            tb = min(next_pow2(T), GEMV_MAX_T)
            rows = b[0] * b[1] * -(-T // tb) * N
            unroll = GEMV_UNROLL["unroll"] or (1 if is_cpu(device) else 4)
            wg_lanes = gemv_workgroup_lanes(device, rows, K)
            if wg_lanes:
                lane_defs, extra = {"LANES_WORKGROUP": 1}, {}
                grid, spec = grid_1d(rows, 1), (wg_lanes, unroll)
            else:
                lane_defs, extra = cluster_lanes(device, K, per_lane=8, max_lanes=1 if is_cpu(device) else None)
                grid, spec = grid_1d(rows, WORKGROUP // lane_defs["LANES"]), (WORKGROUP, unroll)
            defines.update(lane_defs, MODE_GEMV=1, TB=tb)
        elif kernel == "gemm_regs":
            defines["MODE_GEMM_REGS"] = 1
            grid = grid_1d(b[0] * b[1] * -(-T // 4) * -(-N // 4), WORKGROUP)
        else:
            defines = {"MODE_GEMM_SHARED": 1}
            grid = grid_1d(b[0] * b[1] * -(-T // 64) * -(-N // 64), 1)
        defines.update(weight_defines(w))
        return [Launch("mul_mat", args, (2,), pack_push(*push), grid, defines=defines, spec=spec, **extra)]

    def reference(self, x, w, g=None, kernel="auto", rms_eps=None):
        x = np.asarray(x, np.float64) if g is None else reference_rms_norm(x, g, rms_eps)
        return np.matmul(x, np.swapaxes(np.asarray(w, np.float64), -1, -2))
