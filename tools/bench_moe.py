#!/usr/bin/env python3
"""GPU time of MUL_MAT_ID at one token (the decode step's experts) at DeepSeek-V4-Flash's widths,
bf16 experts or the published FP4 ones (--formats bf16,fp4: E2M1 codes and a scale per 32
inputs; fp8 too), in GB/s of the expert bytes read (codes and scales) and as a share of the
measured copy bandwidth and of the time to read the same bytes alone (floor.read_us, the plainest
read kernel over as many copies as the route sets cycled),
with its load knobs side by side in one run (tuning knobs mul_mat_id.*): the steps in flight per
lane (unroll) and, for the weighted sum, the routes whose rows are loaded together (routes) and
the lanes of a workgroup-wide cluster per output (wg; 0: subgroup-lane clusters). Each
row: median over replays of a recording that runs the op `--repeat` times back to back (a
timestamp before and after only), after the clock warm-up.

    . .vkdev/enter.sh; python3 tools/bench_moe.py --json $OUT/moe.json
    . .vkdev/enter.sh; python3 tools/bench_moe.py --formats fp4 --experts 256 --routes-per-token 6 \
        --routes 1 --unroll 4,8,16 --rows 1,2,4 --json $OUT/moe_fp4.json
    . .vkdev/enter.sh; python3 tools/bench_moe.py --formats fp4 --experts 256 --routes-per-token 6 \
        --routes 1 --wg 0 --unroll 4 --load 4,16 --json $OUT/moe_fp4_load.json
    . .vkdev/enter.sh; python3 tools/bench_moe.py --formats bf16,fp4 --experts 65 --routes-per-token 7 \
        --routes 1 --wg 0 --unroll 4 --x-shared 0,1 --xs-rows 1,2,4 --xs-unroll 2 --json $OUT/moe_xshared.json
    . .vkdev/enter.sh; python3 tools/bench_moe.py --prefill 128,512,2048 --formats bf16,fp8,fp4+fp8 \
        --json $OUT/moe_prefill.json
    . .vkdev/enter.sh; python3 tools/bench_moe.py --prefill 512,2048 --formats bf16,fp4+fp8 \
        --cm-tiles "16x64x16x32x32;16x64x16x32x32x4;16x128x16x32x32;64x64x32x32x32;64x64x32x32x64;128x64x64x32x32" \
        --json $OUT/moe_prefill_coopmat.json
(quantised experts load one route at a time: --routes 1). --cold: the one-token rows' ops cycle
through disjoint route sets, so each reads its experts from device memory as the decode step does
(the same routes back to back leave them partly in the L2 cache). Quantised experts: --x-shared 0,1 puts
MUL_MAT_ID's staged kernel (knob mul_mat_id.x_shared: x in shared memory, 16-byte code loads) beside
the other one in the same run, its knobs (mul_mat_id.x_shared_rows / _unroll / _groups) swept by
--xs-rows, --xs-unroll, --xs-groups; the other knobs apply to the other rows only. --xs-split sweeps the
staged sum's routes split among a workgroup's clusters (knob mul_mat_id.x_shared_split; 1: no split; each row
prints the split it got and the routes' x rows staged at a time: no split unless every route's x fits):

    . .vkdev/enter.sh; python3 tools/bench_moe.py --formats fp4 --experts 65 --routes-per-token 7 \
        --x-shared 1 --xs-rows 1,2,4 --xs-unroll 1,2 --xs-split 1,2,4,8 --json $OUT/moe_split.json

--xs-heavy 0,1 puts the staged SwiGLU with the last route's blocks first (knob mul_mat_id.x_shared_heavy_first)
beside the route-major order, --xs-route-groups sweeps the staged sum's route groups (knob
mul_mat_id.x_shared_route_groups: a workgroup per output block and group, the groups' partials added by the
last; each row prints the groups it got), --xs-lanes the staged kernels' lanes a cluster (knob
mul_mat_id.x_shared_lanes; 0: the knob's default). --shared-fp8 (--formats fp4, one token): the model's
layout, --experts − 1 FP4 routed experts and an FP8 shared expert in its own tensors (shared_wq="fp8"),
--routes-per-token − 1 routed routes and the shared one last as V4_ROUTE orders them (with --cold one
shared expert per route set, as each layer has its own); every row's result is checked against float64
over the dequantised experts (NMSE printed, ≤ 1e-8 asserted; not in --ablate's children):

    . .vkdev/enter.sh; python3 tools/bench_moe.py --cold --formats fp4 --shared-fp8 --experts 9 --routes-per-token 7 \
        --x-shared 1 --xs-rows 2 --xs-unroll 1 --xs-heavy 0,1 --xs-route-groups 1,2,4,7 --xs-lanes 0,8,16 \
        --json $OUT/moe_decode.json

--ablate nocvt,nodecode,nox,nofma,noload,nostage: after the table, the staged rows again (same formats and
knobs, --cold) with a part of the staged kernels (SwiGLU and sum) removed, each in a child process
(tools/ablation.py; the results are wrong on purpose, only the time is read), printed as
`ablation NAME <row>`:

    . .vkdev/enter.sh; python3 tools/bench_moe.py --cold --formats fp4 --experts 65 --routes-per-token 7 \
        --x-shared 1 --xs-unroll 1 --ablate nocvt,nodecode,nox,nofma,noload,nostage --json $OUT/moe_ablate.json

--prefill T,T,...: MUL_MAT_ID over prefill chunks of T tokens instead (top-k = --routes-per-token − 1
of --experts − 1 routed experts, uniformly random, and the shared expert), the per-route kernels
(mul_mat_id.comp) beside the grouped ones (ops/moe_grouped.py: the routing sort, the grouped GEMM
and, for the sum, the route sum) with the GEMM on the f32 lanes ("grouped") and, where the device has
them, on the matrix units ("coopmat", ops/moe_coopmat.py; --emulate: its FMA twin "coopmat_fma"
elsewhere) in ms and effective TFLOPS (2 · T · routes · N · K), --tiles sweeping the f32 grouped
kernel's tile knobs (BTxBNxBKxTMxTN, a sixth field 1 for its literal-size arrays, a seventh 1 for its
staging loaded a step ahead), --cm-tiles the coopmat one's (BTxBNxWMxWNxBK[xNT]; NMSE ≤ 1e-5
asserted for it: fp16 products); --check-tokens tokens of each result
(the last; with more, spread down to the first) checked against float64 over the dequantised experts (NMSE printed, ≤ 1e-8 asserted).
Formats bf16, fp8, fp4 (the shared expert stacked after the routed ones) and fp4+fp8 (FP4 routed
experts, the FP8 shared expert in its own tensor, as DeepSeek publishes them). Weights past
maxStorageBufferRange (bf16 with 256 experts) are not split here: keep --experts ≤ 65 for bf16.
--prefill-kernels picks the kernels timed (per_route, grouped, coopmat). --cm-x-half 0,1 times the coopmat
rows without and with mul_mat_id_coopmat.x_half (x rounded to fp16 once, by a pass before the GEMM; the pass
is in the time), each tiling both ways:

    . .vkdev/enter.sh; python3 tools/bench_moe.py --prefill 512,2048 --formats bf16,fp4+fp8 --prefill-kernels coopmat \
        --cm-tiles default --cm-x-half 0,1 --json $OUT/moe_prefill_xhalf.json

--prefill ... --cm-tiles ... --ablate nomma,nostage,noload,noscan,nowscan: after the table, the matrix-unit rows
again (same formats, T and --cm-tiles; `coopmat`, or `coopmat_fma` with --emulate) with a part of
mul_mat_id_coopmat.comp removed (MOE_PREFILL_ABLATIONS: its products, its k loop's staging, its k loop's
global loads, its x rows' scan, its FP8 / FP4 weight rows' scale scan), each in a child process, printed as
`ablation NAME <row>` (unchecked: the results are wrong on purpose, only the time is read):

    . .vkdev/enter.sh; python3 tools/bench_moe.py --prefill 512,2048 --formats bf16,fp4+fp8 --prefill-kernels coopmat \
        --cm-tiles default --ablate nomma,nostage,noload,noscan,nowscan --json $OUT/moe_prefill_ablate.json
"""
import argparse
import functools
import itertools
import json
import sys

import numpy as np

import ablation
from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import median_gpu_us
from dsv4_vk.core.graph import Graph
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.core.tuning import tuned
from dsv4_vk.hc.metrics import nmse
from dsv4_vk.ops import get_op
from dsv4_vk.ops.moe_coopmat import expert_gemm, tiling as cm_tiling
from dsv4_vk.ops.moe_grouped import tile_shape
from dsv4_vk.ops.quant import QUANT, dequantize, quant_arrays
from dsv4_vk.vk import default_device

# --ablate: the staged kernels (mul_mat_id.comp -D X_SHARED, SwiGLU and sum; not their FP8 shared expert
# beside FP4 ones) with a part removed, as tools/bench_gemv.py's GEMV_ABLATIONS: nodecode, nofma their
# dot product of a uvec4 of codes (tools/ablation.py); nox: x from a register rather than shared
# memory; noload: the code and scale words made from the step's index rather than loaded; nostage: x
# not staged (no staging loops or their barriers).
_ID = "mul_mat_id.comp"
MOE_ABLATIONS = {
    "nocvt": ablation.STAGED_DOT["nocvt"],
    "nodecode": ablation.STAGED_DOT["nodecode"],
    "nox": [(_ID, "xv[c] = xs[(XG) * XS + c * KU + j_];", "xv[c] = vec4(float(lane + c));")],
    "nofma": ablation.STAGED_DOT["nofma"],
    "noload": [(_ID, "W[i][u] = CODES[WB[i] / 4u + j_];", "W[i][u] = uvec4(j_, j_ ^ WB[i], j_ * 0x9E3779B9u, j_ + SB[i]);"),
               (_ID, "S[i][u] = SCALES[(SB[i] + j_ / (QD_)) >> 2];", "S[i][u] = j_ ^ SB[i];")],
    "nostage": [(_ID, "    float s2 = stage_x(p.x_off + t * p.x_s0 + rbase * p.x_s1, 0u, 1u, KU);\n", "    float s2 = 0.0;\n"),
                (_ID, "    barrier();\n#if defined(NORM_X)\n    s2 = 0.0;\n", "#if defined(NORM_X)\n    s2 = 0.0;\n"),
                (_ID, "    stage_x(p.x_off + t * p.x_s0 + rb * p.x_s1, p.x_s1, min(XRG, re - rb), KU);\n    barrier();\n", ""),
                (_ID, "                barrier();\n                stage_x(p.x_off + t * p.x_s0 + r1 * p.x_s1, p.x_s1, "
                      "min(XRG, re - r1), KU);\n                barrier();\n", "")],
}

# --ablate with --prefill: the grouped GEMM on the matrix units (mul_mat_id_coopmat.comp, every variant) with a
# part removed. nomma: no products (CM_NV: the coopMatMulAddNV, its shared-memory loads then dead; the FMA twin:
# its FMAs), loads, staging and barriers kept; nostage: the k steps' chunks neither loaded nor staged (products
# of whatever the staging memory holds, barriers kept); noload: the k loop's chunks made from the step's index
# and the item's row instead of loaded (x, gn, codes, scale bytes), staged, scaled and multiplied as before;
# noscan: no scan of the x rows before the k loop (their shifts 0, Σx² 0; with x_half there is none: the X_ROWS
# pass's records are read instead); nowscan (FP8 / FP4 only): the weight
# rows' scale-byte range read from their first SP bytes, not all of them (per output tile). The epilogue has no
# ablation: without its stores the products are dead code, and the compiler would remove the k loop with it.
_CMID = "mul_mat_id_coopmat.comp"
_CM_STAGE = ("            [[unroll]] for (uint u = 0u; u < NI; ++u) {\n"
             "                uint q = id + u * WG;\n"
             "                if (q >= ITEMS) continue;\n"
             "                int e = rf[u];\n"
             "#if defined(W_QUANT)\n"
             "                if (rw[u] >= BT) e = max(f_exp + ve[u] + e, -126);\n"
             "#elif defined(W_BF16)\n"
             "                if (rw[u] >= BT) m[u] = max(m[u], finite_max(v[u]));\n"
             "#endif\n"
             "                if (XH && rw[u] < BT) smem[(rw[u] * XS + 8u * (q % KP)) / 8u] = xq[u];\n"
             "                else stage(rw[u] * XS + 8u * (q % KP), v[u] * pow2(e));\n"
             "            }\n"
             "            barrier();\n"
             "            load_items(k0 + BK, rw, base, sb, kc, shx, v, ve, xq);")
_CM_LOAD = ("        if (rw[u] < BT && XH) {\n"
            "            if (k < p.K) xq[u] = xh[base[u] + k / 8u];\n"
            "        } else if (rw[u] < BT) {\n"
            "            v[u] = x_chunk(base[u], k);\n"
            "#if defined(NORM_X)\n"
            "            if (k < p.K) v[u] = matrixCompMult(v[u], gn_chunk(k));\n"
            "#endif\n"
            "        } else {\n"
            "            v[u] = w_chunk(base[u], sb[u], k, shx, ve[u]);\n"
            "        }\n")
MOE_PREFILL_ABLATIONS = {
    "nomma": [(_CMID, "[[unroll]] for (uint i = 0u; i < TI; ++i) acc[i * TJ + j] = coopMatMulAddNV(a[i], b, acc[i * TJ + j]);",
               ""),
              (_CMID, "                        sum = fma(xp.y, wp.y, fma(xp.x, wp.x, sum));\n", "")],
    "nostage": [(_CMID, "        load_items(0u, rw, base, sb, kc, shx, v, ve, xq);\n", ""),
                (_CMID, _CM_STAGE, "            barrier();\n")],
    "noload": [(_CMID, _CM_LOAD, "        v[u] = mat2x4(vec4(float((k >> 3) & 3u)), vec4(float(rw[u] & 3u)));\n"
                                 "        ve[u] = rw[u] < BT ? 0 : 120 + int((k >> 3) & 7u);\n"
                                 "        xq[u] = uvec4(k, rw[u], 0u, 0u);\n")],
    "noscan": [(_CMID, "    for (uint k0 = 0u; k0 < p.K; k0 += BK) {\n        uint k = k0 + kc;\n        [[unroll]] for (uint u",
                "    for (uint k0 = 0u; k0 < 0u; k0 += BK) {\n        uint k = k0 + kc;\n        [[unroll]] for (uint u"),
               (_CMID, "        sh[i] = row_shift(uintBitsToFloat(mx[i]));\n#if defined(NORM_X)\n",
                "        sh[i] = 0;\n#if defined(NORM_X)\n")],
    "nowscan": [(_CMID, "for (uint c = q % SP; c < nsc; c += SP) {", "for (uint c = q % SP; c < min(nsc, SP); c += SP) {")],
}


def random_codes(fmt, E, N, K, rng):
    """(codes, scale bytes) of E random N × K experts in FP8 / FP4 (no NaN codes, scales 2^−27..2^−18)."""
    q = QUANT[fmt]
    codes = rng.integers(0, 256, (E, N, K * q.bits // 8), dtype=np.uint8)
    if fmt == "fp8":
        codes[(codes & 0x7F) == 0x7F] = 0x38
    sr, sc = q.grid(N, K)
    return codes, rng.integers(100, 110, (E, sr, sc), dtype=np.uint8)


def make_experts(fmt, E, N, K, rng):
    """(arrays: w[, scale bytes], op params, bytes of one expert) of E random N × K experts."""
    if fmt == "bf16":
        w = (rng.standard_normal((E, N, K), dtype=np.float32) / np.sqrt(K)).astype(BF16)
        return [w], {}, N * K * 2
    codes, scale = random_codes(fmt, E, N, K, rng)
    words, sw = quant_arrays(codes, scale)
    return [words, sw], {"wq": fmt}, (codes.nbytes + scale.nbytes) // E


def op_graph(mode, w, params, per_expert, K, routes, norm, rng, shared=None, x=None, gn=None):
    """(graph, inputs, weight bytes read by one op): the SwiGLU (optionally with the FFN norm) or the
    sum, over experts of K inputs, once per route table in `routes` (one after another, each writing
    the same output: a barrier between them). shared (--shared-fp8): per route table the FP8 shared
    expert's arrays (codes, scale bytes), its bytes counted for the last route, per_expert the
    routed experts'. x, gn: the input and the norm weight (default: random)."""
    R = routes[0].shape[1]
    g = Graph()
    scale = [g.const(a) for a in w[1:]]
    w0 = g.const(w[0])
    sh = [[g.const(a) for a in s] for s in shared] if shared else [[]] * len(routes)
    nbytes = R * per_expert if not shared else (R - 1) * per_expert + sum(a.nbytes for a in shared[0])
    if mode == "swiglu":
        xin = g.input("x", (1, 1, K))
        gn = rng.standard_normal(K).astype(np.float32) if gn is None else gn
        extra = ([g.const(gn)], {"rms_eps": 1e-6}) if norm else ([], {})
        y = None
        for route, s in zip(routes, sh):
            y = g.op("MUL_MAT_ID", xin, w0, g.const(route), *extra[0], *scale, *s, mode="swiglu", limit=10.0,
                     **extra[1], **params, out=y)
        x = rng.standard_normal((1, 1, K)).astype(np.float32) if x is None else x
    else:
        xin, y = g.input("x", (1, R, K)), None
        for route, s in zip(routes, sh):
            y = g.op("MUL_MAT_ID", xin, w0, g.const(route), *scale, *s, mode="sum", **params, out=y)
        x = rng.standard_normal((1, R, K)).astype(np.float32) if x is None else x
    g.output("y", y)
    return g, {"x": x}, nbytes


def decode_routes(E: int, R: int, cold: bool, rng, shared: bool = False) -> list:
    """Route tables [1, R, 2] (expert id, weight) for the one-token rows: one, or with --cold one per
    disjoint set of R experts (as many as E holds), so that consecutive ops read other experts'
    weights from device memory rather than the last op's from the L2 cache. shared (--shared-fp8):
    R − 1 of the E − 1 routed experts and, last, the shared expert (id E − 1, weight 1), as V4_ROUTE
    orders them."""
    n, k = (E - 1, R - 1) if shared else (E, R)
    order = rng.permutation(n)
    out = []
    for i in range(max(1, n // k) if cold else 1):
        route = np.zeros((1, R, 2), np.float32)
        route[0, :k, 0] = order[i * k:(i + 1) * k]
        route[0, :k, 1] = rng.random(k)
        if shared:
            route[0, k] = (n, 1.0)
        out.append(route)
    return out


def shared_fp8_layout(E: int, N: int, K: int, n_shared: int, rng):
    """--shared-fp8: E − 1 random FP4 routed experts and n_shared FP8 shared experts (one a route table, so
    that with --cold each op reads its own, as each layer of the model does; one scale grid over its N rows,
    which at the model's F, a multiple of 128, lies as the model's gate and up grids do) of N × K: (routed arrays
    [codes, scale bytes], op params, bytes of one routed expert, [the shared experts' arrays],
    dequantise(e, s) -> float64 [N, K] of expert e with shared expert s as id E − 1)."""
    w, sw, prm, deq = prefill_experts("fp4", E - 1, N, K, rng)
    shared = [prefill_experts("fp8", 1, N, K, rng) for _ in range(n_shared)]

    def dequant(e, s):
        return shared[s][3](0) if e == E - 1 else deq(e)
    per_expert = (w[0].nbytes + sw[0].nbytes) // (E - 1)
    return w + sw, {**prm, "shared_wq": "fp8"}, per_expert, [s[0] + s[1] for s in shared], dequant


def shared_fp8_reference(mode, x, gn, norm, route, dequant, s):
    """float64 result of one op over route table `route` (shared expert s) from the dequantised experts."""
    R = route.shape[1]
    ws = np.stack([dequant(int(e), s) for e in route[0, :, 0]])
    local = np.stack([np.arange(R), route[0, :, 1]], -1)[None]
    kw = {"limit": 10.0, **({"rms_eps": 1e-6} if norm else {})} if mode == "swiglu" else {}
    return get_op("MUL_MAT_ID").reference(x, ws, local, *([gn] if norm and mode == "swiglu" else []), mode=mode, **kw)


def prefill_experts(fmt, E, N, K, rng):
    """(graph arrays: w and the extra inputs, op params, dequantise(e) -> float64 [N, K] of expert e)
    of E random N × K experts (quantised: random_codes; bf16: random magnitudes
    in [2^−7, 2^−3), drawn as bits)."""
    if fmt == "bf16":
        bits = (rng.integers(0, 1 << 16, (E, N, K), dtype=np.uint16) & 0x81FF) | 0x3C00
        w = bits.view(BF16)
        return [w], [], {}, lambda e: w[e].astype(np.float64)
    codes, scale = random_codes(fmt, E, N, K, rng)
    words, sw = quant_arrays(codes, scale)
    return [words], [sw], {"wq": fmt}, lambda e: dequantize(fmt, *quant_arrays(codes[e], scale[e]), K, 1)


def cm_tile_knobs(text):
    """--cm-tiles' tilings as mul_mat_id_coopmat knobs ({}: the knobs' own, for `default` or no --cm-tiles)."""
    fields = ("tokens", "outputs", "warp_tokens", "warp_outputs", "k_step", "output_tiles")
    return [{} if t == "default" else dict(zip(fields, ints(t.replace("x", ",")))) for t in (text or "default").split(";")]


def cm_x_half(text):
    """--cm-x-half's values (0 and / or 1: knob mul_mat_id_coopmat.x_half), anything else refused."""
    vals = text.split(",")
    if not vals or any(v not in ("0", "1") for v in vals):
        raise SystemExit(f"--cm-x-half: expected 0, 1 or 0,1, got {text!r}")
    return [int(v) for v in vals]


def prefill_rows(a, dev, warm, rng):
    """The --prefill rows: per format, T, mode, kernel (and tile shape), ms, TFLOPS and the check."""
    E, R, D, Fd = a.experts, a.routes_per_token, a.d, a.f
    op, rows = get_op("MUL_MAT_ID"), []
    tiles = [dict(zip(("tokens", "outputs", "k_step", "thread_tokens", "thread_outputs", "literal", "prefetch"),
                      ints(t.replace("x", ",")))) for t in a.tiles.split(";")] if a.tiles else [{}]
    for t in tiles:
        for switch in ("literal", "prefetch"):
            if switch in t:
                t[switch] = bool(t[switch])
    cm_tiles = [dict(t, **({"x_half": bool(h)} if a.cm_x_half != "0" else {})) for t in cm_tile_knobs(a.cm_tiles)
                for h in cm_x_half(a.cm_x_half)]
    kernels = a.prefill_kernels.split(",")
    cm = expert_gemm(dev)                   # the matrix units, or why not (then the FMA twin with --emulate)
    cm_kernel = cm.kernel if cm.kernel != "f32" else ("coopmat_fma" if a.emulate else None)
    if cm_kernel is None:
        print(f"grouped_coopmat: skipped ({cm.reason}; --emulate times its FMA twin)", flush=True)
    for fmt in a.formats.split(","):
        routed = "fp4" if fmt == "fp4+fp8" else fmt
        n_routed = E - 1
        experts = {}
        for mode, N, K in (("swiglu", 2 * Fd, D), ("sum", D, Fd)):
            w, extra, prm, deq = prefill_experts(routed, n_routed if fmt == "fp4+fp8" else E, N, K, rng)
            if fmt == "fp4+fp8":                # the FP8 shared expert in a tensor of its own
                sw, sextra, _, sdeq = prefill_experts("fp8", 1, N, K, rng)
                extra, prm = extra + sw + sextra, dict(prm, shared_wq="fp8")
                deq = (lambda d, s: lambda e: s(0) if e == n_routed else d(e))(deq, sdeq)
            experts[mode] = ([dev.tensor(v) for v in w + extra], prm, functools.lru_cache(maxsize=16)(deq), N, K)
        for T in ints(a.prefill):
            route = np.zeros((T, R, 2), np.float32)
            route[:, :R - 1, 0] = np.argsort(rng.random((T, n_routed)), axis=1)[:, :R - 1]
            route[:, :R - 1, 1] = rng.random((T, R - 1))
            route[:, R - 1] = (n_routed, 1.0)
            for mode in ("swiglu", "sum"):
                tensors, prm, deq, N, K = experts[mode]
                x = rng.standard_normal((T, 1 if mode == "swiglu" else R, K)).astype(np.float32)
                kw = {"limit": 10.0} if mode == "swiglu" else {}
                ts = [int(t) for t in np.unique(np.linspace(T - 1, 0, min(a.check_tokens, T)).astype(int))]
                ws = {t: np.stack([deq(int(e)) for e in route[t, :, 0]]) for t in ts}
                ref = np.concatenate([op.reference(x[t:t + 1], ws[t], np.stack([np.arange(R), route[t, :, 1]], -1)[None],
                                                   mode=mode, **kw) for t in ts]) if ts else None
                flops = 2.0 * T * R * N * K
                cases = [("per_route", {})] * ("per_route" in kernels) + [("grouped", t) for t in tiles] * ("grouped" in kernels)
                cases += [(cm_kernel, t) for t in cm_tiles] if cm_kernel and "coopmat" in kernels else []
                for kernel, tile in cases:
                    coop = kernel in ("coopmat", "coopmat_fma")
                    table = "mul_mat_id_coopmat" if coop else "mul_mat_id_grouped"
                    knobs = {"mul_mat_id_grouped.on": kernel != "per_route", "mul_mat_id_grouped.swiglu_min_routes": 0,
                             "mul_mat_id_coopmat.auto": coop,
                             "mul_mat_id_coopmat.emulate": kernel == "coopmat_fma",
                             **{f"{table}.{k}": v for k, v in tile.items()}}
                    with tuned(knobs):
                        g = Graph()
                        try:
                            if kernel == "grouped":
                                tile_shape(dev, wr=2 if mode == "swiglu" else 1)
                            elif coop:
                                cm_tiling(dev, T * R, E + 1, wr=2 if mode == "swiglu" else 1)
                        except ValueError as e:
                            print(f"{fmt:8s} T={T:5d} {mode:6s} {kernel} {tile}: skipped ({e})", flush=True)
                            continue
                        args = [g.input("x", x.shape), g.bind(tensors[0]), g.input("r", route.shape)]
                        g.output("y", g.op("MUL_MAT_ID", *args, *[g.bind(t) for t in tensors[1:]], mode=mode,
                                           **prm, **kw))
                        cg = g.compile(dev)
                        ran = " ".join(cg.dispatch_details)
                        # the matrix-unit kernel's tiling as it ran (spec constants 1..7: BT BN WM WN BK EP NT)
                        spec = [lo.spec for lo in g.nodes[0].op.lower(g.nodes[0], dev)
                                if lo.shader == "mul_mat_id_coopmat" and "X_ROWS" not in lo.defines]
                        tiling = "x".join(str(int(v)) for v in spec[0][1:8]) if spec else None
                        want = {"per_route": "mul_mat_id ", "grouped": "mul_mat_id_grouped"}.get(kernel,
                                                                                                  "mul_mat_id_coopmat")
                        assert want in ran + " ", f"{kernel}: the graph ran {ran[:300]}"
                        assert ("X_ROWS" in ran) == bool(tile.get("x_half")), f"x_half {tile.get('x_half')}: ran {ran[:300]}"
                        missing = [d for k, d in (("literal", "LITERAL_ARRAYS"), ("prefetch", "PREFETCH"))
                                   if kernel == "grouped" and tile.get(k) and f" {d} " not in ran + " "]
                        if missing:             # a format or tiling without that variant: the plain kernel ran
                            print(f"{fmt:8s} T={T:5d} {mode:6s} {kernel} {tile}: skipped (no {', '.join(missing)} "
                                  "variant for this format or tiling)", flush=True)
                            cg.release()
                            continue
                        got = cg.run(x=x, r=route)["y"]
                        cg.release()
                        err = nmse(got[ts], ref) if ts else float("nan")
                        us = median_gpu_us(dev, g, {"x": x, "r": route}, a.replays, warm, a.repeat)
                    row = {"format": fmt, "T": T, "mode": mode, "kernel": kernel, **tile, "ms": us / 1e3,
                           "tflops": flops / (us * 1e6), "nmse": err, **({"tiling": tiling} if coop else {})}
                    rows.append(row)
                    shape = {k: v for k, v in tile.items() if k != "x_half"}
                    how = (kernel + ("" if not shape else " " + "x".join(str(int(v)) for v in shape.values()))
                           + (" x_half" if tile.get("x_half") else ""))
                    print(f"{fmt:8s} T={T:5d} {mode:6s} {how:24s} {us / 1e3:9.3f} ms {flops / (us * 1e6):7.2f} TFLOPS "
                          f"nmse {err:.2e}{f' tiling {tiling} (BTxBNxWMxWNxBKxEPxNT)' if coop else ''}", flush=True)
                    bound = 1e-5 if coop else 1e-8     # (fp16 products: the coopmat tests' bound)
                    assert not err > bound, f"{fmt} T={T} {mode} {how}: NMSE {err} against float64"
    return rows


def ints(text):
    return [int(v) for v in text.split(",")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=4, help="ops back to back per recording")
    ap.add_argument("--experts", type=int, default=65, help="experts stacked in w (the model's 64 + shared)")
    ap.add_argument("--routes-per-token", type=int, default=7, help="R: top-k + the shared expert")
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--f", type=int, default=2048)
    ap.add_argument("--unroll", default="2,4,8")
    ap.add_argument("--routes", default="1,2,4,8", help="the sum's routes loaded together, to sweep")
    ap.add_argument("--wg", default="0,64,256", help="the sum's workgroup lanes per output (0: subgroup clusters)")
    ap.add_argument("--formats", default="bf16", help="expert formats to compare: bf16, fp4, fp8")
    ap.add_argument("--rows", default="1", help="quantised experts: the sum's output rows a cluster to sweep "
                    "(1, 2, 4)")
    ap.add_argument("--load", default="4", help="quantised experts: bytes of codes a lane loads a step to "
                    "compare (knob mul_mat_id.load: 4, 16)")
    ap.add_argument("--x-shared", default="0", help="quantised experts: the staged kernel off (0), on (1) or both "
                    "(0,1; knob mul_mat_id.x_shared)")
    ap.add_argument("--xs-rows", default="2", help="staged kernel: outputs a cluster to sweep (1, 2, 4)")
    ap.add_argument("--xs-unroll", default="2", help="staged kernel: uvec4 steps a lane loads together to sweep")
    ap.add_argument("--xs-groups", default="1024", help="staged SwiGLU: workgroups a token at most to sweep")
    ap.add_argument("--xs-split", default="1", help="staged sum: clusters sharing an output block, the routes "
                    "split among them, to sweep (powers of two)")
    ap.add_argument("--xs-heavy", default="0", help="staged SwiGLU: the last route's blocks first (1) or not (0) "
                    "or both (0,1; knob mul_mat_id.x_shared_heavy_first)")
    ap.add_argument("--xs-route-groups", default="1", help="staged sum: route groups, a workgroup each per output "
                    "block, to sweep (knob mul_mat_id.x_shared_route_groups; 1: one group)")
    ap.add_argument("--xs-lanes", default="0", help="staged kernels: lanes a cluster to sweep (knob "
                    "mul_mat_id.x_shared_lanes; 0: the knob's default, the whole subgroup on GPUs)")
    ap.add_argument("--shared-fp8", action="store_true", help="one token, --formats fp4: the model's layout, "
                    "--experts − 1 FP4 routed experts and an FP8 shared expert in its own tensors (shared_wq), "
                    "--routes-per-token − 1 routed routes and the shared one last, each row's result checked "
                    "against float64 (NMSE ≤ 1e-8 asserted)")
    ap.add_argument("--cold", action="store_true", help="one token: the ops of a recording cycle through disjoint "
                    "sets of routes (--experts // --routes-per-token of them), so each reads its experts from device "
                    "memory, not the L2 cache (as in the decode step)")
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each row (default 500 on GPUs)")
    ap.add_argument("--prefill", help="prefill chunks of these token counts (T,T,...) instead of one token: the "
                    "per-route and the grouped kernels")
    ap.add_argument("--tiles", help="--prefill: grouped tile shapes to sweep, BTxBNxBKxTMxTN[xL[xP]];... (L 1: the "
                    "literal-size arrays, knob mul_mat_id_grouped.literal; P 1: the next k step's loads issued "
                    "before the step's products, knob mul_mat_id_grouped.prefetch; default: the knobs')")
    ap.add_argument("--cm-tiles", help="--prefill: tile shapes of the grouped GEMM on the matrix units to sweep, "
                    "BTxBNxWMxWNxBK[xNT] or default (the knobs' tiling);... (NT: output tiles a workgroup; "
                    "default: the knobs')")
    ap.add_argument("--cm-x-half", default="0", help="--prefill: the grouped GEMM on the matrix units with x rounded "
                    "to fp16 once by a pass before it (1: knob mul_mat_id_coopmat.x_half), without (0) or both (0,1), "
                    "at each --cm-tiles tiling")
    ap.add_argument("--prefill-kernels", default="per_route,grouped,coopmat", help="--prefill: the kernels timed "
                    "(per_route, grouped: on the f32 lanes, coopmat: on the matrix units or, with --emulate, its FMA twin)")
    ap.add_argument("--emulate", action="store_true", help="--prefill on a device without matrix units: time the "
                    "cooperative-matrix grouped kernel's FMA twin (coopmat_fma) instead of skipping it")
    ap.add_argument("--check-tokens", type=int, default=1, help="--prefill: tokens checked against float64 (the "
                    "last, then spread down to the first)")
    ap.add_argument("--json")
    ablation.add_flags(ap, "--ablate", MOE_ABLATIONS, "the staged rows (one token)",
                       f"; with --prefill, the matrix-unit rows (--cm-tiles): {','.join(MOE_PREFILL_ABLATIONS)}")
    argv = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
    unknown = sorted(set(a.prefill_kernels.split(",")) - {"per_route", "grouped", "coopmat"})
    if unknown:
        raise SystemExit(f"--prefill-kernels: unknown kernel(s) {unknown}; expected names from per_route, grouped, coopmat")
    ablations = ablation.chosen("--ablate", a.ablate, a.ablation_child,
                                MOE_PREFILL_ABLATIONS if a.prefill else MOE_ABLATIONS)
    quant = [f for f in a.formats.split(",") if f != "bf16"]
    if ablations and a.prefill and not (a.cm_tiles and "coopmat" in a.prefill_kernels.split(",")):
        raise SystemExit("--ablate with --prefill times the matrix-unit rows again: it needs --cm-tiles (the tiles "
                         "to run, BTxBNxWMxWNxBK[xNT] or default;...) and coopmat in --prefill-kernels; got "
                         f"--cm-tiles {a.cm_tiles} --prefill-kernels {a.prefill_kernels}")
    if ablations and not a.prefill and (not quant or 1 not in ints(a.x_shared)):
        raise SystemExit("--ablate times the staged kernels' one-token rows again: it needs --formats fp4 and/or "
                         f"fp8 and --x-shared 1 (or 0,1); got --formats {a.formats} --x-shared {a.x_shared}")
    if a.shared_fp8 and (a.prefill or a.formats != "fp4" or a.experts < 2 or a.routes_per_token < 2):
        raise SystemExit("--shared-fp8 is the one-token rows over FP4 routed experts and an FP8 shared one: it needs "
                         f"--formats fp4, no --prefill, --experts ≥ 2 and --routes-per-token ≥ 2; got --formats "
                         f"{a.formats} --prefill {a.prefill} --experts {a.experts} --routes-per-token {a.routes_per_token}")
    dev = default_device()
    if ablations and a.prefill and expert_gemm(dev).kernel == "f32" and not a.emulate:
        raise SystemExit(f"--ablate with --prefill times the matrix-unit rows again, but {dev.name} has none "
                         f"({expert_gemm(dev).reason}): --emulate times their FMA twin")
    rng = np.random.default_rng(0)
    E, R, D, Fd = a.experts, a.routes_per_token, a.d, a.f
    routes = decode_routes(E, R, a.cold, rng, a.shared_fp8)
    checked = a.shared_fp8 and not a.ablation_child         # (ablated kernels are wrong on purpose)
    unrolls = [int(u) for u in a.unroll.split(",")]
    rows = []
    reads: dict = {}                    # bytes of an op: µs to read that many bytes alone (floor.read_us)
    with F.ClockWarmer(dev, F.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms) as warm:
        copy = F.copy_gbps(dev, warm=warm)
        print(f"{dev.name}: copy {copy:.0f} GB/s; {E} experts, {R} routes a token, D {D}, F {Fd}", flush=True)
        if a.prefill:
            rows = prefill_rows(a, dev, warm, rng)
        for fmt in a.formats.split(",") if not a.prefill else []:
            shared, deq = {}, {}
            if a.shared_fp8:
                *w13, shared["swiglu"], deq["swiglu"] = shared_fp8_layout(E, 2 * Fd, D, len(routes), rng)
                *w2, shared["sum"], deq["sum"] = shared_fp8_layout(E, D, Fd, len(routes), rng)
            else:
                w13 = make_experts(fmt, E, 2 * Fd, D, rng)
                w2 = make_experts(fmt, E, D, Fd, rng)
            # --shared-fp8: the same x (and norm weight) in every row of a mode, checked against one reference
            fixed = {m: (rng.standard_normal((1, 1 if m == "swiglu" else R, k)).astype(np.float32),
                         rng.standard_normal(D).astype(np.float32)) for m, k in (("swiglu", D), ("sum", Fd))
                     } if a.shared_fp8 else {}
            refs: dict = {}             # (mode, norm): float64 result of the last route table
            nrs = [int(v) for v in a.rows.split(",")] if fmt != "bf16" else [1]
            loads = [int(v) for v in a.load.split(",")] if fmt != "bf16" else [4]
            xs_on = [v for v in (0, 1) if v in ints(a.x_shared)] if fmt != "bf16" else [0]
            cases = []
            for xs in xs_on:
                if xs:
                    staged = [{"x_shared": True, "x_shared_rows": r, "x_shared_unroll": u, "x_shared_groups": gr,
                               "x_shared_lanes": ln or None}
                              for r, u, gr, ln in itertools.product(ints(a.xs_rows), ints(a.xs_unroll), ints(a.xs_groups),
                                                                    ints(a.xs_lanes))]
                    cases += [("swiglu", w13, norm, {**k, "x_shared_heavy_first": bool(h)}) for norm in (False, True)
                              for k in staged for h in ints(a.xs_heavy)]
                    cases += [("sum", w2, False, {**k, "x_shared_split": sp, "x_shared_route_groups": rg}) for k in staged
                              for sp in ints(a.xs_split) for rg in ints(a.xs_route_groups)]
                    continue
                cases += [("swiglu", w13, norm, {"unroll": u, "load": ld, "x_shared": False}) for norm in (False, True)
                          for u in unrolls for ld in loads]
                cases += [("sum", w2, False, {"unroll": u, "routes": r, "wg": wg, "rows": nr, "load": ld, "x_shared": False})
                          for wg, r, u, nr, ld in itertools.product(ints(a.wg), ints(a.routes), unrolls, nrs, loads)]
            for mode, (w, params, per_expert), norm, knobs in cases:
                K = D if mode == "swiglu" else Fd
                with tuned({f"mul_mat_id.{k}": v for k, v in knobs.items()}):
                    g, inputs, nbytes = op_graph(mode, w, params, per_expert, K, routes, norm, rng,
                                                 shared.get(mode), *(fixed[mode] if a.shared_fp8 else (None, None)))
                    launch = g.nodes[0].op.lower(g.nodes[0], dev)[0]
                    staged = "X_SHARED" in launch.defines
                    # the staged sum's routes staged at a time, split and route groups used (spec constants 6, 8,
                    # 10), the lanes a cluster
                    xrg, split, rgroups = launch.spec[6:11:2] if staged and mode == "sum" else (None, None, None)
                    if knobs.get("x_shared"):
                        how = (f"staged{'' if staged else '(off)'} rows={knobs['x_shared_rows']} "
                               f"unroll={knobs['x_shared_unroll']} groups={knobs['x_shared_groups']:4d}"
                               + (f" lanes={launch.defines.get('LANES')}" if staged else "")
                               + (" heavy_first" if knobs.get("x_shared_heavy_first") else "")
                               + (f" split={split} staged x rows={xrg} route groups={rgroups}" if split else ""))
                    else:
                        how = (f"unroll={knobs['unroll']:2d} routes={knobs.get('routes') or '-'} "
                               f"wg={knobs.get('wg') or '-':3} rows={knobs.get('rows', 1)} load={knobs['load']:2d}")
                    # named before it runs: a run that stops the device leaves its variant on screen
                    print(f"{fmt + '+fp8' * a.shared_fp8:8s} {mode:6s}{' +norm' if norm else '      '} {how:58s} ", end="",
                          flush=True)
                    err = None
                    if checked:                 # the last route table's result against float64
                        cg = g.compile(dev)
                        got = cg.run(**inputs)["y"]
                        cg.release()
                        if (mode, norm) not in refs:
                            refs[mode, norm] = shared_fp8_reference(mode, *fixed[mode], norm, routes[-1], deq[mode],
                                                                    len(routes) - 1)
                        err = nmse(got, refs[mode, norm])
                        assert not err > 1e-8, f"{mode} norm={norm} {knobs}: NMSE {err} against float64"
                    us = median_gpu_us(dev, g, inputs, a.replays, warm, a.repeat) / len(routes)
                gbps = nbytes / (us * 1e3)
                # the same bytes read alone by the plainest kernel, as many copies as route sets: the op's floor
                if nbytes not in reads:
                    reads[nbytes] = F.read_us(dev, -(-nbytes // 16) * 16, len(routes), a.replays, a.repeat, warm)
                read = reads[nbytes]
                rows.append({"format": fmt + "+fp8" * a.shared_fp8, "mode": mode, "norm": norm, **knobs, "staged": staged,
                             "route_sets": len(routes), "split_used": split, "x_rows_staged": xrg, "route_groups_used": rgroups,
                             "lanes": launch.defines.get("LANES"), "bytes": nbytes, "us": us, "gbps": gbps,
                             "pct_copy": 100 * gbps / copy, "read_us": read, "pct_read": 100 * read / us,
                             **({"nmse": err} if err is not None else {})})
                print(f"{us:8.1f} µs {gbps:7.0f} GB/s {100 * gbps / copy:5.1f}% of copy {100 * read / us:5.1f}% of the read"
                      + (f" nmse {err:.2e}" if err is not None else ""), flush=True)
    doc = {"device": dev.name, "copy_gbps": copy, "cold": a.cold, "experts": E, "routes_per_token": R, "d": D, "f": Fd,
           "prefill": a.prefill, "shared_fp8": a.shared_fp8, "route_sets": len(routes), "rows": rows}
    if ablations and a.prefill:             # the matrix-unit rows only (results unchecked: wrong on purpose)
        doc["ablations"] = ablation.run_children(
            __file__, ablations, argv, ("--json", "--ablate", "--prefill-kernels", "--check-tokens"),
            ("--prefill-kernels", "coopmat", "--check-tokens", "0"), lambda line: " T=" in line)
    elif ablations:                         # the staged rows only, at the parent's widths and knobs
        doc["ablations"] = ablation.run_children(__file__, ablations, argv, ("--json", "--ablate", "--x-shared", "--formats"),
                                                 ("--x-shared", "1", "--formats", ",".join(quant)),
                                                 lambda line: line.startswith(("fp4", "fp8")))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
