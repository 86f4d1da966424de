#!/usr/bin/env python3
"""GPU time of the primitive kernels at DeepSeek-V4 shapes: MUL_MAT along each kernel (gemv,
gemm_regs, gemm_shared) and the row ops. Median over replays of one recorded command buffer
(per-dispatch timestamps), with GFLOP/s for MUL_MAT and GB/s (inputs + output moved once).

    python tools/bench_primitives.py [--replays 10] [--quick] [--json out.json]

--gemm instead: the prefill mat-muls of the flash-1gpu preset's linears over bf16 weights, and over
FP8-block and FP4-group weights (--gemm-weights; random codes, scales about 2^-6) (f32 x and
out) at --gemm-t tokens: MUL_MAT on the matrix units ("coopmat", at each --coopmat-tiles tiling), on
the f32 lanes (the kernel bf16 weights take without matrix units: gemv for few tokens, gemm_shared,
or gemm_regs on CPU devices), and torch.matmul (cuBLAS: fp16, bf16, TF32,
fp32 inputs of the same values, the quantised weights' dequantised values; CUDA events, N calls back to
back, median of rounds), each after a --warm-ms clock warm-up, in TFLOPS and as a ratio to cuBLAS fp16.
Each kernel's result is checked against float64 on --check-rows rows (NMSE; the quantised weights'
float64 dequantisation). --coopmat-tiles variants measures each variant of the
kernel (tiles, k step, staging buffers, scales by workgroup or by a first pass, whose own time is
shown beside it, x rounded to fp16 once by that pass: a seventh field 1, knob coopmat.x_half).

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH
    python3 tools/bench_primitives.py --gemm --json $OUT/gemm_h200.json | tee $OUT/gemm_h200.txt
    python3 tools/bench_primitives.py --gemm --gemm-t 512,4096 --gemm-weights bf16,fp8,fp4 \
        --gemm-shapes 4096x4096,32768x1024,1024x4096,4096x8192 --torch-dtypes fp16,bf16 \
        --json $OUT/gemm_quant_h200.json | tee $OUT/gemm_quant_h200.txt
    python3 tools/bench_primitives.py --gemm --gemm-t 512,4096 --coopmat-tiles variants \\
        --gemm-shapes 32768x1024,4096x8192,4096x4096,1024x4096 --coopmat-ablate nomma,nostage,noload \\
        --json $OUT/gemm_h200.json
    python tools/bench_primitives.py --gemm --gemm-t 32 --gemm-shapes 64x128 --no-torch   # anywhere

--coopmat-ablate runs the kernel (--ablate-tiles variants) again with parts removed, each in a child
process with a patched copy of shaders/: where its time goes (the results are wrong on purpose).

--attention instead: MQA_ATTENTION over one prefill chunk of --attn-chunk tokens starting at each of
--attn-positions, at V4-Flash's widths (64 query heads × 512 sharing one key head, window 128, the
q norm and RoPE in the kernel), for each layer type of the flash-1gpu preset (sliding; CSA: rate 4,
the indexer's top 512; HCA: rate 128): the cluster kernel (the prefill path before the prefill
kernel, mqa_prefill.on=False) against the prefill kernel at its defaults and at each
--attn-variants knob set (heads=H/tile=T/keys=K/literal=1: knobs mqa_prefill.heads, .tile, .keys and
mqa_arrays.literal; comma-separated), and the matrix-unit prefill kernel (prefill_coopmat, or its FMA
twin prefill_coopmat_fma where the device has no matrix units) at its defaults and at each
--attn-variants set of its knobs (cm_tile=T/cm_heads=HEAD_TILES/cm_warps=W: mqa_prefill.cm_tile,
.cm_head_tiles, .cm_warps), GPU ms each with the NMSE of its output against the cluster kernel's
(f32), and the chunk's attention over flash-1gpu's 4 layers (SWA, CSA, HCA, CSA).

    python3 tools/bench_primitives.py --attention --attn-variants heads=1,heads=4/tile=8,keys=2,keys=8,literal=1 \
        --json $OUT/attention_prefill_h200.json | tee $OUT/attention_prefill_h200.txt
    python3 tools/bench_primitives.py --attention --attn-positions 4096 \
        --attn-variants cm_tile=16,cm_heads=2,cm_warps=8/cm_heads=2 \
        --json $OUT/attention_coopmat_h200.json | tee $OUT/attention_coopmat_h200.txt
    python tools/bench_primitives.py --attention --attn-chunk 16 --attn-positions 200 --replays 2   # anywhere
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import ablation
from dsv4_vk.cli.floor import ClockWarmer, default_warm_ms
from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.hc.metrics import nmse
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.ops.base import coopmat_unavailable
from dsv4_vk.ops.mul_mat import pick_kernel
from dsv4_vk.ops.mul_mat_coopmat import coopmat_tiling
from dsv4_vk.ops.quant import QUANT, dequantize, quant_arrays

MATMULS = [   # (T, K, N): decode and prefill projections, the HC mixes (K = 4·4096, N = 24)
    (1, 4096, 4096), (1, 16384, 24), (4, 4096, 4096), (8, 4096, 4096), (64, 4096, 4096),
    (512, 4096, 4096), (512, 16384, 24)]
ROWS = [("RMS_NORM", (1, 16384), {"eps": 1e-6}), ("RMS_NORM", (512, 4096), {"eps": 1e-6}),
        ("SOFT_MAX", (512, 4, 4), {}), ("SOFT_MAX", (32, 512, 512), {"scale": 0.125}),
        ("SUM_ROWS", (512, 4, 4), {})]


def gpu_ms(ex, g, feeds, replays, warm=None):
    """Median GPU ms of the graph's dispatches over replays (after one untimed run, and warm() if
    given; outputs stay on the device meanwhile), the output y (read once, after them) and the median
    ms of its first dispatch where it has several (else None)."""
    cg = ex.compile(g)
    cg.replay(feeds)                                     # compile, record, warm up
    if warm is not None:
        warm()
    times, first = [], []
    for _ in range(replays):
        cg.replay(feeds)
        ns = cg.stats.gpu_ns
        times.append(float(np.sum(ns)) / 1e6)
        first.append(float(ns[0]) / 1e6)
    y = cg.read("y") if "y" in g.outputs else None
    return statistics.median(times), y, (statistics.median(first) if len(cg.stats.gpu_ns) > 1 else None)


# (N, K) of the flash-1gpu preset's linears (hidden 4096): wq_b 64 heads × 512 from the q LoRA rank 1024,
# wo_b from 8 groups × 1024, the shared expert's w13 and w2 (2 × 2048 and 2048), wq_a / wkv-like, a square one
GEMM_SHAPES = "32768x1024,4096x8192,8192x4096,4096x2048,1024x4096,4096x4096"
TORCH_DTYPES = ("fp16", "bf16", "tf32", "fp32")
GEMM_WEIGHTS = ("bf16", "fp8", "fp4")


def gemm_weights(rng, kind, N, K):
    """(graph constants of the weight: [w] or [codes, scale words] with MUL_MAT's params, its float64
    values) of a random N × K weight: bf16 of normal values / sqrt(K), or FP8 / FP4 codes (every non-NaN
    code) with E8M0 scales about 2^-6 (FP8 128 × 128 blocks, FP4 32 inputs a row)."""
    if kind == "bf16":
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(BF16)
        return [w], {}, w.astype(np.float64)
    fmt = QUANT[kind]
    if kind == "fp8":
        codes = rng.integers(0, 256, (N, K), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x38
    else:
        codes = rng.integers(0, 256, (N, -(-K // 2)), dtype=np.uint8)
    scale = rng.integers(127 - 8, 127 - 3, fmt.grid(N, K), dtype=np.uint8)
    words, sw = quant_arrays(codes, scale)
    return [words, sw], {"wq": kind}, dequantize(fmt, words, sw, K)


def parse_pairs(text, what):
    try:
        return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        raise SystemExit(f"{what}: expected AxB,CxD,... got {text!r}") from None


# --coopmat-tiles variants: the kernel's variants side by side (scales by each workgroup or by a first
# pass, one or two staging buffers, 64 × 128 to 128 × 256 tiles, k steps of 32 and 64, workgroups in
# groups of 8 token tiles, x rounded to fp16 once by the first pass: coopmat.x_half)
COOPMAT_VARIANTS = ("default,64x128/32x64/32/1/pass,64x128/32x64/32/2/pass,128x128/64x32/32/1/pass,"
                    "128x128/64x32/32/2/pass,128x128/64x32/32/2/pass/8,128x128/64x64/32/2/pass/8,"
                    "128x256/64x64/32/1/pass/8,128x128/64x32/64/1/pass/8,128x128/64x32/64/1/pass/8/1")
TILE_FIELDS = "BMxBN/WMxWN[/BK[/BUFFERS[/SCALES[/GROUP[/X_HALF]]]]]"


def parse_tiles(text):
    """--coopmat-tiles "BMxBN/WMxWN[/BK[/BUFFERS[/SCALES[/GROUP[/X_HALF]]]]],...": knob overrides for each
    variant (X_HALF 0 or 1: coopmat.x_half; "default": the knobs'; "variants": COOPMAT_VARIANTS)."""
    out = []
    for item in text.replace("variants", COOPMAT_VARIANTS).split(","):
        if item == "default":
            out.append(("default", {}))
            continue
        parts = item.split("/")
        try:
            (bm, bn), (wm, wn) = (tuple(int(v) for v in q.split("x")) for q in parts[:2])
            knobs = {"coopmat.tokens": bm, "coopmat.outputs": bn, "coopmat.warp_tokens": wm,
                     "coopmat.warp_outputs": wn}
            for key, value in zip(("k_step", "buffers", "scales", "group"), parts[2:6]):
                knobs[f"coopmat.{key}"] = value if key == "scales" else int(value)
            if len(parts) > 6:
                if parts[6] not in ("0", "1"):
                    raise ValueError
                knobs["coopmat.x_half"] = parts[6] == "1"
            if len(parts) > 7:
                raise ValueError
        except ValueError:
            raise SystemExit(f"--coopmat-tiles: expected {TILE_FIELDS} (X_HALF 0 or 1) or default, "
                             f"got {item!r}") from None
        out.append((item, knobs))
    return out


# --coopmat-ablate: the coopmat kernel with a part removed (results wrong on purpose: only the time is read),
# each in a child process whose shaders/ is a patched copy: nomma (no matrix products: loads, staging and
# barriers), nostage (the k steps' chunks neither loaded nor staged: products and barriers), noload (the
# chunks staged from a constant: products, staging and barriers without the global loads)
_LOOP_X = ("        [[unroll]] for (uint i = 0u; i < XR; ++i) if (XH) xq[i] = xh_chunk(hb[i], kn); "
           "else xv[i] = x_chunk(xb[i], kn);\n")
_LOOP_W = "        [[unroll]] for (uint i = 0u; i < WR; ++i) wv[i] = w_chunk(wb[i], wsr[i], kn);\n"
_STAGE = ("            [[unroll]] for (uint i = 0u; i < XR; ++i) "
          "stage_x(nb + (r0 + RS * i) * XS + KC * kc, xv[i], xq[i], xf[i]);\n"
          "            [[unroll]] for (uint i = 0u; i < WR; ++i) stage(nb + (BM + r0 + RS * i) * XS + KC * kc, "
          "W_STAGED(i, wv[i]));\n")
_CM = "mul_mat_coopmat.comp"
COOPMAT_ABLATIONS = {
    "nomma": [(_CM, "[[unroll]] for (uint i = 0u; i < TI; ++i) PART[i * TJ + j] = coopMatMulAddNV(a[i], b, PART[i * TJ + j]);",
               "")],
    "nostage": [(_CM, _LOOP_X, ""), (_CM, _LOOP_W, ""), (_CM, _STAGE, "")],
    "noload": [(_CM, _LOOP_X, "        [[unroll]] for (uint i = 0u; i < XR; ++i) { xv[i] = mat2x4(float(kn & 7u)); "
                              "xq[i] = uvec4(kn & 7u); }\n"),
               (_CM, _LOOP_W, "        [[unroll]] for (uint i = 0u; i < WR; ++i) wv[i] = W_CHUNK(kn & 7u);\n")],
}


def torch_gemm_ms(torch, x, w, dtype, warm_s, calls=20, rounds=5):
    """torch.matmul(x, wᵀ) in `dtype` (fp16, bf16, tf32: fp32 tensors with TF32 allowed, fp32): ms per
    call, median of `rounds` rounds of `calls` back-to-back calls between CUDA events, after warm_s of
    the same calls (the clock up from idle)."""
    dev = torch.device("cuda")
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    a = torch.from_numpy(x).to(dev, tdt)
    b = torch.from_numpy(w.astype(np.float32)).to(dev, tdt).t()
    torch.matmul(a, b)
    torch.cuda.synchronize()
    end = time.perf_counter() + warm_s
    while time.perf_counter() < end:
        torch.matmul(a, b)
        torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            torch.matmul(a, b)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    return statistics.median(times)


def gemm_table(ex, args, rng):
    """The --gemm rows: MUL_MAT on the matrix units and the f32 lanes, and cuBLAS, at each T × (N, K)."""
    dev = ex.device
    warm_ms = default_warm_ms(dev) if args.warm_ms is None else args.warm_ms
    tilings = parse_tiles(args.coopmat_tiles)
    why = coopmat_unavailable(dev)
    torch = None
    if not args.no_torch:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("PyTorch has no CUDA device here (use --no-torch)")
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    t = coopmat_tiling(dev)
    kinds = [k for k in args.gemm_weights.split(",") if k]
    if set(kinds) - set(GEMM_WEIGHTS):
        raise SystemExit(f"--gemm-weights: expected names from {GEMM_WEIGHTS}, got {args.gemm_weights!r}")
    torch_dtypes = [d for d in args.torch_dtypes.split(",") if d]
    fp8_modes = [m for m in args.fp8_scales.split(",") if m]
    if not fp8_modes or set(fp8_modes) - {"block", "fold"}:
        raise SystemExit(f"--fp8-scales: expected block and/or fold, got {args.fp8_scales!r}")
    if set(torch_dtypes) - set(TORCH_DTYPES):
        raise SystemExit(f"--torch-dtypes: expected names from {TORCH_DTYPES}, got {args.torch_dtypes!r}")
    print(f"coopmat: {'runs on the matrix units' if why is None else 'runs as coopmat_fma (' + why + ')'}; "
          f"tilings {[name for name, _ in tilings]} (default: the device's, {t['tokens']}x{t['outputs']}/"
          f"{t['warp_tokens']}x{t['warp_outputs']}/{t['k_step']}/{t['buffers']}/{t['scales']}/{t['group']}); "
          f"clock warm-up {warm_ms:g} ms")
    kernel_cm = "coopmat" if why is None else "coopmat_fma"
    rows = []
    with ClockWarmer(dev, warm_ms) as warm:
        for T in [int(t) for t in args.gemm_t.split(",")]:
            for (N, K), kind in ((nk, kind) for nk in parse_pairs(args.gemm_shapes, "--gemm-shapes") for kind in kinds):
                flop = 2.0 * T * N * K
                x = rng.standard_normal((T, K)).astype(np.float32)
                consts, params, w = gemm_weights(rng, kind, N, K)
                checked = rng.choice(T, min(T, args.check_rows), replace=False)     # rows held to float64
                ref = x[checked].astype(np.float64) @ w.T
                row = {"T": T, "N": N, "K": K, "weights": kind, "ms": {}, "nmse": {}, "first_pass_ms": {}}
                runs = [(f"{kernel_cm} {name}" + (f" {mode}" if kind == "fp8" else ""), kernel_cm,
                         {**knobs, "coopmat.fp8_scales": mode})
                        for name, knobs in tilings for mode in (fp8_modes if kind == "fp8" else ["block"])]
                f32_kernel = pick_kernel(dev, T, N).kernel      # what the weights take without matrix units
                if not args.no_f32:
                    runs.append((f32_kernel, f32_kernel, {}))
                for label, kernel, knobs in runs:
                    with tuned(knobs):
                        g = Graph()         # (x a constant too: no upload in the timed runs)
                        g.output("y", g.op("MUL_MAT", g.const(x), *[g.const(c) for c in consts], kernel=kernel,
                                           **params))
                        try:
                            ms, y, first_ms = gpu_ms(ex, g, {}, args.replays if kernel != "gemm_shared" else
                                                     min(args.replays, 3), warm)
                        except Exception as e:          # a tiling the device cannot take, or a failed kernel:
                            print(f"  {label}: {type(e).__name__}: {e}", flush=True)    # the other rows still run
                            row.setdefault("errors", {})[label] = f"{type(e).__name__}: {e}"
                            continue
                    row["ms"][label] = ms
                    if first_ms is not None:
                        row["first_pass_ms"][label] = first_ms         # ROW_SCALES
                    row["nmse"][label] = nmse(y[checked], ref)
                if torch is not None:
                    for dt in torch_dtypes:
                        row["ms"][f"torch {dt}"] = torch_gemm_ms(torch, x, w, dt, warm_ms / 1e3)
                    torch.cuda.empty_cache()
                base = row["ms"].get("torch fp16")
                cells = []
                for label, ms in row["ms"].items():
                    cell = f"{label} {ms:8.3f} ms {flop / ms / 1e9:6.1f} TF"
                    if base:
                        cell += f" {base / ms:5.3f}x"
                    if label in row["first_pass_ms"]:
                        cell += f" (scales {row['first_pass_ms'][label]:.3f} ms)"
                    cell += f" nmse {row['nmse'][label]:.1e}" if label in row["nmse"] else ""
                    cells.append(cell)
                print(f"T={T:5d} N={N:5d} K={K:5d} {kind:4s} | " + " | ".join(cells), flush=True)
                rows.append(row)
    return {"warm_ms": warm_ms, "coopmat": why or "matrix units", "tilings": dict(tilings), "rows": rows}


# the flash-1gpu preset's attention (dsv4_vk/model/config.py): heads, head_dim, window, RoPE pairs of
# the rotated 64 channels, CSA's and HCA's rates, the indexer's top-k; the layers' types in order
FLASH_ATTENTION = {"H": 64, "hd": 512, "window": 128, "half": 32, "rates": {"csa": 4, "hca": 128}, "topk": 512}
FLASH_LAYERS = ("sliding", "csa", "hca", "csa")


def attention_inputs(rng, mode, T, P, capacity):
    """MQA_ATTENTION's inputs and params for a chunk of T tokens at positions P.. (flash-1gpu widths):
    CSA's top-k per token distinct entries among those closed by then (−1 where fewer exist)."""
    f = FLASH_ATTENTION
    H, hd = f["H"], f["hd"]
    q = (rng.standard_normal((T, H, hd)) * 3).astype(np.float32)
    kv = rng.standard_normal((capacity, hd)).astype(np.float32)
    arrays = [q, kv, np.array([P], np.int32), rng.standard_normal(H).astype(np.float32)]
    prm = {"scale": hd ** -0.5, "window": f["window"], "mode": mode, "capacity": capacity, "q_norm_eps": 1e-6}
    if mode != "sliding":
        rate = f["rates"][mode]
        prm["rate"] = rate
        arrays.append(rng.standard_normal((capacity // rate, hd)).astype(np.float32))
    if mode == "csa":
        idx = np.full((T, f["topk"]), -1, np.int32)
        for t in range(T):
            n = (P + t + 1) // prm["rate"]
            pick = rng.permutation(n)[:f["topk"]]
            idx[t, :len(pick)] = pick
        arrays.append(idx)
    ang = np.arange(capacity, dtype=np.float64)[:, None] * (10000.0 ** -(np.arange(f["half"]) / f["half"]))[None]
    arrays += [np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)]
    return arrays, prm


def attention_table(ex, args, rng):
    """The --attention rows: the cluster kernel and the prefill kernel (defaults, --attn-variants) per
    layer type and chunk position; GPU ms, NMSE against the cluster kernel's output."""
    from dsv4_vk.ops.v4_attention import coopmat_unavailable, describe, mqa_prefill_coopmat_plan, mqa_prefill_plan
    dev = ex.device
    warm_ms = default_warm_ms(dev) if args.warm_ms is None else args.warm_ms
    # the matrix-unit prefill kernel where the device has the units, else its FMA twin (the same numerics)
    cm = "prefill_coopmat_fma" if coopmat_unavailable(dev) else "prefill_coopmat"
    cm_keys = {"cm_tile": "cm_tile", "cm_heads": "cm_head_tiles", "cm_warps": "cm_warps"}
    variants = [("prefill", "prefill", {}), (cm, cm, {})]
    for item in filter(None, args.attn_variants.split(",")):
        knobs, kernel = {}, "prefill"
        for part in item.split("/"):
            key, _, value = part.partition("=")
            if key not in ("heads", "tile", "keys", "literal", *cm_keys) or not value.isdigit():
                raise SystemExit(f"--attn-variants: expected heads=H/tile=T/keys=K/literal=0|1 items (the f32 "
                                 f"prefill kernel) or cm_tile=T/cm_heads=TILES/cm_warps=W items ({cm}), got {item!r}")
            if key == "literal":
                knobs["mqa_arrays.literal"] = bool(int(value))
                continue
            if key in cm_keys:
                kernel = cm
                knobs[f"mqa_prefill.{cm_keys[key]}"] = int(value)
                continue
            knobs[f"mqa_prefill.{key}"] = int(value)
        variants.append((f"{kernel} {item}", kernel, knobs))
    f, T = FLASH_ATTENTION, args.attn_chunk
    plan = mqa_prefill_plan(dev, f["hd"], f["H"])
    print(f"attention: {describe(dev)['reason']}; chunk {T} tokens; clock warm-up {warm_ms:g} ms")
    rows = []
    with ClockWarmer(dev, warm_ms) as warm:
        for P in [int(p) for p in args.attn_positions.split(",")]:
            capacity = max(1024, 1 << (P + T - 1).bit_length())
            for mode in dict.fromkeys(FLASH_LAYERS):
                arrays, prm = attention_inputs(rng, mode, T, P, capacity)
                row = {"mode": mode, "P": P, "T": T, "ms": {}, "nmse": {}}
                old = None
                for label, kernel, knobs in [("cluster", "cluster", {})] + variants:
                    with tuned(knobs):
                        g = Graph()
                        g.output("y", g.op("MQA_ATTENTION", *[g.const(a) for a in arrays], kernel=kernel, **prm))
                        try:
                            ms, y, _ = gpu_ms(ex, g, {}, args.replays, warm)
                        except Exception as e:
                            print(f"  {mode} P={P} {label}: {type(e).__name__}: {e}", flush=True)
                            row.setdefault("errors", {})[label] = f"{type(e).__name__}: {e}"
                            continue
                    row["ms"][label] = ms
                    if old is None:
                        old = y
                    else:
                        row["nmse"][label] = nmse(y, old)
                        if kernel.startswith("prefill_coopmat") and not row["nmse"][label] <= 1e-5:
                            print(f"  {mode} P={P} {label}: NMSE {row['nmse'][label]:.2e} against the f32 "
                                  "kernel, past the matrix units' bound 1e-5", flush=True)
                            row.setdefault("errors", {})[label] = f"NMSE {row['nmse'][label]:.3e} > 1e-5"
                del arrays
                base = row["ms"].get("cluster")
                print(f"{mode:7s} P={P:6d} T={T} | " + " | ".join(
                    f"{label} {ms:8.3f} ms" + (f" {base / ms:5.2f}x" if base and label != "cluster" else "")
                    + (f" nmse {row['nmse'][label]:.1e}" if label in row["nmse"] else "")
                    for label, ms in row["ms"].items()), flush=True)
                rows.append(row)
    chunks = {}
    for P in sorted({r["P"] for r in rows}):
        by_mode = {r["mode"]: r["ms"] for r in rows if r["P"] == P}
        labels = set.intersection(*(set(ms) for ms in by_mode.values()))
        chunks[P] = {label: sum(by_mode[m][label] for m in FLASH_LAYERS) for label in sorted(labels)}
        print(f"flash-1gpu chunk at P={P} (4 layers): " + ", ".join(f"{k} {v:.3f} ms" for k, v in chunks[P].items()))
    return {"warm_ms": warm_ms, "plan": {k: v for k, v in plan.items() if k not in ("lanes", "extra")},
            "coopmat_kernel": cm, "coopmat_plan": mqa_prefill_coopmat_plan(dev, f["hd"], f["H"]),
            "rows": rows, "flash_1gpu_chunk_ms": chunks}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="small shapes only (CPU devices)")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--gemm", action="store_true", help="the prefill mat-mul table (matrix units, f32 lanes, cuBLAS)")
    ap.add_argument("--gemm-t", default="16,64,512,4096", help="tokens of the --gemm rows")
    ap.add_argument("--gemm-shapes", default=GEMM_SHAPES, help="NxK,... of the --gemm rows")
    ap.add_argument("--gemm-weights", default="bf16", help="weights of the --gemm rows, of " + ",".join(GEMM_WEIGHTS)
                    + " (FP8 / FP4: random codes; torch multiplies their dequantised values)")
    ap.add_argument("--fp8-scales", default="block,fold", help="coopmat.fp8_scales of the FP8 rows' coopmat runs "
                    "(block, fold or both)")
    ap.add_argument("--torch-dtypes", default=",".join(TORCH_DTYPES), help="torch.matmul's precisions, of "
                    + ",".join(TORCH_DTYPES))
    ap.add_argument("--coopmat-tiles", default="default",
                    help=f"variants of the coopmat kernel, {TILE_FIELDS},..., "
                         "default (the knobs') or variants (" + COOPMAT_VARIANTS + ")")
    ap.add_argument("--check-rows", type=int, default=64, help="rows of each result checked against float64")
    ap.add_argument("--no-torch", action="store_true", help="leave out torch.matmul")
    ap.add_argument("--no-f32", action="store_true", help="leave out the f32-lane kernel")
    ap.add_argument("--warm-ms", type=float, default=None, help="clock warm-up (default: 500 ms on GPUs, 0 on CPUs)")
    ablation.add_flags(ap, "--coopmat-ablate", COOPMAT_ABLATIONS, "the coopmat kernel")
    ap.add_argument("--ablate-tiles", default="default", help="the coopmat variants the ablations run (as "
                    "--coopmat-tiles)")
    ap.add_argument("--attention", action="store_true", help="the prefill attention table (cluster vs prefill kernel)")
    ap.add_argument("--attn-chunk", type=int, default=512, help="--attention: tokens of the chunk")
    ap.add_argument("--attn-positions", default="1024,4096", help="--attention: first positions of the chunk")
    ap.add_argument("--attn-variants", default="", help="--attention: prefill-kernel knob sets heads=H/tile=T/keys=K/literal=1,...")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    ablations = ablation.chosen("--coopmat-ablate", args.coopmat_ablate, args.ablation_child, COOPMAT_ABLATIONS)
    ex = Executor(timestamps=True)
    rng = np.random.default_rng(0)
    print(f"device: {ex.device.name} ({ex.device.caps.type}, subgroup {ex.device.subgroup_size})")
    if args.attention:
        doc = {"device": ex.device.name, **attention_table(ex, args, rng)}
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    if args.gemm:
        doc = {"device": ex.device.name, **gemm_table(ex, args, rng)}
        if ablations:                       # the coopmat rows only, --ablate-tiles variants
            doc["ablations"] = ablation.run_children(
                __file__, ablations, argv, ("--json", "--coopmat-tiles", "--coopmat-ablate", "--ablate-tiles"),
                ("--no-torch", "--no-f32", "--coopmat-tiles", args.ablate_tiles), lambda line: line.startswith("T="))
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    results = []
    for T, K, N in MATMULS:
        if args.quick and T * K * N > 2**26:
            continue
        x = rng.standard_normal((T, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        line = [f"MUL_MAT T={T:4d} K={K:5d} N={N:5d} (auto: {pick_kernel(ex.device, T, N).kernel})"]
        for kernel in ("gemv", "gemm_regs", "gemm_shared"):
            if ex.device.caps.type == "cpu" and kernel == "gemm_shared" and T * N > 4096:
                continue                                   # barrier-bound on lavapipe: minutes
            g = Graph()
            g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(w), kernel=kernel))
            ms, _, _ = gpu_ms(ex, g, {"x": x}, args.replays)
            gflops, gbs = 2 * T * K * N / ms / 1e6, 4 * (T * K + N * K + T * N) / ms / 1e6
            line.append(f"{kernel} {ms:8.3f} ms {gflops:7.1f} GF/s {gbs:6.1f} GB/s")
            results.append({"op": "MUL_MAT", "T": T, "K": K, "N": N, "kernel": kernel, "ms": ms,
                            "gflops": gflops, "gbs": gbs})
        print(" | ".join(line), flush=True)
    for op, shape, params in ROWS:
        a = rng.standard_normal(shape).astype(np.float32)
        g = Graph()
        y = g.op(op, g.input("x", shape), **params)
        g.output("y", y)
        ms, _, _ = gpu_ms(ex, g, {"x": a}, args.replays)
        gbs = 4 * (a.size + int(np.prod(y.shape))) / ms / 1e6
        print(f"{op:8s} {str(shape):16s} {ms:8.3f} ms {gbs:6.1f} GB/s", flush=True)
        results.append({"op": op, "shape": shape, "ms": ms, "gbs": gbs})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": ex.device.name, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
