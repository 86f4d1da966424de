#!/usr/bin/env python3
"""GPU time of the model's decode kernels other than the dense projections, at DeepSeek-V4-Flash
widths (T = 1, D = 4096, 64 heads of 512, the shapes of `tools/model_gpu_bench.py`), with the
variants that decide their speed side by side in one run:

- MQA_ATTENTION (+ MQA_COMBINE when split) in each layer kind (sliding window; HCA; CSA with the
  indexer's top-k), tiled and cluster kernels, over key-list splits (with the model's decode
  choice) and keys in flight per cluster; split lists also merged in the attention's own dispatch
  (merge=True, the model's default) at each --merge-steps (knob mqa_merge.step). The rows sum the
  dispatches' GPU times: the barrier and launch that merge=True saves are in
  tools/model_gpu_bench.py's decode step (--variants mqa_merge=0), not here;
- MUL_MAT at T = 1 (bf16, plain and with the RMS norm folded in) and MUL_MAT_ID (the routed +
  shared experts' SwiGLU and weighted sum, bf16) over vec4 steps in flight per lane, in GB/s of
  the weights they read;
- the row ops of a decode step (RMS_NORM, ROPE) at their model shapes;
- the selection ops of a decode step ("select"): the indexer's INDEX_SCORE and TOPK over the CSA
  layer's compressed keys, V4_ROUTE, the whole router (MUL_MAT + V4_ROUTE against V4_GATE and its
  knobs), and the two-stage SAMPLE over the vocabulary, with the knob
  that sets INDEX_SCORE's layout (heads per step);
- "topk" (not in the default --only): the indexer's TOPK over --topk-entries closed entries (8192:
  a 32k context), k 512, at tile sizes (TOPK_TILES + TOPK, or one TOPK where a tile holds them
  all), the same entries in caches 4× and 32× larger, and a quarter of them closed; then one TOPK
  over them at each --topk-variants workgroup size, radix digit width and bin scan (knobs
  topk_wg.*, topk_bits.*, topk_scan.*, topk_spread.*).

Each row: median over replays of one recorded command buffer, a timestamp after every dispatch
(summed over the row's dispatches), after the clock warm-up.

    python tools/bench_decode_ops.py [--replays 20] [--quick] [--json out.json]
    python tools/bench_decode_ops.py --only topk [--topk-entries 8192] [--topk-variants 1024:11,256:8]
        --json topk.json
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from dsv4_vk.cli.floor import ClockWarmer
from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.core.tuning import Tuning, current, tuned
from dsv4_vk.ops import compress, sample, v4_attention


def gpu_us(ex, g, feeds, replays, warm):
    ex.run(g, **feeds)                                   # compile, record, warm up
    warm()
    times = []
    for _ in range(replays):
        ex.run(g, **feeds)
        times.append(float(np.sum(ex.last.stats.gpu_ns)) / 1e3)
    return statistics.median(times), ex.last.stats.dispatches


def mqa_graph(rng, mode, H, hd, ctx, window, pos, splits, n_ent, K, kernel, merge=False):
    g = Graph()
    q = g.const(rng.standard_normal((1, H, hd)).astype(np.float32))
    kv = g.const(rng.standard_normal((ctx, hd)).astype(np.float32))
    p = g.const(np.array([pos], np.int32))
    sinks = g.const(rng.standard_normal(H).astype(np.float32))
    extra, prm = [], {}
    if mode != "sliding":
        extra.append(g.const(rng.standard_normal((n_ent, hd)).astype(np.float32)))
        prm = {"mode": mode, "rate": 4 if mode == "csa" else 128}
    if mode == "csa":
        extra.append(g.const(rng.permutation(n_ent)[:K].astype(np.int32).reshape(1, K)))
    o = g.op("MQA_ATTENTION", q, kv, p, sinks, *extra, scale=hd ** -0.5, window=window, splits=splits,
             capacity=ctx, kernel=kernel, merge=merge, **prm)
    if splits > 1 and not merge:
        o = g.op("MQA_COMBINE", o, sinks, splits=splits)
    g.output("o", o)
    return g


def moe_graphs(rng, w13, w2, R):
    E, F, D = w2.shape[0], w2.shape[2], w2.shape[1]
    route = np.zeros((1, R, 2), np.float32)
    route[0, :, 0] = rng.permutation(E)[:R]
    route[0, :, 1] = rng.random(R)
    g1 = Graph()
    g1.output("h", g1.op("MUL_MAT_ID", g1.input("x", (1, 1, D)), g1.const(w13), g1.const(route), mode="swiglu",
                         limit=10.0))
    gn = Graph()                                         # with the FFN norm folded in
    gn.output("h", gn.op("MUL_MAT_ID", gn.input("x", (1, 1, D)), gn.const(w13), gn.const(route),
                         gn.const(rng.standard_normal(D).astype(np.float32)), mode="swiglu", limit=10.0, rms_eps=1e-6))
    g2 = Graph()
    g2.output("y", g2.op("MUL_MAT_ID", g2.input("h", (1, R, F)), g2.const(w2), g2.const(route), mode="sum"))
    x = {"x": rng.standard_normal((1, 1, D)).astype(np.float32)}
    return (g1, x, R * 2 * F * D * 2), (gn, x, R * 2 * F * D * 2), \
           (g2, {"h": rng.standard_normal((1, R, F)).astype(np.float32)}, R * D * F * 2)


ORDERS = {"entry": False, "sorted": True}      # --topk-orders: TOPK's sorted= (the model's: entry order)


def topk_rows(rng, row, cases, tiles, orders):
    """The indexer's TOPK (k 512, rate 4) at decode: for each (cache entries n, position) in cases,
    the (pos + 1)/4 closed entries ranked, one TOPK per row or TOPK_TILES + TOPK per tile size
    (None: the default, knob topk_tile.entries), in each order (ORDERS)."""
    for n, pos in cases:
        scores = rng.standard_normal((1, n)).astype(np.float32)
        for tile in tiles:
            for order in orders:
                g = Graph()
                g.output("i", compress.topk(g, g.input("s", (1, n)), min(512, n), rate=4, capacity=4 * n, tile=tile,
                                            pos=g.const(np.array([pos], np.int32)), sorted=ORDERS[order]))
                t = tile or compress.TOPK_TILE["entries"]
                row(f"TOPK {min((pos + 1) // 4, n)} of {n} entries, k {min(512, n)}, tile {t}, {order}", g,
                    {"s": scores}, tile=t, entries=n, valid=min((pos + 1) // 4, n), order=order)


def select_rows(ex, rng, args, warm, ctx, pos, D, E):
    """INDEX_SCORE and TOPK of the CSA layer (rate 4: ctx/4 compressed keys, (pos + 1)/4 of them
    closed), V4_ROUTE (E experts, top 6 + the shared one) and SAMPLE (greedy) at decode."""
    nI, hI, V = (8, 32, 5000) if args.quick else (64, 128, 129280)
    n = ctx // 4
    rows = []

    def row(label, g, feeds, **extra):
        us, nd = gpu_us(ex, g, feeds, args.replays, warm)
        print(f"{label:44s} {us:8.1f} µs  ({nd} dispatch{'es' if nd > 1 else ''})", flush=True)
        rows.append({"op": label.split()[0], "label": label, "us": us, "dispatches": nd, **extra})

    for heads in (None, 1, 4, 8):                      # the cluster kernel; None: SCATTER where it runs
        g = Graph(Tuning({"index_score.heads": heads, "index_score.gpu": "cluster"}))
        g.output("s", g.op("INDEX_SCORE", g.input("q", (1, nI, hI)), g.input("w", (1, nI)), g.const(
            rng.standard_normal((n, hI)).astype(np.float32)), g.const(np.array([pos], np.int32)), rate=4,
            scale=hI ** -0.5 * nI ** -0.5, capacity=ctx))
        row(f"INDEX_SCORE {nI} heads x {hI}, {n} keys, heads/step {heads or 'default'}", g,
            {"q": rng.standard_normal((1, nI, hI)).astype(np.float32),
             "w": rng.standard_normal((1, nI)).astype(np.float32)}, heads=heads)
    # the long path: every entry of a 32k and a 1M context closed, each kernel (knob index_score.gpu)
    for keys in ((64, 2048) if args.quick else (8192, 262144)):
        for kernel in ("entry", "cluster"):
            g = Graph(Tuning({"index_score.gpu": kernel, "index_score.cpu": kernel}))
            g.output("s", g.op("INDEX_SCORE", g.input("q", (1, nI, hI)), g.input("w", (1, nI)), g.const(
                rng.standard_normal((keys, hI)).astype(np.float32)), g.const(np.array([4 * keys - 1], np.int32)),
                rate=4, scale=hI ** -0.5 * nI ** -0.5, capacity=4 * keys))
            row(f"INDEX_SCORE {nI} heads x {hI}, {keys} keys, {kernel} kernel", g,
                {"q": rng.standard_normal((1, nI, hI)).astype(np.float32),
                 "w": rng.standard_normal((1, nI)).astype(np.float32)}, kernel=kernel, keys=keys)
    topk_rows(rng, row, [(n, pos)], [None], ["entry"])
    g = Graph()
    g.output("r", g.op("V4_ROUTE", g.input("l", (1, E)), g.const(rng.standard_normal(E).astype(np.float32) * 0.1),
                       top_k=6, scoring="sqrtsoftplus", route_scale=1.5))
    row(f"V4_ROUTE {E} experts, top 6", g, {"l": rng.standard_normal((1, E)).astype(np.float32)})
    # the router whole: the gate's GEMV (bf16 [E, D], the FFN norm folded) then V4_ROUTE, against V4_GATE
    # (one dispatch; knobs v4_gate.*). Replayed alone, the 2 MB of gate weights stay in the L2 cache.
    gate_w = (rng.standard_normal((E, D)) * D ** -0.5).astype(BF16)
    norm_w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    for label, knobs in (("MUL_MAT + V4_ROUTE", None), ("V4_GATE", {}), ("V4_GATE", {"v4_gate.rows": 2}),
                         ("V4_GATE", {"v4_gate.unroll": 1}), ("V4_GATE", {"v4_gate.wg": 128})):
        g = Graph(Tuning(knobs or {}))
        x, w, gw, b = g.input("x", (1, D)), g.const(gate_w), g.const(norm_w), g.const(bias)
        prm = {"top_k": 6, "scoring": "sqrtsoftplus", "route_scale": 1.5}
        if knobs is None:
            g.output("r", g.op("V4_ROUTE", g.op("MUL_MAT", x, w, gw, rms_eps=1e-6), b, **prm))
        else:
            g.output("r", g.op("V4_GATE", x, w, gw, b, rms_eps=1e-6, **prm))
        row(f"{label} {E} x {D} bf16, top 6" + "".join(f", {k} {v}" for k, v in (knobs or {}).items()), g,
            {"x": rng.standard_normal((1, D)).astype(np.float32)}, knobs=knobs)
    g = Graph()
    g.output("t", sample.sample(g, g.input("l", (1, V)), g.const(np.array([0.0, 1.0], np.float32)),
                                g.const(np.array([1, 0], np.int32))))
    row(f"SAMPLE greedy, vocab {V}", g, {"l": rng.standard_normal((1, V)).astype(np.float32)})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="small shapes (a dry run on CPU devices)")
    ap.add_argument("--splits", default="1,3,8,32", help="MQA key-list splits to sweep (and the decode choice)")
    ap.add_argument("--merge-steps", default="4,16", help="MQA splits merged in the attention's dispatch "
                    "(merge=True) at these parts a step (knob mqa_merge.step); empty: not measured")
    ap.add_argument("--keys", default="1,4", help="MQA keys in flight per cluster (cluster kernel) to sweep")
    ap.add_argument("--kernels", default="cluster,tiled", help="MQA kernels to run: cluster, tiled")
    ap.add_argument("--unroll", default="1,4", help="MUL_MAT (T = 1) and MUL_MAT_ID vec4 steps in flight per "
                    "lane to sweep")
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each row (default 500 on GPUs)")
    ap.add_argument("--only", default="mqa,mul_mat,mul_mat_id,rows,select",
                    help="sections to run: mqa, mul_mat, mul_mat_id, rows, select, topk")
    ap.add_argument("--topk-entries", type=int, default=8192, help="topk: closed entries ranked (the indexer's "
                    "at a 32k context)")
    ap.add_argument("--topk-tiles", default="1024,2048,4096", help="topk: TOPK_TILES tile sizes to sweep beside "
                    "the default (a tile ≥ the entries: one TOPK dispatch)")
    ap.add_argument("--topk-orders", default="entry,sorted",
                    help="topk: TOPK's orders to measure: entry (sorted=False, the model's) and/or sorted")
    ap.add_argument("--topk-variants", default="1024:11,512:11,256:11,1024:8,1024:12",
                    help="topk: TOPK workgroup sizes, digit bits and bin scans (WG:BITS[:SCAN[+spread]], comma-separated; "
                    f"SCAN one of {', '.join(sorted(compress.TOPK_SCANS))}, default the device type's; +spread: "
                    "compress.TOPK_SPREAD's first digit) to sweep")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)
    ex = Executor(timestamps=True)
    cpu = ex.device.caps.type == "cpu"
    warm = ClockWarmer(ex.device, args.warm_ms if args.warm_ms is not None else (0 if cpu else 500))
    rng = np.random.default_rng(0)
    print(f"device: {ex.device.name} ({ex.device.caps.type}, subgroup {ex.device.subgroup_size})", flush=True)
    H, hd, ctx, window, pos = (4, 64, 64, 16, 40) if args.quick else (64, 512, 1024, 128, 512)
    D, F, E, R = (256, 128, 8, 3) if args.quick else (4096, 2048, 64, 7)
    results = []
    kinds = [("sliding", 0, 0), ("hca", ctx // 128 or 1, 0), ("csa", ctx // 4, min(512, ctx // 4))]
    only = set(args.only.split(","))
    if not set(args.kernels.split(",")) <= {"cluster", "tiled"}:
        ap.error(f"--kernels: expected cluster and/or tiled, got {args.kernels!r}")
    for mode, n_ent, K in kinds if "mqa" in only else []:
        n_keys = window + (K if mode == "csa" else min((pos + 1) // 128, n_ent) if mode == "hca" else 0)
        auto = v4_attention.mqa_decode_splits(ex.device, hd, n_keys)
        kernels = args.kernels.split(",")
        for kernel, keys in [("cluster", int(k)) for k in args.keys.split(",") if "cluster" in kernels] + \
                [("tiled", None)] * ("tiled" in kernels):
            line = [f"MQA {mode:7s} {kernel:7s} keys/cluster {keys or '-'}  ({n_keys} keys, decode splits {auto})"]
            for S in sorted({int(s) for s in args.splits.split(",")} | {auto}):
                with tuned({"mqa.keys": keys}):
                    g = mqa_graph(rng, mode, H, hd, ctx, window, pos, S, n_ent, K, kernel)
                us, n = gpu_us(ex, g, {}, args.replays, warm)
                line.append(f"S={S}: {us:6.1f}")
                results.append({"op": "MQA_ATTENTION", "mode": mode, "kernel": kernel, "keys": keys, "splits": S,
                                "us": us, "dispatches": n, "n_keys": n_keys})
                for step in [int(v) for v in args.merge_steps.split(",") if v] if S > 1 else []:
                    with tuned({"mqa.keys": keys, "mqa_merge.step": step}):
                        g = mqa_graph(rng, mode, H, hd, ctx, window, pos, S, n_ent, K, kernel, merge=True)
                    us, n = gpu_us(ex, g, {}, args.replays, warm)
                    line.append(f"merged/{step}: {us:6.1f}")
                    results.append({"op": "MQA_ATTENTION", "mode": mode, "kernel": kernel, "keys": keys, "splits": S,
                                    "merge_step": step, "us": us, "dispatches": n, "n_keys": n_keys})
            print(" | ".join(line) + "  µs", flush=True)
    w = (rng.standard_normal((8 * D, D)) / np.sqrt(D)).astype(BF16)     # the dense projections' kernel
    gn = rng.standard_normal(D).astype(np.float32)
    for unroll in (int(u) for u in args.unroll.split(",")) if "mul_mat" in only else []:
        for norm in (False, True):
            g = Graph(Tuning({"gemv.unroll": unroll}))
            g.output("y", g.op("MUL_MAT", g.input("x", (1, D)), g.const(w), *([g.const(gn)] if norm else []),
                               **({"rms_eps": 1e-6} if norm else {})))
            us, n = gpu_us(ex, g, {"x": rng.standard_normal((1, D)).astype(np.float32)}, args.replays, warm)
            label = "with RMS norm" if norm else "plain"
            print(f"MUL_MAT T=1 {w.shape} bf16 unroll {unroll} {label:13s} {us:8.1f} µs  "
                  f"{w.nbytes / us / 1e3:7.1f} GB/s of weights", flush=True)
            results.append({"op": "MUL_MAT", "shape": w.shape, "unroll": unroll, "norm": norm, "us": us,
                            "gbs": w.nbytes / us / 1e3})
    if "mul_mat_id" in only:
        w13 = (rng.standard_normal((E, 2 * F, D), np.float32) / np.sqrt(D)).astype(BF16)   # generated once
        w2 = (rng.standard_normal((E, D, F), np.float32) / np.sqrt(F)).astype(BF16)
    for unroll in (int(u) for u in args.unroll.split(",")) if "mul_mat_id" in only else []:
        with tuned({"mul_mat_id.unroll": unroll}):
            graphs = moe_graphs(rng, w13, w2, R)
        for label, (g, feeds, nbytes) in zip(("swiglu (w13)", "swiglu + norm", "sum (w2)"), graphs):
            us, n = gpu_us(ex, g, feeds, args.replays, warm)
            print(f"MUL_MAT_ID {label:12s} unroll {unroll}  {us:8.1f} µs  {nbytes / us / 1e3:7.1f} GB/s of expert "
                  f"weights", flush=True)
            results.append({"op": "MUL_MAT_ID", "mode": label, "unroll": unroll, "us": us, "gbs": nbytes / us / 1e3})
    rows = [("RMS_NORM", (1, D), {"eps": 1e-6}), ("RMS_NORM", (1, H, hd), {"eps": 1e-6}),
            ("RMS_NORM", (1, 1024 if not args.quick else 64), {"eps": 1e-6})]
    for op, shape, prm in rows if "rows" in only else []:
        g = Graph()
        g.output("y", g.op(op, g.input("x", shape), **prm))
        us, n = gpu_us(ex, g, {"x": rng.standard_normal(shape).astype(np.float32)}, args.replays, warm)
        print(f"{op:10s} {str(shape):16s} {us:8.1f} µs", flush=True)
        results.append({"op": op, "shape": shape, "us": us})
    if "select" in only:
        results += select_rows(ex, rng, args, warm, ctx, pos, D, E)
    if "topk" in only:
        n = args.topk_entries

        def row(label, g, feeds, **extra):
            us, nd = gpu_us(ex, g, feeds, args.replays, warm)
            print(f"{label:52s} {us:8.1f} µs  ({nd} dispatch{'es' if nd > 1 else ''})", flush=True)
            results.append({"op": "TOPK", "label": label, "us": us, "dispatches": nd, **extra})
        # every entry closed; then the same n closed entries in caches of 4n and 32n entries (the cost
        # must follow the closed entries, not the capacity); then a quarter of them closed
        orders = args.topk_orders.split(",")
        if not orders or set(orders) - set(ORDERS):
            ap.error(f"--topk-orders: expected a list of {sorted(ORDERS)}, got {args.topk_orders!r}")
        topk_rows(rng, row, [(n, 4 * n - 1), (4 * n, 4 * n - 1), (32 * n, 4 * n - 1), (n, n - 1)],
                  [None] + [int(t) for t in args.topk_tiles.split(",")], orders)
        kind = "cpu" if ex.device.caps.is_cpu else "gpu"
        for variant in args.topk_variants.split(","):
            parts = variant.split(":")
            scan, plus, spread = (parts[2] if parts[2:] else current()[f"topk_scan.{kind}"]).partition("+")
            if len(parts) not in (2, 3) or scan not in compress.TOPK_SCANS or (plus and spread != "spread"):
                ap.error(f"--topk-variants: expected WG:BITS[:SCAN[+spread]] with SCAN in "
                         f"{sorted(compress.TOPK_SCANS)}, got {variant!r}")
            wg, bits = int(parts[0]), int(parts[1])
            spreads = bool(spread) if plus or parts[2:] else bool(current()[f"topk_spread.{kind}"])
            tuning = Tuning({f"topk_{n}.{d}": v for n, v in (("wg", wg), ("bits", bits), ("scan", scan),
                                                              ("spread", spreads)) for d in ("gpu", "cpu")})
            # standard normal scores, and the indexer's: sums of ReLUs over 64 heads, clustered
            # in a few exponents (most keys share the first digit of their bits)
            for dist, scores in (("normal", rng.standard_normal((1, n))),
                                 ("relu-sum", np.maximum(rng.standard_normal((64, n)), 0).sum(0, keepdims=True) / 8)):
                for order in orders:
                    g = Graph(tuning)
                    g.output("i", compress.topk(g, g.input("s", (1, n)), min(512, n), rate=4, capacity=4 * n, tile=n,
                                                pos=g.const(np.array([4 * n - 1], np.int32)), sorted=ORDERS[order]))
                    scores = scores.astype(np.float32)
                    ref = compress.reference_topk(scores, min(512, n), sorted=ORDERS[order])
                    exact = bool(np.array_equal(ex.run(g, s=scores)["i"], ref))
                    row(f"TOPK {n} {dist}, k {min(512, n)}, WG {wg}, {bits}-bit, {scan} scan{' +spread' * spreads}, "
                        f"{order}{'' if exact else ' WRONG'}", g, {"s": scores}, wg=wg, bits=bits, scan=scan,
                        spread=spreads, scores=dist, exact=exact, entries=n, valid=n, order=order)
    warm.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": ex.device.name, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
