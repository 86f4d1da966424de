"""Decode speed of DeepSeek-V4 with fused and with unfused hyper-connection ops, and the Python
host time of a decode step at two layer counts. JSON to --out.

    . .vkdev/enter.sh; python3 tools/model_gpu_bench.py --out $OUT/model_bench_v4.json   (H200, about 16 GB)
    python tools/model_gpu_bench.py --quick --out /tmp/model_bench.json                 (a dry run anywhere)

The package needs `safetensors` and `ml_dtypes` (BF16 in numpy) besides numpy: a GPU machine
without a package index needs their wheels carried (e.g. in .vkdev/whl).

Default model: the "flash-1gpu" preset (dsv4_vk/model/config.py): DeepSeek-V4-Flash's widths (D 4096,
64 query heads × 512 on one shared K=V head, q rank 1024, 8 output groups × 1024, CSA rate 4 with a
64 × 128 indexer keeping 512, HCA rate 128, window 128, experts of width 2048 top-6 + 1 shared,
vocab 129280) with 4 layers (sliding, CSA, HCA, CSA) and 64 routed experts instead of 43 and 256,
so that its BF16 weights (about 16 GB) fit one GPU; random weights (seed 0), BF16 linears
(--dtype). The decode cache holds --max-ctx tokens (default 1024); the prompt (--prompt, default
512) closes 128 CSA windows and 4 HCA windows before the timed steps.
Per path: decode tokens/s and ms/token (wall: write position, submit + wait, read token),
dispatches and barriers per token, GPU ms per token and per op from a profiled rerun (a timestamp
after every dispatch), and whether both paths produce the same greedy tokens. Host: the Python
time of a decode step outside submit + wait, for `--host-layers` (default 2 and 8) of the "demo"
preset at D = `--host-dim` (default 1024): it must not grow with layers (target ≤ 100 µs). Before
each timed series the GPU is kept busy for `--warm-ms` (floor.ClockWarmer; default 500 on GPUs):
an idle GPU runs at a low shader clock (H200: 345 against 1980 MHz, docs/hc_ops.md), and the
weights upload leaves it idle.
Multi-step decode (fused path): tokens/s with K = `--steps-per-submit` (default 1,4,16) decode
steps recorded in one command buffer (Model.steps; K is at most the prefill chunk). The
weight-bandwidth floor: the bytes of weights a decode step must read (every weight on the device
but the unpicked routed experts and all but one embedding row) at the measured copy bandwidth,
against the measured time per token; and RMS_NORM's share of the profiled decode GPU time.
--variants: more fused decode series in the same run, each with kernel knobs set, for side-by-side
ratios; ";" between variants, "," between knobs of one: fold_mb (norms folded only into mat-muls
reading at most this many MiB of weights a token, model.build.NORM_FOLD), gemv_unroll,
gemv_spread (0: subgroup-lane clusters only) (ops.mul_mat.GEMV_UNROLL), gemv_rows (output rows a
GEMV cluster over quantised weights, ops.mul_mat.GEMV_QUANT_ROWS), moe_unroll, moe_routes,
moe_wg, moe_rows (the sum's output rows a cluster over quantised experts; ops.moe.MUL_MAT_ID_UNROLL),
indexer (1: CSA layers run their indexer even where its
top-k keeps every entry the cache can hold, as at this preset's 1024-token cache;
model.build.INDEXER), mqa_literal (1: MQA_ATTENTION's per-lane arrays with literal sizes,
ops.v4_attention.MQA_ARRAYS), mix_wg (the first site's HC_MIX workgroup size: smaller ones split
D into more workgroups; hc.mix_kernels.MIX_TUNING), compress_wg (COMPRESS's workgroup cap,
ops.compress.COMPRESS_WG), mqa_tile (keys the tiled MQA_ATTENTION stages at a time; the decode
splits follow: ops.v4_attention.MQA_TILE), route_rank (0: V4_ROUTE's rounds of a butterfly instead of
its one-pass ranking, ops.moe.ROUTE_RANK); e.g.
`--variants "fold_mb=64;fold_mb=0;gemv_unroll=8"`.
--dtype fp8: DeepSeek's published layout (docs/quantized_weights.md: FP8 linears with 128 × 128
block scales, FP4 routed experts, the rest BF16), kept quantised on the device. --compare-dtype
bf16: the fused decode of the same shape with BF16 weights in the same run (tokens/s side by side).
--load: the checkpoint written to a directory (--load-dir, default a temporary one) and read back
by Model.load in a child process: seconds, GB/s of the checkpoint's bytes, the child's peak RSS.
V4-Flash's depth in the published format on one GPU: `--layers 43 --experts 8 --dtype fp8`
(each token reads 6 routed experts + the shared one whatever the expert count, so the bytes read
per token are those of the 256-expert model).
--timeline: every dispatch of the fused decode step with its mean profiled GPU time (the time
since the previous dispatch's end), shader, variant and argument shapes; --skip leaves out parts
of the run (unfused, multi, host) when only one question is asked.
"""
import argparse
import json
import os
import re
import sys
import time

import numpy as np


from dsv4_vk.cli import floor
from dsv4_vk.core import profile
from dsv4_vk.hc import mix_kernels
from dsv4_vk.model import Model, build, random_weights
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.ops import compress, moe, mul_mat, v4_attention
from dsv4_vk.model.config import preset
from dsv4_vk.vk import default_device

HOST_TARGET_US = 100.0
DTYPES = {"f32": np.float32, "bf16": BF16, "f16": np.float16, "fp8": "fp8"}
KNOBS = {"fold_mb": (build.NORM_FOLD, "max_bytes", lambda v: int(float(v) * 2**20)),
         "gemv_unroll": (mul_mat.GEMV_UNROLL, "unroll", int),
         "gemv_spread": (mul_mat.GEMV_UNROLL, "spread", int),
         "gemv_rows": (mul_mat.GEMV_QUANT_ROWS, "rows", int),
         "moe_unroll": (moe.MUL_MAT_ID_UNROLL, "unroll", int),
         "moe_routes": (moe.MUL_MAT_ID_UNROLL, "routes", int),
         "moe_wg": (moe.MUL_MAT_ID_UNROLL, "wg", int),
         "moe_rows": (moe.MUL_MAT_ID_UNROLL, "rows", int),
         "indexer": (build.INDEXER, "always", lambda v: bool(int(v))),
         "mqa_literal": (v4_attention.MQA_ARRAYS, "literal", lambda v: bool(int(v))),
         "mix_wg": (mix_kernels.MIX_TUNING, "wg", int),
         "compress_wg": (compress.COMPRESS_WG, "wg", int),
         "mqa_tile": (v4_attention.MQA_TILE, "keys", int),
         "route_rank": (moe.ROUTE_RANK, "on", lambda v: bool(int(v)))}


def parse_variants(text):
    """[(label, [(table, key, value)])] from "k=v,k=v;k=v" (--variants)."""
    out = []
    for label in filter(None, (v.strip() for v in text.split(";"))):
        sets = []
        for item in label.split(","):
            k, _, v = item.partition("=")
            if k.strip() not in KNOBS:
                raise ValueError(f"--variants: unknown knob {k.strip()!r}; expected one of {sorted(KNOBS)}")
            table, key, conv = KNOBS[k.strip()]
            try:
                sets.append((table, key, conv(v)))
            except ValueError:
                raise ValueError(f"--variants: {item!r} needs a number after '='") from None
        out.append((label, sets))
    return out


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="flash-1gpu")
    ap.add_argument("--layers", type=int, help="override the preset's layer count (layer types repeat)")
    ap.add_argument("--experts", type=int, help="override the preset's routed experts")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="linear weights (default bf16; fp8: "
                    "the published FP8/FP4 layout)")
    ap.add_argument("--compare-dtype", choices=sorted(DTYPES), help="also the fused decode with these weights")
    ap.add_argument("--load", action="store_true", help="time Model.load of the checkpoint written to --load-dir")
    ap.add_argument("--load-dir", help="where --load writes the checkpoint (default: a temporary directory)")
    ap.add_argument("--max-ctx", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps timed per path")
    ap.add_argument("--host-layers", default="2,8")
    ap.add_argument("--host-dim", type=int, default=1024)
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each timed series "
                    "(default 500 on GPUs, 0 on CPU devices)")
    ap.add_argument("--steps-per-submit", default="1,4,16", help="K values of the multi-step decode series")
    ap.add_argument("--quick", action="store_true", help="the demo preset at tiny sizes (a dry run on lavapipe)")
    ap.add_argument("--variants", default="", help="extra fused decode series with kernel knobs (see above)")
    ap.add_argument("--timeline", action="store_true", help="also list every dispatch of the fused decode step "
                    "with its mean profiled GPU µs (JSON 'timeline', and printed)")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: unfused, multi, host "
                    "(quicker runs for one question)")
    a = ap.parse_args(argv)
    try:
        a.variants = parse_variants(a.variants)
    except ValueError as e:
        ap.error(str(e))
    if a.quick:
        a.preset, a.max_ctx, a.prompt, a.tokens, a.host_dim = "demo", 64, 20, 8, 64
    a.host_layers = [int(v) for v in a.host_layers.split(",")]
    a.steps_per_submit = [int(v) for v in a.steps_per_submit.split(",")]
    return a


def config(name, max_ctx, layers=None, experts=None, **over):
    base = preset(name)
    kw = dict(over, max_ctx=max_ctx)
    if layers is not None:
        kw["num_hidden_layers"] = layers
        kw["layer_types"] = tuple(base.layer_types[i % len(base.layer_types)] for i in range(layers))
        kw["mlp_layer_types"] = tuple(base.mlp_layer_types[i % len(base.mlp_layer_types)] for i in range(layers))
    if experts is not None:
        kw["n_routed_experts"] = experts
    return base.replace(**kw)


def weight_bytes_per_token(model):
    """Bytes of weights one decode step reads: every weight on the device (quantised ones with their
    scales) except the routed experts it does not pick (num_experts_per_tok of n_routed_experts;
    the shared expert always) and all but one row of the embedding."""
    cfg, total = model.cfg, 0
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    for name, p in model.ex.params.items():
        if name.startswith(("step.", "sampler.", "rope.")) or name.endswith((".kv", ".state", ".ent")):
            continue
        n = p.nbytes
        base = name[:-len(".scale")] if name.endswith(".scale") else name
        stack = re.sub(r"\.\d+$", "", base)                 # an expert stack split in parts: name.0, ...
        if name == "embed.weight":
            n //= model.params[name].shape[0]
        elif stack.endswith(("ffn.w13", "ffn.w2")):         # [E (+ 1), ...]: routed experts (then the shared one)
            stacked = sum(a.shape[0] for p, a in model.params.items() if re.sub(r"\.\d+$", "", p) == stack)
            n = n * (k + stacked - E) // stacked
        total += n
    return total


def load_speed(cfg, weights, directory):
    """Write the checkpoint, then Model.load it in a child process: seconds, GB/s, peak RSS."""
    import subprocess
    import tempfile
    from dsv4_vk.model.checkpoint import save_hf
    d = directory or tempfile.mkdtemp(prefix="dsv4_load_")
    t0 = time.perf_counter()
    save_hf(d, cfg, weights, naming="deepseek", shards=max(1, len(weights) // 400))
    write_s = time.perf_counter() - t0
    nbytes = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))
    child = ("import json, resource, sys, time\n"
             "from dsv4_vk.model import Model\n"
             "t = time.perf_counter(); m = Model.load(sys.argv[1], max_ctx=%d); s = time.perf_counter() - t\n"
             "print(json.dumps({'load_s': s, 'peak_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
             " * 1024, 'device_weights': m.memory()['weights']}))" % cfg.max_ctx)
    r = subprocess.run([sys.executable, "-c", child, d], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"the load child failed: {r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out.update(checkpoint_bytes=nbytes, write_s=write_s, load_gbps=nbytes / out["load_s"] / 1e9,
               device_over_checkpoint=sum(out["device_weights"].values()) / nbytes, directory=d)
    return out


def multi_step(cfg, weights, prompt, a, warm, ks):
    """{K: tokens/s} of the fused model decoding K steps per command buffer (Model.steps), K in ks."""
    model = Model(cfg, weights, fused=True)
    out = {}
    for k in ks:
        k = min(k, model.prefill_chunk)
        n = max(k, a.tokens // k * k)
        model.reset()
        model.prefill(prompt)
        model.steps(k)                                   # record this K's command buffer
        model.reset()
        model.prefill(prompt)
        if warm is not None:
            warm()
        t0 = time.perf_counter()
        done = 0
        while done < n:
            done += len(model.steps(min(k, n - done)))
        dt = time.perf_counter() - t0
        out[str(k)] = {"tokens_per_s": done / dt, "ms_per_token": 1e3 * dt / done, "tokens": done}
    return out, weight_bytes_per_token(model)


def timed_steps(model, prompt, n, warm=None):
    """Prefill, then n decode steps: (tokens, wall s per step, host s per step outside submit+wait).
    warm: called after the prefill, right before the timed steps (floor.ClockWarmer)."""
    model.reset()
    model.prefill(prompt)
    if warm is not None:
        warm()
    toks, wall, host = [model.next_token], [], []
    tm = model.timing
    for _ in range(n):
        s0, sub0 = tm["step_s"], tm["submit_s"]
        t0 = time.perf_counter()
        toks.append(model.step())
        wall.append(time.perf_counter() - t0)
        host.append((tm["step_s"] - s0) - (tm["submit_s"] - sub0))
    return toks, np.array(wall), np.array(host)


def decode_path(cfg, weights, prompt, a, fused, warm):
    model = Model(cfg, weights, fused=fused)
    mem = model.memory()
    timed_steps(model, prompt, 4)                          # record both graphs, warm the pipelines
    toks, wall, host = timed_steps(model, prompt, a.tokens, warm)
    rec = model.compiled("decode").recording
    with profile.profile() as prof:
        with profile.phase("decode"):
            timed_steps(model, prompt, min(a.tokens, 16))
    ph = prof.as_dict()["phases"]["decode"]
    runs = max(ph["runs"], 1)
    ops = sorted(ph["ops"].items(), key=lambda kv: -kv[1]["gpu_ms"])
    timeline = [{"position": i, "op": label, "dispatch": detail, "gpu_us": us}
                for i, label, detail, _, us in prof.phases["decode"].timeline()]
    return toks, {
        "timeline": timeline,
        "tokens_per_s": float(1.0 / np.median(wall)), "ms_per_token": float(1e3 * np.median(wall)),
        "dispatches_per_token": rec.n_dispatches, "barriers_per_token": rec.n_barriers,
        "host_us_per_step_median": float(1e6 * np.median(host)),
        "gpu_ms_per_token_profiled": ph["gpu_ms"] / runs,
        "gpu_ms_per_token_by_op": {k: v["gpu_ms"] / runs for k, v in ops},
        "dispatches_per_token_by_op": {k: v["dispatches"] / runs for k, v in ops},
        "hc_paths": sorted({f"{op}:{path}" for op, path, _ in model.paths()}),
        "device_memory_bytes": mem,
    }


def host_time(a, layers, fused, warm):
    cfg = config("demo", a.prompt + 2 * a.tokens + 16, layers, hidden_size=a.host_dim)
    model = Model(cfg, random_weights(cfg, 0), fused=fused)
    prompt = np.arange(a.prompt) % cfg.vocab_size
    timed_steps(model, prompt, 4)
    _, wall, host = timed_steps(model, prompt, a.tokens, warm)
    # the step's Python alone: the same steps with submit + wait replaced by nothing
    model.reset()
    model.prefill(prompt)
    rec = model.compiled("decode").recording
    rec.submit = lambda: None
    t0 = time.perf_counter()
    for _ in range(a.tokens):
        model.step()
    python_us = 1e6 * (time.perf_counter() - t0) / a.tokens
    del rec.submit
    return {"host_us_median": float(1e6 * np.median(host)), "host_us_p90": float(1e6 * np.percentile(host, 90)),
            "python_us_per_step_without_gpu": python_us, "step_ms_median": float(1e3 * np.median(wall)),
            "dispatches_per_token": rec.n_dispatches}


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    dev = default_device()
    cfg = config(a.preset, a.max_ctx, a.layers, a.experts)
    print(f"device {dev.name}, subgroup {dev.subgroup_size}; model {json.dumps(cfg.to_hf(), sort_keys=True)}",
          flush=True)
    t0 = time.perf_counter()
    weights = random_weights(cfg, 0, DTYPES[a.dtype])
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, a.prompt)
    print(f"random weights: {sum(int(np.prod(w.shape)) for w in weights.values()) / 1e6:.0f} M parameters in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    warm_ms = floor.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms
    warm = floor.ClockWarmer(dev, warm_ms)
    res = {"device": dev.name, "subgroup_size": dev.subgroup_size, "config": cfg.to_hf(), "max_ctx": cfg.max_ctx,
           "dtype": a.dtype, "prompt": a.prompt, "warm_ms": warm_ms,
           "note": "DeepSeek-V4-Flash widths; fewer layers and routed experts so the weights fit one GPU",
           "decode_steps_timed": a.tokens, "decode": {}, "host": {}, "host_target_us": HOST_TARGET_US}
    tokens = {}
    for name, fused in (("fused", True), ("unfused", False))[:1 if "unfused" in a.skip else 2]:
        tokens[name], res["decode"][name] = decode_path(cfg, weights, prompt, a, fused, warm)
        r = res["decode"][name]
        timeline = r.pop("timeline")
        if a.timeline and fused:
            r["timeline"] = timeline
            for d in timeline:
                print(f"  {d['position']:4d} {d['gpu_us']:8.1f} µs  {d['op']:18s} {d['dispatch']}")
            print(f"  total {sum(d['gpu_us'] for d in timeline):.1f} µs", flush=True)
        print(f"{name:8s} {r['tokens_per_s']:9.1f} tokens/s  {r['ms_per_token']:8.3f} ms/token  "
              f"{r['dispatches_per_token']:6d} dispatches/token  host {r['host_us_per_step_median']:.1f} µs/step",
              flush=True)
    if a.compare_dtype:
        other = random_weights(cfg, 0, DTYPES[a.compare_dtype])
        toks, r = decode_path(cfg, other, prompt, a, True, warm)
        del other
        r.pop("timeline")
        r["speed_over_fused"] = r["tokens_per_s"] / res["decode"]["fused"]["tokens_per_s"]
        res["decode_compare_dtype"] = dict(r, dtype=a.compare_dtype)
        print(f"fused {a.compare_dtype}: {r['tokens_per_s']:9.1f} tokens/s ({a.dtype} is "
              f"{1 / r['speed_over_fused']:.2f}x of it)  {r['dispatches_per_token']} dispatches/token", flush=True)
    if a.load:
        res["load"] = load_speed(cfg, weights, a.load_dir)
        ld = res["load"]
        print(f"load: {ld['checkpoint_bytes'] / 1e9:.2f} GB in {ld['load_s']:.1f} s = {ld['load_gbps']:.2f} GB/s, "
              f"peak RSS {ld['peak_rss_bytes'] / 1e9:.2f} GB; device weights {ld['device_over_checkpoint']:.3f}x the "
              "checkpoint", flush=True)
    res["decode_variants"] = {}
    for label, sets in a.variants:
        old = [(table, key, table[key]) for table, key, _ in sets]
        for table, key, value in sets:
            table[key] = value
        try:
            toks, r = decode_path(cfg, weights, prompt, a, True, warm)
            r.pop("timeline")
        finally:
            for table, key, value in old:
                table[key] = value
        r["same_tokens_as_fused"] = toks == tokens["fused"]
        r["speed_over_fused"] = r["tokens_per_s"] / res["decode"]["fused"]["tokens_per_s"]
        res["decode_variants"][label] = r
        by_op = r["gpu_ms_per_token_by_op"]
        print(f"fused {label}: {r['tokens_per_s']:9.1f} tokens/s ({r['speed_over_fused']:.3f}x)  "
              f"{r['dispatches_per_token']} dispatches/token  GPU ms MUL_MAT {by_op.get('MUL_MAT', 0):.3f} "
              f"MUL_MAT_ID {by_op.get('MUL_MAT_ID', 0):.3f} RMS_NORM {by_op.get('RMS_NORM', 0):.3f}; same tokens: "
              f"{r['same_tokens_as_fused']}", flush=True)
    fused = res["decode"]["fused"]
    fused["rms_norm_pct_of_gpu"] = 100 * fused["gpu_ms_per_token_by_op"].get("RMS_NORM", 0.0) / fused["gpu_ms_per_token_profiled"]
    res["multi_step"], wb = multi_step(cfg, weights, prompt, a, warm, [] if "multi" in a.skip else a.steps_per_submit)
    copy = floor.copy_gbps(dev, warm=warm)
    floor_ms = wb / (copy * 1e6)
    best = max(res["multi_step"].values() or [fused], key=lambda r: r["tokens_per_s"])
    res["weight_floor"] = {"weight_bytes_per_token": wb, "copy_gbps": copy, "floor_ms_per_token": floor_ms,
                           "pct_of_floor_one_step": 100 * floor_ms / fused["ms_per_token"],
                           "pct_of_floor_best_multi_step": 100 * floor_ms / best["ms_per_token"]}
    print(f"RMS_NORM {fused['rms_norm_pct_of_gpu']:.1f}% of decode GPU time (profiled); multi-step: "
          + ", ".join(f"K={k} {r['tokens_per_s']:.1f} tokens/s" for k, r in res["multi_step"].items()))
    print(f"weight floor: {wb / 1e6:.0f} MB/token at {copy:.0f} GB/s = {floor_ms:.3f} ms/token: one step "
          f"{res['weight_floor']['pct_of_floor_one_step']:.1f}% of it, best multi-step "
          f"{res['weight_floor']['pct_of_floor_best_multi_step']:.1f}%", flush=True)
    if "unfused" in res["decode"]:
        res["same_greedy_tokens"] = tokens["fused"] == tokens["unfused"]
        res["decode_speedup_fused_over_unfused"] = (res["decode"]["fused"]["tokens_per_s"]
                                                    / res["decode"]["unfused"]["tokens_per_s"])
        print(f"same greedy tokens: {res['same_greedy_tokens']}; fused/unfused decode speed-up "
              f"{res['decode_speedup_fused_over_unfused']:.2f}x")
    del weights
    for layers in [] if "host" in a.skip else a.host_layers:
        res["host"][str(layers)] = {name: host_time(a, layers, fused, warm) for name, fused in (("fused", True), ("unfused", False))}
        for name, r in res["host"][str(layers)].items():
            print(f"host, {layers} layers, D {a.host_dim}, {name:8s}: {r['host_us_median']:6.1f} µs median "
                  f"({r['host_us_p90']:.1f} p90) outside submit+wait, {r['python_us_per_step_without_gpu']:.1f} µs "
                  f"with no GPU work, {r['dispatches_per_token']} dispatches", flush=True)
    warm.close()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
