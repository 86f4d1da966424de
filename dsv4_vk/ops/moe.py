"""Mixture of experts: MOE_ROUTE (top-k experts chosen on the device) and MUL_MAT_ID (products with
the chosen experts only), with their float64 references.
"""
import numpy as np

from ..core.tuning import knob_table
from .base import (Launch, OpDef, check_finite, check_flag, check_params, cluster_lanes, expect, grid_1d, is_cpu,
                   next_pow2, nonempty, register, unit_last, view_fields, weight_defines, workgroup_cluster_max,
                   workgroup_pow2, WEIGHT_DTYPES)
from .moe_coopmat import coopmat_grouped_launches, node_gemm, x_half_scratch
from .moe_grouped import expert_fields, expert_kernel, grouped_launches, grouped_scratch
from .mul_mat import check_staged_knobs, rms_weight, staged_on
from .quant import QUANT, check_quant, dequantize
from .reduce_rows import reference_rms_norm

MAX_TOP_K = 64
ROUTERS = ("softmax", "sigmoid")

def reference_route(logits, top_k, router="sigmoid", norm=True, route_scale=1.0, n_shared=0):
    """[T, top_k + n_shared, 2]: (expert id, weight); picks by logit (desc), ties to the lower id."""
    lg = np.asarray(logits, np.float64)
    T, E = lg.shape
    if router == "softmax":
        e = np.exp(lg - lg.max(axis=-1, keepdims=True))
        scores = e / e.sum(axis=-1, keepdims=True)
    else:
        scores = 1.0 / (1.0 + np.exp(-lg))
    out = np.zeros((T, top_k + n_shared, 2))
    order = np.argsort(-lg, axis=-1, kind="stable")[:, :top_k]
    w = np.take_along_axis(scores, order, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    out[:, :top_k, 0], out[:, :top_k, 1] = order, w * route_scale
    out[:, top_k:, 0] = E + np.arange(n_shared)
    out[:, top_k:, 1] = 1.0
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


@register
class MoeRoute(OpDef):
    """MOE_ROUTE(logits [T,E], top_k=, router="softmax"|"sigmoid", norm=True, route_scale=1.0,
    n_shared=0) -> [T, top_k + n_shared, 2]: (expert id as an exact float, weight)."""
    name, n_inputs = "MOE_ROUTE", 1

    def infer(self, inputs, params):
        (lg,) = inputs
        nonempty(self.name, inputs)
        check_params(self.name, params, ("top_k", "router", "norm", "route_scale", "n_shared"))
        expect(self.name, "logits (input 0, [T, experts])", lg, (None, None))
        E = lg.shape[1]
        k, s = params.get("top_k"), params.get("n_shared", 0)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(E, MAX_TOP_K):
            raise ValueError(f"{self.name}: top_k must be an integer in [1, {min(E, MAX_TOP_K)}] (experts: {E}), got {k!r}")
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_TOP_K:
            raise ValueError(f"{self.name}: n_shared must be an integer in [0, {MAX_TOP_K}], got {s!r}")
        if params.get("router", "sigmoid") not in ROUTERS:
            raise ValueError(f"{self.name}: router must be one of {ROUTERS}, got {params['router']!r}")
        check_flag(self.name, params, "norm", True)
        check_finite(f"{self.name} route_scale", params.get("route_scale", 1.0))
        return (lg.shape[0], k + s, 2), "f32"

    def lower(self, node, device):
        (lg,), out = node.inputs, node.output
        prm = node.params
        push = {"T": lg.shape[0], "E": lg.shape[1], **view_fields("l", lg.offset, lg.strides),
                **view_fields("o", out.offset, out.strides), "norm": int(prm.get("norm", True)),
                "route_scale": float(prm.get("route_scale", 1.0))}
        defs = {f"ROUTER_{prm.get('router', 'sigmoid').upper()}": 1}
        return [Launch("moe_route", [lg, out], (1,), push, grid_1d(lg.shape[0], 64), defines=defs,
                       spec=(64, prm["top_k"], prm.get("n_shared", 0)))]

    def reference(self, logits, top_k, router="sigmoid", norm=True, route_scale=1.0, n_shared=0):
        return reference_route(logits, top_k, router, norm, route_scale, n_shared)


# MUL_MAT_ID's loads. The sum is the decode step's slowest weight stream (results/h200/model_bench_v4.txt),
# a chain of R·K/(4·32·unroll) memory latencies per output. Alone, 4 routes with unroll 2 were faster
# than the default (tools/bench_moe.py, results/h200/moe_h200.txt); in the model, as a specialization
# constant, they were slower. Left at 1 until the literal form is measured in the model beside "wg".
MUL_MAT_ID_UNROLL = knob_table(
    "mul_mat_id",
    unroll=(None, "vec4 steps a lane loads before adding them (None: 4 on GPUs, 1 on CPU devices, where "
                  "registers are scarce and loads are cheap)"),
    routes=(None, 'mode="sum"\'s routes loaded together (None: 1; a power of two ≤ 8)'),
    wg=(None, 'mode="sum": lanes of a workgroup-wide cluster per output (None or 0: subgroup-lane clusters)'),
    rows=(None, 'mode="sum" over quantised experts: output rows a cluster (1, 2 or 4; spec constant 2), each x '
                'load serving that many rows (None: 1 until measured on a GPU)'),
    load=(None, "quantised experts: bytes of codes a lane loads a step (4 or 16; spec constant 3): 16, a uvec4 "
                "and one scale byte where K % 16 (FP8) or K % 32 (FP4) is 0 and the rows 16-byte aligned (else "
                "4; the FP8 shared expert beside FP4 ones keeps 4) (None: 4 until measured on a GPU)"),
    x_shared=(None, "quantised experts (beside an FP8 shared expert too): x rows staged in shared memory, 16-byte "
                    "code loads, the next step's loads in flight (mul_mat_id.comp -D X_SHARED), where the rows are "
                    "whole uvec4s and x fits the device's shared memory. None: on GPUs (on the H200 the SwiGLU "
                    "and the weighted sum 1.4-1.9x faster than without, results/h200/quant/moe_xshared_h200.txt), "
                    "off on CPU devices"),
    x_shared_rows=(2, "the staged kernel: outputs a cluster computes together (1, 2 or 4; spec constant XNR)"),
    x_shared_sum_rows=(None, 'the staged sum (mode="sum") alone: outputs a cluster computes together (1, 2 or 4; '
                             'None: x_shared_rows). On the H200 over 65 FP4 experts the sum took 23-24 µs at 4 rows '
                             'against 32.8 at 2 and the SwiGLU 52.8 at 4 against 42.7 at 2 '
                             '(results/h200/quant/moe_xshared_h200.txt); not yet measured in the model'),
    x_shared_unroll=(1, "the staged kernel: uvec4 steps of each row a lane loads together (1 to 8)"),
    x_shared_groups=(1024, 'the staged SwiGLU: workgroups per token at most (≥ 1); past it clusters loop over '
                           '(route, output block)s'),
    x_shared_split=(1, 'the staged sum (mode="sum"): clusters sharing an output block, the routes split among them '
                       'and their sums added in shared memory (a power of two ≤ the clusters a workgroup; spec '
                       'constant XSPLIT): that many times the workgroups. Where every route\'s x is staged at '
                       'once and the clusters\' outputs are at most 256 (else 1). 1 until measured on a GPU'),
    x_shared_heavy_first=(False, "the staged SwiGLU: its clusters take the last route's (route, output block)s first "
                                 "(spec constant XHEAVY; V4_ROUTE puts the shared expert last, whose FP8 rows are "
                                 "twice an FP4 row's bytes), each output computed as without it. Off until measured "
                                 "on a GPU"),
    x_shared_route_groups=(1, 'the staged sum (mode="sum"): the routes in this many groups of consecutive routes (at '
                              'most R), a workgroup per (output block, group) staging only its group\'s x rows, the '
                              'groups\' partial sums added in group order by the output block\'s last workgroup '
                              '(-D ROUTE_GROUPS, spec constant XRGROUPS; an integer ≥ 1, 1: one group). 1 until '
                              'measured on a GPU'),
    x_shared_lanes=(None, "the staged kernels: lanes a cluster (a power of two, capped at the device's smallest "
                          "subgroup and the row's uvec4s of codes), so that a subgroup holds several clusters. None: "
                          "the whole subgroup on GPUs, 1 on CPU devices"))

ROUTE_PARTS_POOL, ROUTE_TICKETS_POOL = "mul_mat_id.route_parts", "mul_mat_id.route_tickets"     # (OpDef.scratch)


def route_groups(R: int) -> int:
    """The staged sum's route groups for R routes (knob mul_mat_id.x_shared_route_groups, checked):
    groups of ceil(R / knob) consecutive routes, as many as it takes to hold the R (none empty)."""
    groups = MUL_MAT_ID_UNROLL["x_shared_route_groups"]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"tuning knob 'mul_mat_id.x_shared_route_groups' must be an integer ≥ 1, got {groups!r}")
    per_group = -(-R // min(groups, R))
    return -(-R // per_group)


def staged_lanes(device) -> int | None:
    """The staged kernels' lanes a cluster at most (knob mul_mat_id.x_shared_lanes, checked; None: no cap
    but the device's subgroup on GPUs, 1 on CPU devices)."""
    lanes = MUL_MAT_ID_UNROLL["x_shared_lanes"]
    if lanes is None:
        return 1 if is_cpu(device) else None
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1 or lanes & (lanes - 1) or lanes > 256:
        raise ValueError(f"tuning knob 'mul_mat_id.x_shared_lanes' must be None or a power of two in [1, 256] "
                         f"(capped at the device's smallest subgroup), got {lanes!r}")
    return lanes


def staged_expert_launch(device, fmt, mode: str, T: int, R: int, N: int, K: int, x_route_stride: int,
                         norm: bool, shared: bool = False) -> tuple | None:
    """(defines, spec, grid, launch kwargs) of MUL_MAT_ID's staged kernel (knob
    mul_mat_id.x_shared) for N outputs (F for the SwiGLU) over K inputs, or None where the knob is off
    or it cannot run: rows not whole uvec4s of codes (beside an FP8 shared expert: K % 32 != 0), or x
    past the device's shared memory (the sum stages as many routes' x rows of its route group at a
    time as fit, at least one). The sum's route groups (route_groups) are spec constant 10: with more
    than one the launch needs the ROUTE_GROUPS define and its scratch (MulMatId.lower)."""
    if not staged_on(device, MUL_MAT_ID_UNROLL["x_shared"]):
        return None
    words = fmt.words(K)
    if words % 4 or (shared and K % 32):
        return None
    nr, unroll, groups = (MUL_MAT_ID_UNROLL[k] for k in ("x_shared_rows", "x_shared_unroll", "x_shared_groups"))
    check_staged_knobs("mul_mat_id", nr, unroll, groups)
    sum_rows = MUL_MAT_ID_UNROLL["x_shared_sum_rows"]
    if sum_rows is not None and (type(sum_rows) is not int or sum_rows not in (1, 2, 4)):
        raise ValueError(f"tuning knob 'mul_mat_id.x_shared_sum_rows' must be None, 1, 2 or 4, got {sum_rows!r}")
    if mode == "sum" and sum_rows is not None:
        nr = sum_rows
    xs = words * fmt.per_word // 4
    heavy = MUL_MAT_ID_UNROLL["x_shared_heavy_first"]
    if not isinstance(heavy, bool):
        raise ValueError(f"tuning knob 'mul_mat_id.x_shared_heavy_first' must be True or False, got {heavy!r}")
    n_groups = route_groups(R) if mode == "sum" else 1
    per_group = -(-R // n_groups)
    max_lanes = staged_lanes(device)
    # beside x the kernel declares 256 floats: the norm's per-cluster sums (the SwiGLU with the norm
    # folded) or the split routes' sums (the sum, split or not); with route groups, last_group.glsl's ticket
    room = device.caps.limits.max_shared_memory - (4 * 256 if norm or mode == "sum" else 0) - 4 * (n_groups > 1)
    rows_staged = min(per_group, room // (16 * xs)) if mode == "sum" else int(16 * xs <= room)
    if rows_staged < 1:
        return None
    lanes, extra = cluster_lanes(device, words // 4, per_lane=1, max_lanes=max_lanes)
    clusters = 256 // lanes["LANES"]
    blocks = -(-N // nr)
    split = MUL_MAT_ID_UNROLL["x_shared_split"]
    if isinstance(split, bool) or not isinstance(split, int) or split < 1 or split & (split - 1):
        raise ValueError(f"tuning knob 'mul_mat_id.x_shared_split' must be a power of two ≥ 1, got {split!r}")
    # the split sums are added in 256 floats of shared memory, a cluster's nr outputs each: no split
    # where the clusters' outputs are more (short rows, few lanes a cluster)
    split = min(split, clusters) if mode == "sum" and rows_staged == per_group and clusters * nr <= 256 else 1
    if mode == "sum":
        per_token = -(-blocks // (clusters // split)) * n_groups
        grid = grid_1d(T * per_token, 1)
    else:
        routes_a_row = R if x_route_stride == 0 else 1
        per_token = min(groups, -(-routes_a_row * blocks // clusters))
        grid = grid_1d(T * (R // routes_a_row) * per_token, 1)
    spec = (256, unroll, 1, 0, nr, xs, rows_staged, groups, split, int(heavy and mode == "swiglu"), n_groups)
    return {**lanes, "X_SHARED": 1}, spec, grid, extra


@register
class MulMatId(OpDef):
    """MUL_MAT_ID(x, w [E,N,K], route [T,R,2][, add [T,N] | norm weight g [K]], mode=):
    mode="swiglu": x [T, 1 or R, K], N = 2F -> [T,R,F] = silu(w[id,:F]·x)·(w[id,F:]·x); with g and
                   rms_eps=, x is RMS_NORM(x, g, rms_eps) (normalised as it is read: one dispatch);
    mode="sum":    x [T,R,K] -> [T,N] = Σ_r weight_r · w[id_r]·x[t,r] (+ add).
    With wq="fp8" | "fp4" (ops.quant.QUANT): w is i32 [E, N, words] of packed codes, one scale grid
    per grid_rows rows (default N: one per expert), and the last input the scale bytes. With
    shared_wq="fp8" (wq="fp4"): two more inputs, the shared expert's FP8 codes [1, N, words] and
    scale bytes (a grid per shared_grid_rows rows), read as expert id E in the same dispatch.
    id_base / n_ids: w holds experts id_base.. of n_ids (a split stack; other ids add 0).
    Kernels (moe_grouped.expert_kernel): from mul_mat_id_grouped.min_tokens tokens the grouped path
    (the routes sorted by expert on the device, one GEMM per expert; ops/moe_grouped.py), below it
    one product per route (mul_mat_id.comp, the decode kernels); the grouped GEMM on the matrix units
    where the device has them (moe_coopmat.expert_gemm: mul_mat_id_coopmat.comp), else on the f32 lanes."""
    name, n_inputs = "MUL_MAT_ID", None
    dtypes = WEIGHT_DTYPES + ("i32",)   # x, route f32; w f32, bf16 or f16 (widened to f32 as it is read), or quantised

    def infer(self, inputs, params):
        check_params(self.name, params, ("mode", "limit", "rms_eps", "wq", "grid_rows", "id_base", "n_ids",
                                          "shared_wq", "shared_grid_rows"))
        quant = "wq" in params
        shared = None
        if "shared_wq" in params:
            if params["shared_wq"] != "fp8" or params.get("wq") != "fp4":
                raise ValueError(f"{self.name}: shared_wq='fp8' (a shared expert in FP8 beside FP4 experts, "
                                 f"wq='fp4') is the one mixed form, got wq={params.get('wq')!r}, "
                                 f"shared_wq={params['shared_wq']!r}")
            if "id_base" in params or "n_ids" in params:
                raise ValueError(f"{self.name}: shared_wq with a split expert stack (id_base / n_ids) is not supported")
            inputs, shared = inputs[:-2], inputs[-2:]
        inputs, scale = (inputs[:-1], inputs[-1]) if quant else (inputs, None)
        mode = params.get("mode")
        if "limit" in params and (mode != "swiglu" or not check_finite(f"{self.name} limit", params["limit"]) > 0):
            raise ValueError(f"{self.name}: limit (the SwiGLU clamp) must be a finite number > 0 with mode='swiglu', "
                             f"got {params['limit']!r} with mode={mode!r}")
        if mode not in ("swiglu", "sum"):
            raise ValueError(f"{self.name}: mode must be 'swiglu' or 'sum', got {mode!r}")
        if len(inputs) not in (3, 4):
            raise ValueError(f"{self.name} mode={mode} takes x, w, route, "
                             f"{'[add]' if mode == 'sum' else '[norm weight g]'}{', scale' if quant else ''}; got "
                             f"{len(inputs) + quant} inputs")
        nonempty(self.name, inputs)
        x, w, route = inputs[:3]
        for i, t in enumerate(inputs):
            if i != 1 and t.dtype != "f32":
                raise ValueError(f"{self.name}: input {i} must be f32, got {t.dtype} (only the weights may be 16-bit)")
        expect(self.name, "route (input 2, [T, routes, 2] from MOE_ROUTE)", route, (None, None, 2))
        T, R, _ = route.shape
        expect(self.name, "w (input 1, [experts, N, K])", w, (None, None, None), w.dtype)
        E, N, K = w.shape
        self.expert_ids(params, E)
        if quant:
            K = x.shape[-1]
            check_quant(self.name, params, w, scale, K, N)
            if shared is not None:
                expect(self.name, "shared expert weight (the second last input, [1, N, words])", shared[0],
                       (1, N, QUANT["fp8"].words(K)), "i32")
                check_quant(self.name, {"wq": "fp8", "grid_rows": params.get("shared_grid_rows", N)}, shared[0],
                            shared[1], K, N)
        elif w.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"{self.name}: input 1 (w) must be one of {WEIGHT_DTYPES}, got {w.dtype} (quantised "
                             "weights: wq=)")
        expect(self.name, f"x (input 0, [T, {'1 or ' if mode == 'swiglu' else ''}routes, K])", x, (T, None, K))
        if x.shape[1] not in ((1, R) if mode == "swiglu" else (R,)):
            raise ValueError(f"{self.name}: x has {x.shape[1]} rows per token, expected "
                             f"{'1 or ' if mode == 'swiglu' else ''}{R} (the routes)")
        for what, t in (("x", x), ("w", w)):
            unit_last(self.name, what, t)
        if mode == "swiglu":
            rms_weight(self.name, x, inputs[3] if len(inputs) == 4 else None, params)
            if N % 2:
                raise ValueError(f"{self.name}: w [experts, 2F, K] needs an even N for gate and up rows, got {N}")
            return (T, R, N // 2), "f32"
        if len(inputs) == 4:
            expect(self.name, "add (input 3, [T, N])", inputs[3], (T, N))
        return (T, N), "f32"

    def scratch(self, inputs, params):
        route, w = inputs[2], inputs[1]
        if expert_kernel(route.shape[0]).kernel != "grouped":
            groups = MUL_MAT_ID_UNROLL["x_shared_route_groups"]
            if params["mode"] != "sum" or "wq" not in params or isinstance(groups, bool) or \
                    not isinstance(groups, int) or groups < 2:
                return {}               # (a bad value is refused by lower, naming the knob)
            # the staged sum's route groups (staged_expert_launch): partials [T, groups, N], a
            # counter per (token, output block), fewer than T·N
            T, R, _ = route.shape
            N = w.shape[1]
            return {ROUTE_PARTS_POOL: (T * route_groups(R) * N, "f32"), ROUTE_TICKETS_POOL: (T * N, "i32", "zeroed")}
        return grouped_scratch(route.shape[0], route.shape[1], w.shape[0], w.shape[1], params["mode"],
                               "shared_wq" in params) | x_half_scratch(inputs, params)

    @staticmethod
    def expert_ids(params, E):
        """(id_base, n_ids) of params: w holds experts id_base .. id_base + E − 1 of n_ids (default
        0 and E: all of them)."""
        base, n = params.get("id_base", 0), params.get("n_ids", E + params.get("id_base", 0))
        for k, v in (("id_base", base), ("n_ids", n)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"MUL_MAT_ID: {k} must be an integer ≥ 0, got {v!r}")
        if base + E > n:
            raise ValueError(f"MUL_MAT_ID: experts id_base {base} + {E} exceed n_ids {n}")
        return base, n

    def lower(self, node, device):
        fmt = QUANT[node.params["wq"]] if "wq" in node.params else None
        shared = node.inputs[-2:] if "shared_wq" in node.params else None
        inputs = node.inputs[:-2] if shared else node.inputs
        scale = inputs[-1] if fmt else None
        inputs = inputs[:-1] if fmt else inputs
        x, w, route = inputs[:3]
        mode = node.params["mode"]
        add = inputs[3] if len(inputs) == 4 and mode == "sum" else None
        g = inputs[3] if len(inputs) == 4 and mode == "swiglu" else None
        out = node.output
        T, R, _ = route.shape
        E, N, _ = w.shape
        K = x.shape[-1]
        if x.shape[1] == 1:
            x = x.broadcast_to((T, R, K))
        id_base, n_ids = (0, E + 1) if shared else self.expert_ids(node.params, E)
        if expert_kernel(T, mode, T * R / (E + (1 if shared else 0)), device, fmt is not None).kernel == "grouped":
            gemm = node_gemm(node, device).kernel
            if gemm != "f32":
                return coopmat_grouped_launches(device, gemm, node, x, w, route, out, add, g, scale, shared, fmt, mode,
                                                id_base, n_ids)
            return grouped_launches(device, node, x, w, route, out, add, g, scale, shared, fmt, mode, id_base, n_ids)
        cols = N // 2 if mode == "swiglu" else N
        wg = MUL_MAT_ID_UNROLL["wg"] if mode == "sum" else None
        wg_max = workgroup_cluster_max(device, 256)
        if wg and wg > 1 and wg_max:
            wg = min(next_pow2(wg), wg_max)
            lanes, extra = {"LANES_WORKGROUP": 1}, {}
        else:
            wg = None
            lanes, extra = cluster_lanes(device, K, per_lane=8, max_lanes=1 if is_cpu(device) else None)
        defs = dict(lanes, **{f"MODE_{mode.upper()}": 1})
        aligned = [x.offset, x.strides[0], x.strides[1], K, g.offset if g is not None else 0]
        if not fmt:                         # (quantised rows are whole words, K % 4 is enough)
            aligned += [w.offset, w.strides[0], w.strides[1]]
        if all(a % 4 == 0 for a in aligned):
            defs["VEC4"] = 1
        o_strides = list(out.strides) if mode == "swiglu" else [out.strides[0], out.strides[1], 0]
        push = {"T": T, "R": R, "N": cols, **expert_fields(node, x, w, g, fmt, shared, id_base, n_ids),
                **view_fields("r", route.offset, route.strides), **view_fields("d", out.offset, o_strides),
                **view_fields("a", *((add.offset, add.strides) if add is not None else (0, (0, 0))))}
        args = [x, w, route] + ([add] if add is not None else []) + [out] + ([g] if g is not None else [])
        out_index = len(args) - 1 - (g is not None)
        if fmt:
            args.append(scale)
        if shared:
            args += list(shared)
        if add is not None:
            defs["HAS_ADD"] = 1
        if g is not None:
            defs["NORM_X"] = 1
        defs.update(fmt.define() if fmt else weight_defines(w))
        if shared:
            defs["SHARED_FP8"] = 1
        nr = (MUL_MAT_ID_UNROLL["rows"] or 1) if mode == "sum" and fmt else 1
        if nr not in (1, 2, 4):
            raise ValueError(f"tuning knob 'mul_mat_id.rows' must be 1, 2 or 4, got {nr!r}")
        items = T * R * cols if mode == "swiglu" else T * -(-cols // nr)
        unroll = MUL_MAT_ID_UNROLL["unroll"] or (1 if is_cpu(device) else 4)
        if mode == "sum":         # a power of two ≤ 8 (the shader's variants), at most R's; quantised: 1
            routes = 1 if fmt else MUL_MAT_ID_UNROLL["routes"] or 1
            defs["ROUTES"] = min(1 << (int(routes).bit_length() - 1), next_pow2(R), 8)
        load = MUL_MAT_ID_UNROLL["load"] or 4
        if load not in (4, 16):
            raise ValueError(f"tuning knob 'mul_mat_id.load' must be 4 or 16, got {load!r}")
        wide = bool(fmt) and load == 16 and "VEC4" in defs and K % (16 if fmt.bits == 8 else 32) == 0 and \
            all(a % 4 == 0 for a in (w.offset, w.strides[0], w.strides[1]))
        rows = (nr, int(wide))      # spec constants 2 (MODE_SUM's rows a cluster) and 3 (16-byte loads)
        staged = staged_expert_launch(device, fmt, mode, T, R, cols, K, x.strides[1], g is not None, bool(shared)) \
            if fmt and "VEC4" in defs else None
        if staged:
            lane_defs, spec, grid, extra = staged
            for k in ("LANES", "LANES_SHUFFLE", "LANES_SUBGROUP_OPS", "LANES_WORKGROUP"):
                defs.pop(k, None)
            defs.update(lane_defs)
            writes = (out_index,)
            if mode == "sum":
                defs["ROUTES"] = 1
                if spec[10] > 1:            # the route groups' partials and last-group counters
                    parts, tickets = (node.output.graph.scratch(p) for p in (ROUTE_PARTS_POOL, ROUTE_TICKETS_POOL))
                    defs["ROUTE_GROUPS"] = 1
                    writes = (out_index, len(args), len(args) + 1)
                    args += [parts, tickets]
                    push |= {"part_off": parts.offset, "cnt_off": tickets.offset}
            return [Launch("mul_mat_id", args, writes, push, grid, defines=defs, spec=spec, **extra)]
        if wg:
            return [Launch("mul_mat_id", args, (out_index,), push, grid_1d(items, 1), defines=defs,
                           spec=(wg, unroll) + rows)]
        return [Launch("mul_mat_id", args, (out_index,), push, grid_1d(items, 256 // defs["LANES"]),
                       defines=defs, spec=(256, unroll) + rows, **extra)]

    def reference(self, x, w, route, *rest, mode=None, limit=None, rms_eps=None, wq=None, grid_rows=None,
                  id_base=0, n_ids=None, shared_wq=None, shared_grid_rows=None):
        if shared_wq is not None:
            *rest, ws, ws_scale = rest
            N = np.shape(ws)[1]
            shared = dequantize(shared_wq, ws, ws_scale, np.shape(x)[-1], N // (shared_grid_rows or N))
        if wq is not None:
            *rest, scale = rest
            E, N = np.shape(w)[:2]
            w = dequantize(wq, w, scale, np.shape(x)[-1], E * N // (grid_rows or N))
        if shared_wq is not None:                       # the shared expert: id E, after the others
            w = np.concatenate([np.asarray(w, np.float64), shared])
        add = rest[0] if rest else None
        if mode == "swiglu" and add is not None:       # the fourth input of swiglu: the norm weight
            x, add = reference_rms_norm(x, add, rms_eps), None
        x, w, route = (np.asarray(a, np.float64) for a in (x, w, route))
        T, R, _ = route.shape
        n_ids = w.shape[0] + id_base if n_ids is None else n_ids
        ids = route[..., 0]
        valid = (ids >= 0) & (ids < n_ids) & (ids == np.floor(ids))
        here = valid & (ids >= id_base) & (ids < id_base + w.shape[0])     # in this part of the experts
        idx = np.where(here, ids - id_base, 0).astype(np.int64)
        xb = np.broadcast_to(x, (T, R, x.shape[-1]))
        y = np.einsum("trnk,trk->trn", w[idx], xb)
        y[valid & ~here] = 0.0
        y[~valid] = np.nan
        if mode == "swiglu":
            F = w.shape[1] // 2
            g, u = y[..., :F], y[..., F:]
            if limit is not None:
                g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
            return silu(g) * u
        out = np.einsum("tr,trn->tn", route[..., 1], y)
        return out if add is None else out + np.asarray(add, np.float64)


SCORING = ("sqrtsoftplus", "sigmoid", "softmax")


def router_scores(logits, scoring):
    """float64 router scores of logits [T, E]: sqrt(softplus), sigmoid, or softmax over the experts."""
    lg = np.asarray(logits, np.float64)
    if scoring == "sqrtsoftplus":
        return np.sqrt(np.logaddexp(0.0, lg))
    if scoring == "sigmoid":
        return 1.0 / (1.0 + np.exp(-lg))
    e = np.exp(lg - lg.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference_v4_route(logits, sel, ids=None, top_k=1, scoring="sqrtsoftplus", route_scale=1.0):
    """[T, top_k + 1, 2] (expert id, weight) as V4_ROUTE computes it; sel is the correction bias [E]
    (top-k by score + bias) or, with ids, the hash table tid2eid [V, top_k]; last route: the shared
    expert (id E, weight 1)."""
    lg = np.asarray(logits, np.float64)
    T, E = lg.shape
    sc = router_scores(lg, scoring)
    if ids is None:
        pick = np.argsort(-(sc + np.asarray(sel, np.float64)), axis=-1, kind="stable")[:, :top_k]
    else:
        pick = np.asarray(sel, np.int64)[np.asarray(ids, np.int64)]
    w = np.take_along_axis(sc, pick, axis=-1)
    out = np.zeros((T, top_k + 1, 2))
    out[:, :top_k, 0] = pick
    out[:, :top_k, 1] = w / (w.sum(axis=-1, keepdims=True) + 1e-20) * route_scale
    out[:, top_k] = (E, 1.0)
    return out


ROUTE_RANK = knob_table(
    "route_rank",
    on=(True, "V4_ROUTE's one-pass ranking (v4_route.comp -D RANK); off: TOP_K rounds of a butterfly"),
    max=(256, "experts the one-pass ranking takes at most (its shared scores; ≤ 256)"))


def route_kernel(device, n_experts: int, hashed: bool) -> str:
    """How V4_ROUTE selects on this device: "serial" (no subgroup arithmetic and shuffles), "rank"
    (bias top-k over at most ROUTE_RANK["max"] experts, one per invocation) or "rounds"."""
    if route_workgroup(device, n_experts) is None:
        return "serial"
    if not hashed and ROUTE_RANK["on"] and n_experts <= min(int(ROUTE_RANK["max"]), 256) and \
            next_pow2(n_experts) <= workgroup_pow2(device, 256):          # one expert per invocation
        return "rank"
    return "rounds"


def route_workgroup(device, n_experts):
    """Workgroup size of V4_ROUTE's one-workgroup-per-token selection (whole subgroups, at most 64 of
    them: its shared arrays), or None where the device lacks the subgroup operations it needs."""
    sg = device.caps.subgroup
    if not sg.supports("basic", "arithmetic", "shuffle") or sg.min_size < 4 or sg.max_size > 256:
        return None
    return max(64 if n_experts <= 1024 else 256, sg.max_size)


def check_route_params(op: str, params: dict, E: int) -> int:
    """top_k (returned), scoring and route_scale of a router over E experts (V4_ROUTE, V4_GATE);
    ValueError naming the op and the parameter otherwise."""
    k = params.get("top_k")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= min(E, 64):
        raise ValueError(f"{op}: top_k must be an integer in [1, {min(E, 64)}], got {k!r}")
    if params.get("scoring", "sqrtsoftplus") not in SCORING:
        raise ValueError(f"{op}: scoring must be one of {SCORING}, got {params['scoring']!r}")
    check_finite(f"{op} route_scale", params.get("route_scale", 1.0))
    return k


@register
class V4Route(OpDef):
    """V4_ROUTE(logits [T,E], bias [E], top_k=, scoring=, route_scale=) or
    V4_ROUTE(logits [T,E], tid2eid [V,top_k] i32, ids [T] i32, ...) -> [T, top_k + 1, 2]:
    DeepSeek-V4's router (shaders/v4_route.comp), the shared expert appended as route top_k."""
    name, n_inputs = "V4_ROUTE", None
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        check_params(self.name, params, ("top_k", "scoring", "route_scale"))
        if len(inputs) not in (2, 3):
            raise ValueError(f"{self.name} takes (logits, bias) or (logits, tid2eid, ids), got {len(inputs)} inputs")
        nonempty(self.name, inputs)
        lg = inputs[0]
        expect(self.name, "logits (input 0, [T, experts])", lg, (None, None))
        T, E = lg.shape
        k = check_route_params(self.name, params, E)
        if len(inputs) == 2:
            expect(self.name, "bias (input 1, [experts])", inputs[1], (E,))
        else:
            expect(self.name, "tid2eid (input 1, [vocab, top_k])", inputs[1], (None, k), "i32")
            expect(self.name, "ids (input 2, [T])", inputs[2], (T,), "i32")
            unit_last(self.name, "tid2eid", inputs[1])
        unit_last(self.name, "logits", lg)
        return (T, k + 1, 2), "f32"

    def lower(self, node, device):
        lg, sel = node.inputs[:2]
        out, prm = node.output, node.params
        hashed = len(node.inputs) == 3
        ids = node.inputs[2] if hashed else None
        push = {"T": lg.shape[0], "E": lg.shape[1], **view_fields("l", lg.offset, lg.strides[:1]), "sel_off": sel.offset,
                "tid_s0": sel.strides[0] if hashed else 0, "ids_off": ids.offset if hashed else 0,
                **view_fields("o", out.offset, out.strides), "route_scale": float(prm.get("route_scale", 1.0))}
        defs = {f"SCORE_{prm.get('scoring', 'sqrtsoftplus').upper()}": 1}
        if hashed:
            defs["HASH"] = 1
        args = [lg, sel] + ([ids] if hashed else []) + [out]
        T, E = lg.shape
        kind = route_kernel(device, E, hashed)
        if kind == "serial":           # no subgroup arithmetic / shuffles: one invocation per token
            return [Launch("v4_route", args, (len(args) - 1,), push, grid_1d(T, 64), defines={**defs, "SERIAL": 1},
                           spec=(64, prm["top_k"]))]
        wg = route_workgroup(device, E)
        if kind == "rank":             # one expert per invocation
            defs["RANK"] = 1
            wg = max(wg, next_pow2(E))
        extra = {"full_subgroups": True} if device.caps.subgroup.full_subgroups else {}
        return [Launch("v4_route", args, (len(args) - 1,), push, grid_1d(T, 1), defines=defs,
                       spec=(wg, prm["top_k"]), **extra)]

    def reference(self, logits, sel, ids=None, top_k=1, scoring="sqrtsoftplus", route_scale=1.0):
        return reference_v4_route(logits, sel, ids, top_k, scoring, route_scale)
