"""MUL_MAT_ID's grouped path for prefill (T > 1 tokens): the route slots sorted by expert on the device
(shaders/mul_mat_id_sort.comp), then one GEMM per expert over its slots (mul_mat_id_grouped.comp:
tiles of an expert's routes × outputs staged through shared memory), so that an expert's weights are
read once per tile of its routes rather than once per route; mode="sum" writes each route's product
and sums them per token in route order (mul_mat_id_combine.comp). The decode step (T = 1) keeps the
per-route kernels (mul_mat_id.comp). `expert_kernel` decides which path a MUL_MAT_ID takes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.tuning import knob_table
from .base import Launch, grid_1d, is_cpu, next_pow2, view_fields, weight_defines, workgroup_pow2, MAX_GROUPS
from .quant import quant_fields

GROUPED = knob_table(
    "mul_mat_id_grouped",
    on=(True, "MUL_MAT_ID of at least min_tokens tokens on the grouped kernel (False: the per-route kernels "
              "whatever T, the escape hatch)"),
    min_tokens=(8, "tokens from which MUL_MAT_ID takes the grouped kernel (below: one product per route, the "
                   "decode kernels)"),
    swiglu_min_routes=(32, "on GPUs, the routes a quantised expert gets on average (T · routes / experts) from "
                           "which the SwiGLU takes the grouped kernel (below: one product per route). On the H200, "
                           "FP4 experts (the FP8 shared one beside): at 14 routes (512 tokens, 256 experts) the "
                           "per-route kernels were faster, 20.6 against 26.0 ms, at 55 (64 experts) the grouped one "
                           "2.4x; the sum took the grouped one at both, and bf16 experts at 14 routes too"),
    tokens=(None, "route slots of a tile, BT (None: on GPUs the routes an expert gets on average as a power of "
                  "two within 16..64, a tile mostly full at any T and expert count; 16 on CPU devices)"),
    outputs=(None, "outputs of a tile, BN (None: 64 on GPUs, 16 on CPU devices)"),
    k_step=(None, "inputs staged a step, BK (None: 32 on GPUs, 16 on CPU devices; a divisor of the workgroup "
                  "size)"),
    thread_tokens=(4, "route slots an invocation computes, TM (a divisor of BT)"),
    thread_outputs=(4, "outputs an invocation computes, TN (a divisor of BN)"),
    sort_chunk=(256, "route slots the sort ranks at a time (a block staged in shared memory; a slot's rank "
                     "scans the block's earlier slots, so cost grows with it)"),
    literal=(False, "the f32 grouped GEMM's per-invocation arrays with literal sizes (-D LITERAL_ARRAYS: vec4 "
                    "rows of bf16 experts or FP4 ones beside the FP8 shared expert, TM ≤ 8, TN · rows ≤ 16) "
                    "instead of sizes from specialization constants, which a driver may keep in memory: not yet "
                    "measured, so off"),
    prefetch=(False, "the f32 grouped GEMM with register double-buffered staging (-D PREFETCH: the next k step's "
                     "global loads issued before the step's products, decoded and stored after them; the same "
                     "formats as literal, x elements and weight vec4s an invocation stages ≤ 16 each): the same "
                     "sums, more registers; not yet measured, so off"))
# -D LITERAL_ARRAYS and -D PREFETCH of mul_mat_id_grouped.comp: the literal sizes (PREFETCH: the most
# x elements and weight vec4s an invocation keeps a step ahead), and the weight formats they are declared for
LITERAL_MAX = {"tm": 8, "tnw": 16, "nx": 16, "nw": 16}
LITERAL_FORMATS = ({"W_BF16"}, {"W_FP4", "SHARED_FP8"})

SORT_POOL, ROUTES_POOL = "mul_mat_id.sort", "mul_mat_id.routes"


@dataclass(frozen=True)
class ExpertKernel:
    """The MUL_MAT_ID kernel a call gets ("grouped" or "per_route") and why."""
    kernel: str
    reason: str


def expert_kernel(T: int, mode: str = "sum", routes_per_expert: float | None = None,
                  device=None, quantised: bool = False) -> ExpertKernel:
    """The one place that decides MUL_MAT_ID's kernel for T tokens (the tuning in effect). Without a
    device (a graph's working memory, known when it is built) it answers for the sum, whose choice is
    the same on every device; with one, a GPU's SwiGLU over quantised experts that get few routes each
    keeps the per-route kernels (knob mul_mat_id_grouped.swiglu_min_routes)."""
    if not GROUPED["on"]:
        return ExpertKernel("per_route", "mul_mat_id_grouped.on is off")
    if T < GROUPED["min_tokens"]:
        return ExpertKernel("per_route", f"T = {T} < mul_mat_id_grouped.min_tokens = {GROUPED['min_tokens']}")
    least = GROUPED["swiglu_min_routes"]
    if isinstance(least, bool) or not isinstance(least, (int, float)) or least < 0:
        raise ValueError(f"tuning knob 'mul_mat_id_grouped.swiglu_min_routes' must be a number ≥ 0, got {least!r}")
    if mode == "swiglu" and quantised and routes_per_expert is not None and device is not None \
            and not is_cpu(device) and routes_per_expert < least:
        return ExpertKernel("per_route", f"the SwiGLU's experts get {routes_per_expert:.1f} routes each on average, "
                                         f"< mul_mat_id_grouped.swiglu_min_routes = {least}")
    return ExpertKernel("grouped", f"T = {T} ≥ mul_mat_id_grouped.min_tokens: one GEMM per expert's routes")


def describe(device, T: int = 512, routes: int = 7, experts: int = 257) -> dict:
    """What `info` prints of MUL_MAT_ID on `device` at DeepSeek-V4-Flash's prefill (T tokens, 6 routed
    of 256 experts and the shared one): its kernel and why, and the grouped kernel's tile."""
    c = expert_kernel(T)
    out = {"T": T, "routes": routes, "kernel": c.kernel, "reason": c.reason}
    if c.kernel == "grouped":
        out["tile"] = tile_shape(device, T * routes, experts + 1)
    q = expert_kernel(T, "swiglu", T * routes / experts, device, quantised=True)
    out["swiglu_quantised"] = {"experts": experts, "kernel": q.kernel, "reason": q.reason}
    return out


def sort_layout(S: int, B: int) -> dict[str, int]:
    """Offsets (i32 elements) of the sort's result for S route slots in B buckets (mul_mat_id_sort.comp),
    its tile table sized for tiles of any BT ≥ 1, and `size`."""
    cnt = 1
    lay = {"CNT": cnt, "OFF": cnt + B, "TOFF": cnt + 2 * B, "TILE0": cnt + 3 * B}
    lay["LIST0"] = lay["TILE0"] + 3 * max_tiles(S, B, 1)
    lay["size"] = lay["LIST0"] + S
    return lay


def max_tiles(S: int, B: int, bt: int) -> int:
    """Tiles of at most bt slots that S slots in B buckets make at most (a partial tile per bucket)."""
    return S // bt + min(B, S)


def buckets(E: int, shared: bool) -> int:
    """The sort's buckets: the experts this dispatch holds (E, the shared one too), and the rest."""
    return E + int(shared) + 1


def grouped_scratch(T: int, R: int, E: int, N: int, mode: str, shared: bool) -> dict[str, tuple[int, str]]:
    """MUL_MAT_ID's working memory on the grouped path: the sort's result, and for mode="sum" the
    routes' products [T, R, N] (N: w's rows)."""
    out = {SORT_POOL: (sort_layout(T * R, buckets(E, shared))["size"], "i32")}
    if mode == "sum":
        out[ROUTES_POOL] = (T * R * N, "f32")
    return out


def tile_shape(device, S: int = 0, B: int = 2, wr: int = 2) -> tuple[int, int, int, int, int]:
    """(BT, BN, BK, TM, TN) from the knobs (device defaults where None) for S route slots in B
    buckets and wr weight rows an output (2: the SwiGLU's gate and up), checked: ValueError naming the
    knob that does not fit."""
    cpu = is_cpu(device)
    bt = GROUPED["tokens"] or (16 if cpu else min(64, max(16, next_pow2(-(-S // max(B - 1, 1))))))
    bn = GROUPED["outputs"] or (16 if cpu else 64)
    bk = GROUPED["k_step"] or (16 if cpu else 32)
    tm, tn = GROUPED["thread_tokens"], GROUPED["thread_outputs"]
    for name, v in (("tokens", bt), ("outputs", bn), ("k_step", bk), ("thread_tokens", tm), ("thread_outputs", tn)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"tuning knob 'mul_mat_id_grouped.{name}' must be an integer ≥ 1, got {v!r}")
    if bt % tm or bn % tn:
        raise ValueError(f"tuning knobs mul_mat_id_grouped: thread_tokens {tm} must divide tokens {bt} and "
                         f"thread_outputs {tn} outputs {bn}")
    if bk % 4:
        raise ValueError(f"tuning knob 'mul_mat_id_grouped.k_step' must be a multiple of 4 (tile rows of vec4s), "
                         f"got {bk}")
    wg = (bt // tm) * (bn // tn)
    lim = device.caps.limits
    if wg > min(lim.max_workgroup_invocations, lim.max_workgroup_size[0]):
        raise ValueError(f"tuning knobs mul_mat_id_grouped: (tokens / thread_tokens) · (outputs / thread_outputs) "
                         f"= {wg} invocations, past this device's workgroup limit")
    if wg % bk or (bt * bk) % wg:
        raise ValueError(f"tuning knobs mul_mat_id_grouped: k_step {bk} must divide the workgroup ({wg} "
                         f"invocations), and tokens · k_step ({bt * bk}) be a multiple of it")
    smem = 16 * (bt + bn * wr) * (bk // 4 + 1) + 4 * bt
    if smem > lim.max_shared_memory:
        raise ValueError(f"tuning knobs mul_mat_id_grouped: the tiles take {smem} bytes of shared memory, past "
                         f"this device's {lim.max_shared_memory}")
    return bt, bn, bk, tm, tn


def gemm_fields(node, x, w, route, d_view: dict, g, shared, fmt, mode: str, lay: dict, B: int, id_base: int,
                n_ids: int) -> tuple[dict, dict]:
    """The defines and push block of a grouped GEMM (mul_mat_id_grouped.comp and mul_mat_id_coopmat.comp
    take the same ones): the mode, weight type, shared FP8 expert and folded norm; shapes, views, the
    sort's layout and the quantised weights' fields. d_view: where the GEMM writes (the output, or the
    routes' products of the sum)."""
    R, Nw = route.shape[1], w.shape[1]
    defs: dict = {f"MODE_{mode.upper()}": 1}
    defs.update(fmt.define() if fmt else weight_defines(w))
    if shared:
        defs["SHARED_FP8"] = 1
    if g is not None:
        defs["NORM_X"] = 1
    push = {"R": R, "N": Nw // 2 if mode == "swiglu" else Nw, **expert_fields(node, x, w, g, fmt, shared, id_base, n_ids),
            "r_off": route.offset, "r_s0": route.strides[0], "r_s1": route.strides[1], **d_view,
            "s_off": 0, "TILE0": lay["TILE0"], "LIST0": lay["LIST0"], "EL": B - 1}
    return defs, push


def expert_fields(node, x, w, g, fmt, shared, id_base: int, n_ids: int) -> dict:
    """The push fields every MUL_MAT_ID kernel takes alike (the per-route ones and the grouped GEMMs):
    K, the experts held (E, id_base, n_ids), x's and w's views, the SwiGLU's limit, the folded norm's
    weight and eps, the quantised weights' fields and the shared FP8 expert's scale-grid rows."""
    E, Nw, K = w.shape[0], w.shape[1], x.shape[-1]
    push = {"K": K, "E": E, "id_base": id_base, "n_ids": n_ids,
            **view_fields("x", x.offset, x.strides[:2]), **view_fields("w", w.offset, w.strides[:2]),
            "limit": float(node.params.get("limit", np.inf))}
    if g is not None:
        push |= {"g_off": g.offset, "eps": float(node.params["rms_eps"])}
    if fmt:
        push |= quant_fields(fmt, K, node.params.get("grid_rows", Nw))
    if shared:
        push["s_rows"] = node.params.get("shared_grid_rows", Nw)
    return push


def _staged_per_invocation(defs: dict, bt: int, bn: int, bk: int, wg: int, wr: int) -> tuple[int, int] | None:
    """(x elements, weight vec4s) an invocation of the f32 grouped GEMM stages a step, or None where
    the defines have no -D LITERAL_ARRAYS / -D PREFETCH variant (vec4 rows of the formats
    LITERAL_FORMATS names)."""
    fmt = {d for d in defs if d.startswith("W_") or d == "SHARED_FP8"}
    if "VEC4" not in defs or fmt not in LITERAL_FORMATS:
        return None
    return -(-bt * bk // wg), -(-bn * wr * bk // 4 // wg)


def prefetch_fits(defs: dict, bt: int, bn: int, bk: int, wg: int, wr: int) -> bool:
    """Whether the f32 grouped GEMM has a -D PREFETCH variant for these defines (those of
    LITERAL_ARRAYS) and the registers it keeps a step ahead stay within LITERAL_MAX's nx and nw (past
    them the doubled staging would spill rather than overlap)."""
    staged = _staged_per_invocation(defs, bt, bn, bk, wg, wr)
    return staged is not None and staged[0] <= LITERAL_MAX["nx"] and staged[1] <= LITERAL_MAX["nw"]


def literal_fits(defs: dict, bt: int, bn: int, bk: int, tm: int, tn: int, wg: int, wr: int) -> bool:
    """Whether the f32 grouped GEMM has a -D LITERAL_ARRAYS variant for these defines (vec4 rows of the
    formats LITERAL_FORMATS names) and its literal sizes hold this tiling's arrays: the staging ones
    (as prefetch_fits bounds them) and the accumulators."""
    return prefetch_fits(defs, bt, bn, bk, wg, wr) and tm <= LITERAL_MAX["tm"] and tn * wr <= LITERAL_MAX["tnw"]


def grouped_launches(device, node, x, w, route, out, add, g, scale, shared, fmt, mode: str, id_base: int,
                     n_ids: int) -> list[Launch]:
    """MUL_MAT_ID's grouped path: the sort, the grouped GEMM, and for mode="sum" the route sum.
    x [T, R, K] (a stride-0 view where the routes share a row), w and route as MUL_MAT_ID takes them,
    out its output, add / g (norm weight) / scale (quantised weights' scale bytes) / shared (the FP8
    shared expert's codes and scale bytes) or None, fmt a QuantFormat or None; w holds experts
    id_base .. of n_ids."""
    graph = out.graph
    T, R, _ = route.shape
    E, Nw, _ = w.shape
    K = x.shape[-1]
    cols = Nw // 2 if mode == "swiglu" else Nw
    S, B = T * R, buckets(E, bool(shared))
    bt, bn, bk, tm, tn = tile_shape(device, S, B, 2 if mode == "swiglu" else 1)
    tiles = max_tiles(S, B, bt)
    if tiles > MAX_GROUPS:
        raise ValueError(f"MUL_MAT_ID grouped: {tiles} tiles of {bt} route slots exceed {MAX_GROUPS} workgroups; "
                         "raise mul_mat_id_grouped.tokens or use fewer tokens a call")
    lay = sort_layout(S, B)
    sort = graph.scratch(SORT_POOL)
    sort_wg = workgroup_pow2(device, 256)
    chunk = GROUPED["sort_chunk"]
    room = device.caps.limits.max_shared_memory - 12 * B          # the sort's counters: 3 words a bucket
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= room // 4:
        raise ValueError(f"tuning knob 'mul_mat_id_grouped.sort_chunk' must be an integer ≥ 1 whose 4-byte slots fit "
                         f"the device's shared memory beside {B} buckets' counters, got {chunk!r}")
    sort_push = {"T": T, "R": R, "E": E, "id_base": id_base, "n_ids": n_ids, "shared_id": int(bool(shared)),
                 "r_off": route.offset, "r_s0": route.strides[0], "r_s1": route.strides[1], "s_off": 0, "BT": bt,
                 **{k: lay[k] for k in ("CNT", "OFF", "TOFF", "TILE0", "LIST0")}}
    launches = [Launch("mul_mat_id_sort", [route, sort], (1,), sort_push, (1, 1, 1), spec=(sort_wg, chunk, B))]
    if mode == "sum":
        dst = graph.scratch(ROUTES_POOL)
        d_view = {"d_off": 0, "d_s0": R * cols, "d_s1": cols, "d_s2": 1}
    else:
        dst = out
        d_view = view_fields("d", out.offset, out.strides)
    defs, push = gemm_fields(node, x, w, route, d_view, g, shared, fmt, mode, lay, B, id_base, n_ids)
    if K % 4 == 0 and (fmt is not None or all(a % 4 == 0 for a in (w.offset, *w.strides[:2]))):
        defs["VEC4"] = 1
    args = [x, w, route, sort, dst] + ([g] if g is not None else []) + ([scale] if fmt else []) + list(shared or [])
    wg = (bt // tm) * (bn // tn)
    wr = 2 if mode == "swiglu" else 1
    if GROUPED["literal"] and literal_fits(defs, bt, bn, bk, tm, tn, wg, wr):
        defs["LITERAL_ARRAYS"] = 1
    if GROUPED["prefetch"] and prefetch_fits(defs, bt, bn, bk, wg, wr):
        defs["PREFETCH"] = 1
    launches.append(Launch("mul_mat_id_grouped", args, (4,), push, (-(-cols // bn), tiles, 1), defines=defs,
                           spec=(wg, bt, bn, bk, tm, tn)))
    if mode == "sum":
        cpush = {"T": T, "R": R, "N": cols, "E": E, "id_base": id_base, "n_ids": n_ids,
                 "shared_id": int(bool(shared)), **view_fields("r", route.offset, route.strides),
                 "y_off": 0, "y_s0": R * cols, "y_s1": cols, **view_fields("d", out.offset, out.strides),
                 **view_fields("a", *((add.offset, add.strides) if add is not None else (0, (0, 0))))}
        cargs = [dst, route] + ([add] if add is not None else []) + [out]
        launches.append(Launch("mul_mat_id_combine", cargs, (len(cargs) - 1,), cpush, grid_1d(T * cols, 256),
                               defines={"HAS_ADD": 1} if add is not None else {}, spec=(256,)))
    return launches


def reference_sort(route, E: int, id_base: int = 0, n_ids: int | None = None, shared: bool = False,
                   bt: int = 1) -> dict[str, np.ndarray | int]:
    """What mul_mat_id_sort.comp computes, in numpy: counts and exclusive offsets per bucket, the
    slots t·R + r ordered by bucket (stable), and the tiles (bucket, first, slots) of at most bt."""
    ids = np.asarray(route, np.float64)[..., 0].reshape(-1)
    n_ids = E + id_base + int(shared) if n_ids is None else n_ids
    B = buckets(E, shared)
    valid = (ids >= 0) & (ids < n_ids) & (ids == np.floor(ids))
    b = np.full(ids.shape, B - 1, np.int64)
    iv = np.where(valid, ids, -1).astype(np.int64)
    local = valid & (iv >= id_base) & (iv < id_base + E)
    b[local] = iv[local] - id_base
    if shared:
        b[valid & (iv == n_ids - 1)] = E
    counts = np.bincount(b, minlength=B)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    order = np.argsort(b, kind="stable")
    tiles = [(k, int(offsets[k]) + j, min(bt, int(counts[k]) - j)) for k in range(B)
             for j in range(0, int(counts[k]), bt)]
    return {"counts": counts, "offsets": offsets, "list": order, "tiles": np.array(tiles, np.int64).reshape(-1, 3)}
