#!/usr/bin/env python3
"""GPU time of MUL_MAT at one token (the decode GEMV) at DeepSeek-V4-Flash's projection shapes,
bf16 weights or the published FP8 ones (--formats bf16,fp8: E4M3 codes and a scale per 128 × 128
block; fp4 too), in GB/s of the weight bytes read (codes and scales) and as a share of the measured
copy bandwidth, with
its load knobs side by side in one run (tuning knobs gemv.unroll, gemv.spread): a workgroup per output where
outputs are few (spread) against subgroup-lane clusters, and the steps in flight per lane (unroll);
plain and with the RMS norm folded in. Each row: median over replays of a recording that runs the
mat-mul `--repeat` times back to back (a timestamp before and after only), after the clock warm-up.
Each shape's rows follow the time of reading its weight bytes alone (floor.read_us: the plainest read
kernel, the same copies with --cold): every row also says what share of that read time it takes,
the dispatch's own fill and drain counted on both sides.

    . .vkdev/enter.sh; python3 tools/bench_gemv.py --json $OUT/gemv.json
    . .vkdev/enter.sh; python3 tools/bench_gemv.py --formats fp8 --shapes wq_b,wo_b,wo_a,wq_a,wkv \
        --unroll 4,8,16 --rows 1,2,4 --json $OUT/gemv_fp8.json
    . .vkdev/enter.sh; python3 tools/bench_gemv.py --formats fp8,fp4 --load 4,16 --json $OUT/gemv_load.json
    . .vkdev/enter.sh; python3 tools/bench_gemv.py --formats bf16,fp8,fp4 --shapes wq_b,wo_b,wo_a,wq_a,wkv \
        --spread -1 --unroll 4 --x-shared 0,1 --xs-rows 1,2,4 --xs-unroll 2 --xs-wg 64,256 \
        --json $OUT/gemv_xshared.json
--cold: each GEMV of a recording reads its own copy of the weights (copies spanning 512 MiB, barriers
between them as in the model), so the weights come from device memory as in the decode step rather
than partly from the L2 cache, as a matrix repeated back to back does.
Quantised weights: --x-shared 0,1 puts the staged GEMV (knob gemv_quant.x_shared: x in shared memory,
16-byte code loads, persistent clusters) beside the word-load GEMV in the same run, its own knobs
(gemv_quant.x_shared_rows / _unroll / _groups / _wg / _lanes / _one_scale) swept by --xs-rows, --xs-unroll,
--xs-groups, --xs-wg, --xs-lanes, --xs-one-scale; the word-load knobs (--spread, --unroll, --rows, --load) apply to the other rows only.
--ablate nocvt,nodecode,nox,nofma,noload,nostage,nonorm: after the table, the staged rows again (same formats, shapes,
knobs, --cold) with a part of the staged GEMV removed, each in a child process (tools/ablation.py; the
results are wrong on purpose, only the time is read), printed as `ablation NAME <row>`:

    . .vkdev/enter.sh; python3 tools/bench_gemv.py --cold --formats fp8,fp4 --shapes wq_b,wo_a,wo_b \
        --x-shared 1 --xs-rows -1 --ablate nocvt,nodecode,nox,nofma,noload,nostage --json $OUT/gemv_ablate.json
"""
import argparse
import itertools
import json
import sys

import numpy as np

import ablation
from dsv4_vk.cli import floor as F
from dsv4_vk.cli.bench import median_gpu_us
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.ops.quant import QUANT, quant_arrays
from dsv4_vk.vk import default_device

# (label, N outputs, K inputs): the head, q's up-projection, o's two, q's and kv's down-projections
COLD_BYTES = 512 << 20
SHAPES = [("head", 129280, 4096), ("wq_b", 32768, 1024), ("wo_b", 4096, 8192), ("wo_a", 8192, 4096),
          ("wq_a", 1024, 4096), ("wkv", 512, 4096)]
# --ablate: the staged GEMV (mul_mat.comp -D X_SHARED) with a part removed. nodecode, nofma: its dot
# product of a uvec4 of codes (tools/ablation.py); nox: x from a register (the lane's index) rather
# than shared memory; noload: the loop's code and scale words made from the step's index rather than
# loaded (the first step's, before the staging, still loaded); nostage: x not staged (no staging loop
# or barrier: the loop reads shared memory nothing wrote); nonorm (the +norm rows only): the folded norm's
# sum of the workgroup's partial Σx² and its 1/rms left out (x·g still staged, Σx² still summed a
# cluster at a time): how much of the +norm rows' extra time those take.
_XS = "mul_mat.comp"
GEMV_ABLATIONS = {
    "nocvt": ablation.STAGED_DOT["nocvt"],
    "nodecode": ablation.STAGED_DOT["nodecode"],
    "nox": [(_XS, "for (uint c = 0; c < Q_XV; ++c) xv[c] = xs[c * KU + j];",
             "for (uint c = 0; c < Q_XV; ++c) xv[c] = vec4(float(lane + c));")],
    "nofma": ablation.STAGED_DOT["nofma"],
    "noload": [(_XS, "nw[i][u] = wq4[wb1[i] / 4u + j];", "nw[i][u] = uvec4(j, j ^ wb1[i], j * 0x9E3779B9u, j + sb1[i]);"),
               (_XS, "ns[i][u] = wscale[(sb1[i] + j * Q_XV * 4u / Q_BC) >> 2];", "ns[i][u] = j ^ sb1[i];")],
    "nonorm": [(_XS, "    for (uint c = 0; c < parts; ++c) s2 += xs_ss[c];\n    inv = 1.0 / sqrt(s2 / float(p.K) + p.eps);\n",
                "")],
    "nostage": [(_XS, "    float s2 = stage_x(x_row(b0, b1, 0u), 0u, 1u, KU);\n", "    float s2 = 0.0;\n"),
                (_XS, "    barrier();\n#if defined(NORM_X)\n    s2 = 0.0;\n", "#if defined(NORM_X)\n    s2 = 0.0;\n")],
}


def make_weights(fmt, N, K, rng):
    """(weight arrays: w[, scale bytes], op params, bytes read a token) of random N × K weights."""
    if fmt == "bf16":
        w = (rng.standard_normal((N, K), dtype=np.float32) / np.sqrt(K)).astype(BF16)
        return [w], {}, w.nbytes
    q = QUANT[fmt]
    codes = rng.integers(0, 256, (N, K * q.bits // 8), dtype=np.uint8)
    if fmt == "fp8":
        codes[(codes & 0x7F) == 0x7F] = 0x38                      # no NaN codes
    scale = rng.integers(100, 110, q.grid(N, K), dtype=np.uint8)
    words, sw = quant_arrays(codes, scale)
    return [words, sw], {"wq": fmt}, codes.nbytes + scale.nbytes


def gemv_graph(weights, params, K, norm, rng, copies=1):
    """(graph, inputs) of `copies` GEMVs one after another (each writes the same output: a barrier
    between them), each over its own copy of the weights (the norm folded in or not), built under
    the current tuning (a graph keeps the knobs it was built with)."""
    g = Graph()
    x = g.input("x", (1, K))
    norm_w = [g.const(rng.standard_normal(K).astype(np.float32))] if norm else []
    y = None
    for _ in range(copies):
        args = [x, g.const(weights[0])] + norm_w + [g.const(a) for a in weights[1:]]
        y = g.op("MUL_MAT", *args, **params, **({"rms_eps": 1e-6} if norm else {}), out=y)
    g.output("y", y)
    return g, {"x": rng.standard_normal((1, K)).astype(np.float32)}


def cold_copies(cold: bool, nbytes: int) -> int:
    """Copies of the weights a timed recording cycles through: with --cold enough that they span
    COLD_BYTES, so each GEMV reads its weights from device memory as the decode step does (the same
    matrix repeated back to back would stay partly in the GPU's L2 cache: the H200 has 50 MB)."""
    return max(1, -(-COLD_BYTES // nbytes)) if cold else 1


def kernel_used(launch, knobs):
    """(kind, description) of the kernel the GEMV lowered to, with the values it was given (knobs
    left at None take the device's defaults, read back from the launch)."""
    if "X_SHARED" in launch.defines:
        return "staged", (f"staged rows={launch.spec[2]} unroll={knobs['gemv_quant.x_shared_unroll']} "
                          f"groups={knobs['gemv_quant.x_shared_groups']:4d} wg={launch.spec[0]:3d} "
                          f"lanes={launch.defines['LANES']:2d}{' one' if launch.spec[5:] == (1,) else ''}")
    wg = launch.spec[0] if "LANES_WORKGROUP" in launch.defines else None
    nr, wide = launch.spec[2:4] if len(launch.spec) >= 4 else (1, 0)
    return "words", f"wg lanes={wg or '-':3} unroll={launch.spec[1]:2d} rows={nr} load={16 if wide else 4:2d}"


def ints(text):
    return [int(v) for v in text.split(",")]


def configs(a, fmt):
    """The knob settings to time for one format: the word-load GEMV's sweep, then (quantised weights,
    --x-shared 1) the staged GEMV's."""
    base = {"gemv_quant.x_shared": False, "gemv_quant.x_shared_rows": 2, "gemv_quant.x_shared_unroll": 2,
            "gemv_quant.x_shared_groups": 1024, "gemv_quant.x_shared_wg": 256, "gemv_quant.x_shared_lanes": None,
            "gemv_quant.x_shared_one_scale": False}
    quant = fmt != "bf16"
    out = []
    if 0 in ints(a.x_shared) or not quant:
        for spread, unroll, nr, load in itertools.product(ints(a.spread), ints(a.unroll), ints(a.rows) if quant else [1],
                                                          ints(a.load) if quant else [4]):
            out.append({**base, "gemv.spread": None if spread < 0 else spread, "gemv.unroll": unroll,
                        "gemv_quant.rows": nr, "gemv_quant.load": load})
    if 1 in ints(a.x_shared) and quant:
        for nr, unroll, groups, wg, lanes, one in itertools.product(ints(a.xs_rows), ints(a.xs_unroll),
                                                                    ints(a.xs_groups), ints(a.xs_wg), ints(a.xs_lanes),
                                                                    ints(a.xs_one_scale)):
            out.append({**base, "gemv.spread": None, "gemv.unroll": None, "gemv_quant.rows": 1, "gemv_quant.load": 4,
                        "gemv_quant.x_shared": True, "gemv_quant.x_shared_rows": None if nr < 0 else nr,
                        "gemv_quant.x_shared_unroll": unroll, "gemv_quant.x_shared_groups": groups,
                        "gemv_quant.x_shared_wg": wg, "gemv_quant.x_shared_lanes": None if lanes < 0 else lanes,
                        "gemv_quant.x_shared_one_scale": bool(one)})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=4, help="mat-muls back to back per recording")
    ap.add_argument("--unroll", default="1,4,8", help="steps in flight per lane to sweep")
    ap.add_argument("--spread", default="-1,0", help="lanes the GPU should have at work (-1: the default "
                    "GEMV_SPREAD; 0: subgroup-lane clusters only)")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="of " + ", ".join(s[0] for s in SHAPES))
    ap.add_argument("--formats", default="bf16", help="weight formats to compare: bf16, fp8, fp4")
    ap.add_argument("--rows", default="1", help="quantised weights: output rows a cluster to sweep "
                    "(knob gemv_quant.rows: 1, 2, 4)")
    ap.add_argument("--load", default="4", help="quantised weights: bytes of codes a lane loads a step to "
                    "compare (knob gemv_quant.load: 4, 16)")
    ap.add_argument("--x-shared", default="0", help="quantised weights: the staged GEMV off (0), on (1) or both "
                    "(0,1; knob gemv_quant.x_shared)")
    ap.add_argument("--xs-rows", default="2", help="staged GEMV: output rows a cluster to sweep (1, 2, 4; "
                    "-1: the knob's default, 4 where N and K are both at least 4096, else 1)")
    ap.add_argument("--xs-unroll", default="2", help="staged GEMV: uvec4 steps a lane loads together to sweep")
    ap.add_argument("--xs-groups", default="1024", help="staged GEMV: workgroups at most to sweep")
    ap.add_argument("--xs-wg", default="256", help="staged GEMV: invocations a workgroup to sweep (powers of two ≤ 256)")
    ap.add_argument("--xs-lanes", default="-1", help="staged GEMV: lanes a cluster to sweep (powers of two from 2 to "
                    "the subgroup; -1: the knob's default, a whole subgroup)")
    ap.add_argument("--xs-one-scale", default="0", help="staged GEMV: FP8 rows of a cluster sharing one scale word "
                    "load a step off (0), on (1; where their layout allows it) or both (0,1)")
    ap.add_argument("--cold", action="store_true", help="each GEMV reads its own copy of the weights, the copies "
                    f"spanning {COLD_BYTES >> 20} MiB: read from device memory, not the L2 cache (as in the decode step)")
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each row (default 500 on GPUs)")
    ap.add_argument("--json")
    ablation.add_flags(ap, "--ablate", GEMV_ABLATIONS, "the staged rows")
    argv = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
    ablations = ablation.chosen("--ablate", a.ablate, a.ablation_child, GEMV_ABLATIONS)
    quant = [f for f in a.formats.split(",") if f != "bf16"]
    if ablations and not (quant and 1 in ints(a.x_shared)):
        raise SystemExit("--ablate times the staged GEMV's rows again: it needs --formats fp8 and/or fp4 and "
                         f"--x-shared 1 (or 0,1), got --formats {a.formats} --x-shared {a.x_shared}")
    dev = default_device()
    rng = np.random.default_rng(0)
    shapes = [s for s in SHAPES if s[0] in a.shapes.split(",")]
    rows = []
    with F.ClockWarmer(dev, F.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms) as warm:
        copy = F.copy_gbps(dev, warm=warm)
        print(f"{dev.name}: copy {copy:.0f} GB/s", flush=True)
        for fmt, (label, N, K), norm in itertools.product(a.formats.split(","), shapes, (False, True)):
            if not norm:
                weights, params, nbytes = make_weights(fmt, N, K, rng)
                # the same bytes read by the plainest kernel, over as many copies: the GEMV's floor here
                read = F.read_us(dev, -(-nbytes // 16) * 16, cold_copies(a.cold, nbytes), a.replays, a.repeat, warm)
                print(f"read {fmt:4s} {label:5s} ({N:6d}, {K:5d}) {nbytes / 2**20:.1f} MiB alone: {read:.1f} µs "
                      f"({nbytes / (read * 1e3) / copy * 100:.1f}% of copy)", flush=True)
            for knobs in configs(a, fmt):
                with tuned(knobs):
                    copies = cold_copies(a.cold, nbytes)
                    g, inputs = gemv_graph(weights, params, K, norm, rng, copies)
                    launch = g.nodes[0].op.lower(g.nodes[0], dev)[0]
                    kind, how = kernel_used(launch, knobs)
                    # named before it runs: a run that stops the device leaves its variant on screen
                    print(f"{fmt:4s} {label:5s} ({N:6d}, {K:5d}){' +norm' if norm else '      '} {how:47s} ", end="",
                          flush=True)
                    us = median_gpu_us(dev, g, inputs, a.replays, warm, a.repeat) / copies
                gbps = nbytes / (us * 1e3)
                words = kind == "words"
                rows.append({"format": fmt, "shape": label, "N": N, "K": K, "norm": norm,
                             "spread": knobs["gemv.spread"], "kernel": kind,
                             "wg_lanes": launch.spec[0] if "LANES_WORKGROUP" in launch.defines and words else None,
                             "unroll": launch.spec[1] if words else None,
                             "rows_per_cluster": launch.spec[2] if words and len(launch.spec) >= 4 else 1,
                             "load_bytes": (16 if launch.spec[3] else 4) if words and len(launch.spec) >= 4 else 4,
                             "x_shared": kind == "staged",
                             "xs_rows": launch.spec[2] if kind == "staged" else knobs["gemv_quant.x_shared_rows"],
                             "xs_unroll": knobs["gemv_quant.x_shared_unroll"],
                             "xs_groups": knobs["gemv_quant.x_shared_groups"], "xs_wg": knobs["gemv_quant.x_shared_wg"],
                             "xs_lanes": launch.defines["LANES"] if kind == "staged" else None,
                             "xs_one_scale": kind == "staged" and launch.spec[5:] == (1,),
                             "bytes": nbytes, "us": us, "weight_copies": copies,
                             "gbps": gbps, "pct_copy": 100 * gbps / copy, "read_us": read,
                             "pct_read": 100 * read / us})
                print(f"{us:8.1f} µs {gbps:7.0f} GB/s {100 * gbps / copy:5.1f}% of copy {100 * read / us:5.1f}% of the read",
                      flush=True)
    doc = {"device": dev.name, "copy_gbps": copy, "cold": a.cold, "rows": rows}
    if ablations:                           # the staged rows only, at the parent's shapes and knobs
        doc["ablations"] = ablation.run_children(__file__, ablations, argv, ("--json", "--ablate", "--x-shared", "--formats"),
                                                 ("--x-shared", "1", "--formats", ",".join(quant)),
                                                 lambda line: line.startswith(("fp8", "fp4")))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
