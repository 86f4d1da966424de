"""Check and time the HC_COMB variants (sg16, rows4) on a real GPU; also HC_PRE / HC_POST and the
unfused chains for scale. Run on the GPU machine from the repository root:

    . .vkdev/enter.sh; python3 tools/hc_gpu_check.py --out $OUT/hc_gpu.json [--replays 20]

Correctness: every variant the device can run (forced per call; a variant it cannot run is listed
with the reason) against the float64 numpy reference and the unfused chain, at T crossing subgroup
and workgroup boundaries and at a T whose grid folds past 65535 workgroups; guard regions checked.
Timing: GPU timestamps (first to last of the recorded command buffer), median of ≥ 10 replays
after a warm-up, at T = 1 and T = 2048 (--ts), for each variant and the unfused chain; HC_PRE /
HC_POST at D = 4096 and 7168, fused and unfused; a site's mixes through HC_MIX against RMS_NORM →
MUL_MAT at T = 1 … 2048 (--mix-ts: where hc.MIX_MAX_T should lie). Prints tables; writes JSON.
Exit status 1 when any check fails.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


from dsv4_vk import Graph, hc
from dsv4_vk.hc import policy as hc_policy
from dsv4_vk.core.executor import CompiledGraph
from dsv4_vk.hc.metrics import max_abs, nmse, nonfinite_mismatch
from dsv4_vk.hc.kernels import (ROWS4_WORKGROUP, reference_comb, reference_mixes, reference_post,
                            reference_pre)
from dsv4_vk.vk import default_device

PATH_NMSE, REF_NMSE = 1e-7, 1e-11


def comb_inputs(rng, T):
    return {"mixes": rng.uniform(-2, 2, (T, 24)).astype(np.float32),
            "scale": rng.uniform(-0.5, 0.5, 3).astype(np.float32),
            "base": rng.uniform(-0.25, 0.25, 24).astype(np.float32)}


def graph_for(op, shapes, fused, variant=None, device=None):
    g = Graph()
    t = {k: g.input(k, s) for k, s in shapes.items()}
    if op == "HC_COMB":
        out = hc.comb(g, t["mixes"], t["scale"], t["base"], fused=fused, variant=variant, device=device)
    elif op == "HC_PRE":
        out = hc.pre(g, t["x"], t["weights"], fused=fused, device=device)
    else:
        out = hc.post(g, t["f"], t["residual"], t["post"], t["comb"], fused=fused, device=device)
    g.output("out", out)
    return g


def run_once(device, graph, inputs):
    cg = CompiledGraph(device, graph)
    try:
        out = cg.run(inputs)["out"]
        return out, cg.check_guards()
    finally:
        cg.release()


def time_graph(device, graph, inputs, replays):
    """Median GPU µs and host submit+wait µs over `replays` replays after one warm-up."""
    cg = CompiledGraph(device, graph, timestamps=True)
    try:
        cg.run(inputs)
        gpu, wall = [], []
        for _ in range(replays):
            t0 = time.perf_counter_ns()
            cg.recording.submit()
            wall.append((time.perf_counter_ns() - t0) / 1e3)
            gpu.append(cg.recording.total_gpu_ns() / 1e3)
        return {"gpu_us": statistics.median(gpu), "gpu_us_min": min(gpu), "wall_us": statistics.median(wall),
                "dispatches": cg.recording.n_dispatches, "replays": replays}
    finally:
        cg.release()


def check_comb(device, variant, Ts, rng, with_chain_upto=2048):
    rows = []
    for T in Ts:
        inputs = comb_inputs(rng, T)
        shapes = {k: v.shape for k, v in inputs.items()}
        out, bad_guards = run_once(device, graph_for("HC_COMB", shapes, True, variant, device), inputs)
        if T > 100_000:     # tokens are independent: the reference on a sample, both ends included
            idx = np.unique(np.concatenate([np.arange(256), np.arange(T - 256, T), rng.integers(0, T, 20000)]))
        else:
            idx = np.arange(T)
        ref = reference_comb(inputs["mixes"][idx], inputs["scale"], inputs["base"])
        row = {"variant": variant, "T": T, "nmse_ref": nmse(out[idx], ref), "max_abs_ref": max_abs(out[idx], ref),
               "nonfinite": int(nonfinite_mismatch(out[idx], ref)) + int((~np.isfinite(out)).sum()),
               "guards": bad_guards}
        if T <= with_chain_upto:
            chain, _ = run_once(device, graph_for("HC_COMB", shapes, False, device=device), inputs)
            row["nmse_chain"] = nmse(out, chain)
        row["ok"] = (row["nmse_ref"] <= REF_NMSE and row["nonfinite"] == 0 and not bad_guards
                     and row.get("nmse_chain", 0.0) <= PATH_NMSE)
        rows.append(row)
    return rows


def plain_inputs(op, rng, T, D):
    if op == "HC_PRE":
        return {"x": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
                "weights": rng.uniform(0, 1, (T, 4)).astype(np.float32)}
    return {"f": rng.uniform(-1, 1, (T, D)).astype(np.float32),
            "residual": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
            "post": rng.uniform(0, 2, (T, 4)).astype(np.float32),
            "comb": rng.uniform(0, 1, (T, 4, 4)).astype(np.float32)}


def mix_graph(T, D, route):
    """The site's mixes [T,24] through HC_MIX or RMS_NORM → MUL_MAT."""
    g = Graph()
    X, fn = g.input("X", (T, 4, D)), g.input("fn", (24, 4 * D))
    if route == "HC_MIX":
        out = g.op("HC_MIX", X, fn, norm_eps=1e-6)
    else:
        out = g.op("MUL_MAT", g.op("RMS_NORM", X.reshape(T, 4 * D), eps=1e-6), fn)
    g.output("out", out)
    return g


def check_plain(device, op, T, D, rng):
    inputs = plain_inputs(op, rng, T, D)
    shapes = {k: v.shape for k, v in inputs.items()}
    out, bad = run_once(device, graph_for(op, shapes, True, device=device), inputs)
    a = {k: v.astype(np.float64) for k, v in inputs.items()}
    if op == "HC_PRE":
        ref = reference_pre(a["x"], a["weights"])
        magnitude = reference_pre(np.abs(a["x"]), np.abs(a["weights"]))      # Σ|terms|: cancellation-proof
    else:
        ref = reference_post(**a)
        magnitude = reference_post(*(np.abs(v) for v in a.values()))
    within = bool((np.abs(out - ref) <= 2 ** -20 * magnitude + 1e-30).all())    # 16 ulps of Σ|terms|
    return {"op": op, "T": T, "D": D, "nmse_ref": nmse(out, ref), "guards": bad, "within_f32_bound": within,
            "ok": within and not bad}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--replays", type=int, default=20, help="timed replays per measurement (≥ 10)")
    ap.add_argument("--ts", default="1,2048", help="token counts to time (comma-separated)")
    ap.add_argument("--ds", default="4096,7168", help="hidden sizes for HC_PRE / HC_POST timing")
    ap.add_argument("--mix-ts", default="1,8,64,512,2048", help="token counts for the mixes comparison")
    args = ap.parse_args(argv)
    if args.replays < 10:
        ap.error("--replays must be ≥ 10")
    ts = [int(v) for v in args.ts.split(",")]
    ds = [int(v) for v in args.ds.split(",")]
    dev = default_device()
    rng = np.random.default_rng()
    sg = dev.subgroup_size
    support = hc_policy.comb_support(dev)
    report = {"device": dev.name, "driver": f"{dev.caps.driver_name} {dev.caps.driver_info}",
              "subgroup": dev.caps.subgroup, "policy": hc_policy.describe(dev),
              "variants": {v: ("ok" if why is None else why) for v, why in support.items()},
              "checks": [], "timings": []}
    print(f"{dev.name} — subgroup size {sg}; default HC_COMB path {report['policy']['HC_COMB']['path']}")
    for v, why in support.items():
        print(f"  {v:6s} {'runs here' if why is None else 'cannot run: ' + why}")

    runnable = [v for v in hc_policy.COMB_VARIANTS if support[v] is None]
    for v in runnable:
        per_group = (hc_policy.sg16_subgroup_size(dev) // 4) if v == "sg16" else ROWS4_WORKGROUP // 4
        check_ts = sorted({1, 15, 16, 17, sg - 1, sg, sg + 1, 255, 256, 257, 513, 2048, 65535 * per_group + 3} - {0})
        report["checks"] += check_comb(dev, v, check_ts, rng)
    for op in ("HC_PRE", "HC_POST"):
        for T, D in ((1, 1), (17, 31), (257, 128), (21, 4096), (3, 7168), (65537, 4)):
            report["checks"].append(check_plain(dev, op, T, D, rng))

    for T in ts:
        inputs = comb_inputs(rng, T)
        shapes = {k: v.shape for k, v in inputs.items()}
        for path, fused, variant in [*((f"fused:{v}", True, v) for v in runnable), ("unfused", False, None)]:
            t = time_graph(dev, graph_for("HC_COMB", shapes, fused, variant, dev), inputs, args.replays)
            report["timings"].append({"op": "HC_COMB", "path": path, "T": T, "D": 0, **t})
        for D in ds:
            for op in ("HC_PRE", "HC_POST"):
                inputs = plain_inputs(op, rng, T, D)
                shapes = {k: v.shape for k, v in inputs.items()}
                for path, fused in (("fused", True), ("unfused", False)):
                    t = time_graph(dev, graph_for(op, shapes, fused, device=dev), inputs, args.replays)
                    nbytes = 4 * sum(a.size for a in inputs.values()) + 4 * T * D * (1 if op == "HC_PRE" else 4)
                    t["gb_s"] = nbytes / (t["gpu_us"] * 1e3)
                    report["timings"].append({"op": op, "path": path, "T": T, "D": D, **t})

    for T in (int(v) for v in args.mix_ts.split(",")):
        for D in ds:
            inputs = {"X": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
                      "fn": (rng.uniform(-1, 1, (24, 4 * D)) / np.sqrt(D)).astype(np.float32)}
            ref = reference_mixes(inputs["X"], inputs["fn"])
            for route in ("HC_MIX", "RMS_NORM+MUL_MAT"):
                out, bad = run_once(dev, mix_graph(T, D, route), inputs)
                t = time_graph(dev, mix_graph(T, D, route), inputs, args.replays)
                report["timings"].append({"op": "mixes", "path": route, "T": T, "D": D, **t})
                report["checks"].append({"op": f"mixes {route}", "T": T, "D": D, "nmse_ref": nmse(out, ref),
                                         "guards": bad, "ok": nmse(out, ref) <= 1e-10 and not bad})

    print(f"\n{'op':8s} {'path':16s} {'T':>6s} {'D':>5s} {'GPU µs (median)':>16s} {'min':>9s} "
          f"{'wall µs':>9s} {'disp':>5s} {'GB/s':>8s}")
    for r in report["timings"]:
        gb = f"{r['gb_s']:8.1f}" if "gb_s" in r else f"{'':8s}"
        print(f"{r['op']:8s} {r['path']:16s} {r['T']:6d} {r['D']:5d} {r['gpu_us']:16.2f} {r['gpu_us_min']:9.2f} "
              f"{r['wall_us']:9.1f} {r['dispatches']:5d} {gb}")
    print(f"\n{'check':40s} {'NMSE vs f64':>12s} {'vs chain':>10s}  ok")
    for r in report["checks"]:
        name = f"HC_COMB {r['variant']} T={r['T']}" if "variant" in r else f"{r['op']} T={r['T']} D={r['D']}"
        chain = f"{r['nmse_chain']:.2e}" if "nmse_chain" in r else "-"
        print(f"{name:40s} {r['nmse_ref']:12.2e} {chain:>10s}  {'yes' if r['ok'] else 'NO'}")

    ok = all(r["ok"] for r in report["checks"])
    report["all_ok"] = ok
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'}; JSON written to {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
