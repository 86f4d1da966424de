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
reading at most this many MiB of weights a token, knob norm_fold.max_bytes), gemv_unroll,
gemv_spread (0: subgroup-lane clusters only) (knobs gemv.unroll, gemv.spread), gemv_rows (output rows a
GEMV cluster over quantised weights, knob gemv_quant.rows), gemv_load (bytes of codes a lane loads a
step, 4 or 16; knob gemv_quant.load), moe_unroll, moe_routes, moe_wg, moe_rows (the sum's output rows
a cluster over quantised experts), moe_load (4 or 16; knobs mul_mat_id.*), gemv_xs / moe_xs (1: the
staged kernels over quantised weights, x in shared memory; knobs gemv_quant.x_shared,
mul_mat_id.x_shared), gemv_xs_rows / moe_xs_rows (their output rows a cluster) and gemv_xs_wg (the
staged GEMV's workgroup size), moe_coopmat (1: the prefill's grouped expert GEMM on the matrix units,
0: on the f32 lanes, the default; knob mul_mat_id_coopmat.auto),
indexer (1: CSA layers run their indexer even where its
top-k keeps every entry the cache can hold, as at this preset's 1024-token cache;
knob indexer.always), gate (0: the router at decode as MUL_MAT then V4_ROUTE, two dispatches
a layer, instead of V4_GATE's one; knob v4_gate.on), gate_rows / gate_unroll / gate_wg
(V4_GATE's gate rows a workgroup, vec4 steps loaded together, workgroup size; knobs v4_gate.*),
mqa_literal (1: MQA_ATTENTION's per-lane arrays with literal sizes,
knob mqa_arrays.literal), mix_wg (the first site's HC_MIX workgroup size: smaller ones split
D into more workgroups; knob mix.wg), compress_wg (COMPRESS's workgroup cap,
knob compress.wg), mqa_tile (keys the tiled MQA_ATTENTION stages at a time; the decode
splits follow: knob mqa_tile.keys), mqa_prefill (0: prefill chunks' attention on the cluster kernel,
not the prefill kernel; knob mqa_prefill.on), mqa_prefill_heads / mqa_prefill_tile / mqa_prefill_keys (the
prefill kernel's heads a cluster, keys a tile and keys a step; knobs mqa_prefill.heads, .tile, .keys),
mqa_coopmat (1: prefill chunks' attention on the matrix units where the device has them; knob
mqa_prefill.coopmat=None), route_rank (0: V4_ROUTE's rounds of a butterfly instead of
its one-pass ranking, knob route_rank.on), mqa_merge (1: the decode attention's split key lists
merged inside MQA_ATTENTION, not by the MQA_COMBINE dispatch after it that the default runs; knob mqa_merge.on),
mqa_merge_step (the parts whose loads the merging workgroup issues together; knob mqa_merge.step),
gemv_xs_unroll / gemv_xs_groups and moe_xs_unroll / moe_xs_groups (the staged kernels' uvec4 steps a
lane loads together and workgroups at most), moe_xs_split (the staged sum's routes split among a workgroup's
clusters), moe_xs_heavy (1: the staged SwiGLU takes the last route's blocks first), moe_xs_route_groups (the
staged sum's route groups, a workgroup each per output block) and moe_xs_lanes (the staged kernels' lanes a
cluster) (knobs mul_mat_id.x_shared_split, _heavy_first, _route_groups, _lanes); any knob also by its full dotted name (value None, True,
False, a number or a word), e.g.
`--variants "fold_mb=64;fold_mb=0;gemv_unroll=8;gemv_quant.x_shared_unroll=4,mul_mat_id.x_shared_unroll=2"`.
--long: the long-context sweep instead (--out is then a directory: long_context.json and .txt):
prefill tokens/s (chunks of --chunk tokens) and decode tokens/s at each of --positions (default
1k, 4k, 32k, 128k, 1M), for each cache of --caches: "shared" (one cache for every position, of
--shared-ctx positions, default the largest position's), "sized" (a cache just large enough for
each position) or a number of positions; plus a profiled decode step and prefill chunk at each
(GPU ms per op and the slowest dispatches). The caches are filled with random rows and the model
is put at the position directly (the kernels' work does not depend on how the rows got there), so
1M positions take seconds, not a 1M-token prefill; a cache the device cannot hold is skipped with
check_memory's reason; the files are rewritten after every measurement and positions not started
within --budget-s seconds are skipped (a run cut short keeps what it measured). Random weights: the linear maps past 4M elements are one random block
converted to the dtype once and repeated (bench_weights), so 16 GB build in seconds.
    . .vkdev/enter.sh; python3 tools/model_gpu_bench.py --long --out $OUT/long_context          (H200)
    python tools/model_gpu_bench.py --long --preset demo --positions 300 --caches 512,16384 --chunk 16 \
        --out results/lavapipe/long_context                                              (lavapipe)
--dtype fp8: DeepSeek's published layout (docs/quantized_weights.md: FP8 linears with 128 × 128
block scales, FP4 routed experts, the rest BF16), kept quantised on the device. --compare-dtype
bf16: the fused decode of the same shape with BF16 weights in the same run (tokens/s side by side).
--load: the checkpoint written to a directory (--load-dir, default a temporary one) and read back
by Model.load in a child process: seconds, GB/s of the checkpoint's bytes, the child's peak RSS
(its VmHWM; and its RSS before the load, its anonymous, file-mapped and shared resident bytes after).
--load-workers 2,4,8: the load again with each count of read threads (vk.upload.WORKERS); --load-only:
no decode series, e.g. `--preset flash-43 --dtype fp8 --load-only --load-workers 2,4,8 --out load.json`.
V4-Flash's depth in the published format on one GPU: `--layers 43 --experts 8 --dtype fp8`
(each token reads 6 routed experts + the shared one whatever the expert count, so the bytes read
per token are those of the 256-expert model).
--offload-layers 0,2,8: more fused decode series, each with the routed experts of that many layers in
host memory the GPU reads over its bus (Model(expert_offload=N)): tokens/s beside the default's,
the host bytes and the bytes a token reads over the bus (their picked experts), same tokens or not.
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
from dsv4_vk.core.tuning import Tuning, tuned
from dsv4_vk.model import Model, checkpoint, random_weights
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.model.config import preset
from dsv4_vk.ops import mul_mat
from dsv4_vk.vk import default_device

HOST_TARGET_US = 100.0
DTYPES = {"f32": np.float32, "bf16": BF16, "f16": np.float16, "fp8": "fp8"}
KNOBS = {"fold_mb": ("norm_fold.max_bytes", lambda v: int(float(v) * 2**20)),     # short name: (knob, parse)
         "gemv_unroll": ("gemv.unroll", int),
         "gemv_spread": ("gemv.spread", int),
         "gemv_rows": ("gemv_quant.rows", int),
         "gemv_load": ("gemv_quant.load", int),
         "moe_unroll": ("mul_mat_id.unroll", int),
         "moe_routes": ("mul_mat_id.routes", int),
         "moe_wg": ("mul_mat_id.wg", int),
         "moe_rows": ("mul_mat_id.rows", int),
         "moe_load": ("mul_mat_id.load", int),
         "gemv_xs": ("gemv_quant.x_shared", lambda v: bool(int(v))),
         "gemv_xs_rows": ("gemv_quant.x_shared_rows", int),
         "gemv_xs_wg": ("gemv_quant.x_shared_wg", int),
         "gemv_xs_unroll": ("gemv_quant.x_shared_unroll", int),
         "gemv_xs_groups": ("gemv_quant.x_shared_groups", int),
         "gemv_xs_lanes": ("gemv_quant.x_shared_lanes", int),
         "gemv_xs_one_scale": ("gemv_quant.x_shared_one_scale", lambda v: bool(int(v))),
         "moe_xs_unroll": ("mul_mat_id.x_shared_unroll", int),
         "moe_xs_groups": ("mul_mat_id.x_shared_groups", int),
         "moe_xs": ("mul_mat_id.x_shared", lambda v: bool(int(v))),
         "moe_xs_rows": ("mul_mat_id.x_shared_rows", int),
         "moe_xs_split": ("mul_mat_id.x_shared_split", int),
         "moe_xs_heavy": ("mul_mat_id.x_shared_heavy_first", lambda v: bool(int(v))),
         "moe_xs_route_groups": ("mul_mat_id.x_shared_route_groups", int),
         "moe_xs_lanes": ("mul_mat_id.x_shared_lanes", int),
         "moe_xs_sum_rows": ("mul_mat_id.x_shared_sum_rows", int),
         "indexer": ("indexer.always", lambda v: bool(int(v))),
         "mqa_splits": ("mqa_tile.max_splits", int),
         "gate": ("v4_gate.on", lambda v: bool(int(v))),
         "gate_rows": ("v4_gate.rows", int),
         "gate_unroll": ("v4_gate.unroll", int),
         "gate_wg": ("v4_gate.wg", int),
         "chunk": ("prefill_chunk.gpu", int),
         "coopmat": ("coopmat.auto", lambda v: bool(int(v))),
         "cm_tile": ("coopmat.tokens", int),
         "cm_out": ("coopmat.outputs", int),
         "cm_wt": ("coopmat.warp_tokens", int),
         "cm_wo": ("coopmat.warp_outputs", int),
         "cm_k": ("coopmat.k_step", int),
         "cm_pass": ("coopmat.scales", lambda v: "pass" if int(v) else "tile"),
         "cm_group": ("coopmat.group", int),
         "x_half": ("coopmat.x_half", lambda v: bool(int(v))),
         "moe_coopmat": ("mul_mat_id_coopmat.auto", lambda v: bool(int(v))),
         "moe_x_half": ("mul_mat_id_coopmat.x_half", lambda v: bool(int(v))),
         "mqa_literal": ("mqa_arrays.literal", lambda v: bool(int(v))),
         "mix_wg": ("mix.wg", int),
         "compress_wg": ("compress.wg", int),
         "mqa_tile": ("mqa_tile.keys", int),
         "mqa_prefill": ("mqa_prefill.on", lambda v: None if int(v) else False),
         "mqa_prefill_heads": ("mqa_prefill.heads", int),
         "mqa_prefill_tile": ("mqa_prefill.tile", int),
         "moe_grouped": ("mul_mat_id_grouped.on", lambda v: bool(int(v))),
         "mqa_prefill_keys": ("mqa_prefill.keys", int),
         "mqa_coopmat": ("mqa_prefill.coopmat", lambda v: None if int(v) else False),
         "route_rank": ("route_rank.on", lambda v: bool(int(v))),
         "mqa_merge": ("mqa_merge.on", lambda v: bool(int(v))),
         "mqa_merge_step": ("mqa_merge.step", int)}


def knob_value(text: str):
    """A full knob name's value: None, True / False, an integer, a float, else the text itself."""
    t = text.strip()
    if t in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[t]
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def parse_variants(text):
    """[(label, {knob: value})] from "k=v,k=v;k=v" (--variants): k a short name of KNOBS or a full
    knob name (dotted, e.g. gemv_quant.x_shared_unroll=4; its value None, True, False, a number or a
    word), checked against the declared knobs when the variant runs."""
    out = []
    for label in filter(None, (v.strip() for v in text.split(";"))):
        sets = {}
        for item in label.split(","):
            k, _, v = item.partition("=")
            k = k.strip()
            if "." in k:
                try:
                    with tuned({k: knob_value(v)}):     # an unknown name refused before any device time
                        pass
                except KeyError as e:
                    raise ValueError(f"--variants: {e.args[0]}") from None
                sets[k] = knob_value(v)
                continue
            if k not in KNOBS:
                raise ValueError(f"--variants: unknown knob {k!r}; expected one of {sorted(KNOBS)} or a full "
                                 "knob name (dotted)")
            name, conv = KNOBS[k]
            try:
                sets[name] = conv(v)
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
    ap.add_argument("--load-workers", default="", help="--load: also load once per these counts of read threads "
                    "(comma-separated; the default load uses vk.upload.default_workers())")
    ap.add_argument("--load-only", action="store_true", help="only --load (no decode series)")
    ap.add_argument("--max-ctx", type=int, default=1024)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps timed per path")
    ap.add_argument("--host-layers", default="2,8")
    ap.add_argument("--host-dim", type=int, default=1024)
    ap.add_argument("--warm-ms", type=float, help="GPU clock warm-up before each timed series "
                    "(default 500 on GPUs, 0 on CPU devices)")
    ap.add_argument("--steps-per-submit", default="1,4,16", help="K values of the multi-step decode series")
    ap.add_argument("--quick", action="store_true", help="the demo preset at tiny sizes (a dry run on lavapipe)")
    ap.add_argument("--prefill-variants", default="", help="only the prompt's prefill tokens/s, by default and "
                    "under each of these ;-separated knob sets (the --variants names, e.g. chunk=512,coopmat=1)")
    ap.add_argument("--variants", default="", help="extra fused decode series with kernel knobs (see above)")
    ap.add_argument("--offload-layers", default="", help="extra fused decode series with the routed experts of "
                    "this many layers in host memory each (Model(expert_offload=N)), e.g. 0,2,8")
    ap.add_argument("--timeline", action="store_true", help="also list every dispatch of the fused decode step "
                    "with its mean profiled GPU µs (JSON 'timeline', and printed)")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: unfused, multi, host "
                    "(quicker runs for one question)")
    ap.add_argument("--long", action="store_true", help="the long-context sweep (see above); --out is a directory")
    ap.add_argument("--positions", default="1024,4096,32768,131072,1048576", help="--long: positions")
    ap.add_argument("--caches", default="shared,sized", help="--long: shared, sized and/or cache sizes in positions")
    ap.add_argument("--shared-ctx", type=int, help="--long: positions of the shared cache (default: the largest "
                    "position + decode steps + a chunk)")
    ap.add_argument("--chunk", type=int, default=128, help="--long: prefill chunk (Model prefill_chunk)")
    ap.add_argument("--prefill-chunks", type=int, default=4, help="--long: prefill chunks timed per position")
    ap.add_argument("--budget-s", type=float, default=480, help="--long: positions not started after this many "
                    "seconds are skipped (the results so far are written after every measurement)")
    ap.add_argument("--rounds", type=int, default=1, help="--long: measure every cache this many times in turn "
                    "(medians over rounds; a shared CPU is noisy); above 1 the models are kept and, at each "
                    "position, rounds × tokens decode steps of the given cache sizes are alternated step by step")
    a = ap.parse_args(argv)
    try:
        a.variants = parse_variants(a.variants)
    except ValueError as e:
        ap.error(str(e))
    if a.quick:
        a.preset, a.max_ctx, a.prompt, a.tokens, a.host_dim = "demo", 64, 20, 8, 64
    a.host_layers = [int(v) for v in a.host_layers.split(",")]
    a.load_workers = [int(v) for v in a.load_workers.split(",") if v.strip()]
    a.load = a.load or a.load_only
    a.steps_per_submit = [int(v) for v in a.steps_per_submit.split(",")]
    try:
        a.offload_layers = [int(v) for v in a.offload_layers.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--offload-layers must be comma-separated layer counts, got {a.offload_layers!r}")
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


def weight_bytes_per_token(model, host_only=False):
    """Bytes of weights one decode step reads: every weight on the device (quantised ones with their
    scales) except the routed experts it does not pick (num_experts_per_tok of n_routed_experts;
    the shared expert always) and all but one row of the embedding. host_only: of the weights in host
    memory only (Model(expert_offload=): what a step reads over the bus)."""
    cfg, total = model.cfg, 0
    E, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    for name, p in model.ex.params.items():
        if name.startswith(("step.", "sampler.", "rope.")) or name.endswith((".kv", ".state", ".ent")):
            continue
        if host_only and not p.host_memory:
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


def load_speed(cfg, weights, directory, workers=None):
    """Write the checkpoint, then Model.load it in a child process: seconds, GB/s, peak RSS; workers:
    also once more per value of the upload's read threads (vk.upload.WORKERS), as "by_workers"."""
    import subprocess
    import tempfile
    from dsv4_vk.model.checkpoint import save_hf
    d = directory or tempfile.mkdtemp(prefix="dsv4_load_")
    t0 = time.perf_counter()
    save_hf(d, cfg, weights, naming="deepseek", shards=max(1, len(weights) // 400))
    write_s = time.perf_counter() - t0
    nbytes = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors"))
    # the child's own peak is its VmHWM: its ru_maxrss would start at this process's RSS (Linux keeps
    # the parent's high-water mark across fork and exec), i.e. report the bench's weights in memory
    child = ("import json, sys, time\n"
             "from dsv4_vk.model import Model\n"
             "from dsv4_vk.vk import upload\n"
             "upload.WORKERS = json.loads(sys.argv[2])\n"
             "def status():\n"
             "    return {k: int(v.split()[0]) * 1024 for k, v in (line.split(':', 1) for line in "
             "open('/proc/self/status')) if k in ('VmHWM', 'VmRSS', 'RssAnon', 'RssFile', 'RssShmem')}\n"
             "before = status()\n"
             "t = time.perf_counter(); m = Model.load(sys.argv[1], max_ctx=%d); s = time.perf_counter() - t\n"
             "after = status()\n"
             "print(json.dumps({'load_s': s, 'peak_rss_bytes': after['VmHWM'], 'rss_before_load_bytes': "
             "before['VmRSS'], 'rss_after_load_bytes': after, 'device_weights': m.memory()['weights'], "
             "'workers': upload.default_workers()}))"
             % cfg.max_ctx)

    def run(n):
        r = subprocess.run([sys.executable, "-c", child, d, json.dumps(n)], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"the load child failed: {r.stderr[-3000:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        out.update(checkpoint_bytes=nbytes, load_gbps=nbytes / out["load_s"] / 1e9)
        return out
    out = run(None)
    out.update(write_s=write_s, device_over_checkpoint=sum(out["device_weights"].values()) / nbytes, directory=d)
    if workers:
        out["by_workers"] = {str(n): run(n) for n in workers}
    return out


def report_load(res, cfg, weights, a):
    res["load"] = ld = load_speed(cfg, weights, a.load_dir, a.load_workers)
    for label, r in [("", ld)] + [(f" ({n} threads)", r) for n, r in ld.get("by_workers", {}).items()]:
        print(f"load{label}: {r['checkpoint_bytes'] / 1e9:.2f} GB in {r['load_s']:.1f} s = {r['load_gbps']:.2f} GB/s, "
              f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB ({r['rss_before_load_bytes'] / 1e9:.2f} GB before the "
              f"load, {r['workers']} read threads)", flush=True)
    print(f"device weights {ld['device_over_checkpoint']:.3f}x the checkpoint", flush=True)


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


def decode_path(cfg, weights, prompt, a, fused, warm, **placement):
    """placement: Model's expert_offload / max_device_memory (default: the model's own choice)."""
    model = Model(cfg, weights, fused=fused, **placement)
    mem = model.memory()
    offloaded, bus_bytes = model.offloaded, weight_bytes_per_token(model, host_only=True)
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
        "hc_paths": sorted({f"{p.op}:{p.path}" for p in model.paths()}),
        "device_memory_bytes": mem,
        "offloaded_layers": list(offloaded), "host_weight_bytes": sum(mem["host"].values()),
        "bus_bytes_per_token": bus_bytes,
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


BLOCK = (1 << 20) + 7          # bench_weights' repeated block (odd: consecutive rows differ by a shift)


def bench_weights(cfg, seed, dtype):
    """random_weights(cfg, seed, dtype) for every tensor of at most 4M elements; each larger one (the
    embedding and the linear maps) one random block at random_weights' scale, converted to dtype
    once and repeated: building a 16 GB model takes seconds, and the kernels' work does not depend
    on the values."""
    if isinstance(dtype, str):                           # a quantised layout: random_weights makes it
        return random_weights(cfg, seed, dtype)
    shapes = checkpoint.tensor_shapes(cfg)
    big = {n: s for n, s in shapes.items() if int(np.prod(s)) > 1 << 22}
    saved = checkpoint.tensor_shapes
    checkpoint.tensor_shapes = lambda c: {n: s for n, s in saved(c).items() if n not in big}
    try:
        out = random_weights(cfg, seed, dtype)
    finally:
        checkpoint.tensor_shapes = saved
    rng = np.random.default_rng(seed + 1)
    for name, shape in big.items():
        scale = 1.0 if name == "embed.weight" else 1.0 / np.sqrt(shape[-1])
        block = (rng.standard_normal(BLOCK, dtype=np.float32) * np.float32(scale)).astype(dtype)
        out[name] = np.resize(block, int(np.prod(shape))).reshape(shape)
    return out


def fill_cache(model, seed):
    """The decode cache's rows (raw window, compressor states, compressed entries, the indexer's
    keys) set to random values, as a long sequence would leave them (zeros would tie every score)."""
    rng = np.random.default_rng(seed)
    block = rng.standard_normal(BLOCK, dtype=np.float32)
    for name in model.ex.params:
        if name.startswith("layers.") and name.endswith((".kv", ".state", ".ent")):
            shape = model.params[name].shape
            model.ex.set_param(name, np.resize(np.roll(block, int(rng.integers(BLOCK))), int(np.prod(shape)))
                               .reshape(shape))


def mul_mat_kernels(model) -> list[str]:
    """The MUL_MAT kernels of the model's prefill graph, as ops.mul_mat.node_kernel chose them under the
    model's own knobs (the decision `info` reports; lowering outside them would name the default's)."""
    with tuned(model.tuning):
        return sorted({mul_mat.node_kernel(node, model.device).kernel
                       for node in model.compiled("prefill").graph.nodes if node.op.name == "MUL_MAT"})


def prefill_variants(cfg, weights, prompt, a, warm):
    """--prefill-variants: the whole prompt's prefill tokens/s (the fused model; median of 3 after one
    that records the graphs) under each variant's knobs (e.g. chunk=512,coopmat=1), a model each."""
    out = {}
    for label, knobs in [("default", {})] + parse_variants(a.prefill_variants):
        model = Model(cfg, weights, fused=True, tuning=Tuning(knobs))
        runs = []
        for i in range(4):
            model.reset()
            warm()
            t0 = time.perf_counter()
            model.prefill(prompt)
            if i:
                runs.append(time.perf_counter() - t0)
        kernels = mul_mat_kernels(model)
        C = model.prefill_chunk                      # the prompt's last chunk again, profiled per op
        prof = profiled(model, len(prompt) - C, prompt[-C:], steps=0)["prefill"]
        out[label] = {"knobs": knobs, "chunk": C, "tokens_per_s": len(prompt) / float(np.median(runs)),
                      "mul_mat_kernels": kernels, "last_chunk_profiled": prof}
        print(f"prefill {label:40s} chunk {C:4d}  {out[label]['tokens_per_s']:9.1f} tokens/s "
              f"({len(prompt)} tokens; MUL_MAT kernels {', '.join(kernels)})", flush=True)
        print(f"    last chunk profiled: {prof['gpu_ms']:.2f} GPU ms: " + ", ".join(
            f"{k} {v:.2f}" for k, v in list(prof["gpu_ms_by_op"].items())[:8]), flush=True)
        print("    by kernel: " + ", ".join(f"{k} {v:.2f}" for k, v in list(prof["gpu_ms_by_kernel"].items())[:8]),
              flush=True)
        release(model)
    return out


def release(model):
    """Give the model's device memory back now (its recorded graphs, then its params)."""
    for cg in model._graphs.values():
        cg.release()
    model._graphs.clear()
    for p in model.ex.params.values():
        p.release()
    model.ex.params.clear()


def profiled(model, p, ids, steps=2):
    """One prefill chunk at p and `steps` decode steps from p under the profiler: per phase GPU ms
    per op (per run) and the 12 slowest dispatches."""
    with profile.profile() as prof:
        with profile.phase("prefill"):
            model.position = p
            model.prefill(ids)
        with profile.phase("decode"):
            model.position = p
            for _ in range(steps):
                model.step()
    out = {}
    for ph, d in prof.as_dict()["phases"].items():
        runs = max(d["runs"], 1)
        timeline = prof.phases[ph].timeline()
        by_kernel: dict[str, float] = {}        # the shader each dispatch ran (its detail's first word)
        for _, _, detail, _, us in timeline:
            by_kernel[detail.split()[0]] = by_kernel.get(detail.split()[0], 0.0) + us / 1e3
        lines = sorted(timeline, key=lambda r: -r[4])[:12]
        out[ph] = {"gpu_ms": d["gpu_ms"] / runs,
                   "gpu_ms_by_op": {k: v["gpu_ms"] / runs for k, v in sorted(d["ops"].items(),
                                                                             key=lambda kv: -kv[1]["gpu_ms"])},
                   "gpu_ms_by_kernel": dict(sorted(by_kernel.items(), key=lambda kv: -kv[1])),
                   "slowest_dispatches": [{"op": label, "dispatch": detail, "gpu_us": us}
                                          for _, label, detail, _, us in lines]}
    return out


def measure_at(model, p, a, rng, warm):
    """Prefill tokens/s (a.prefill_chunks chunks, each at position p) and decode tokens/s (a.tokens
    steps from p), medians, and the profiled chunk and steps (`profiled`); each graph is recorded
    before it is timed."""
    C = model.prefill_chunk
    ids = rng.integers(0, model.cfg.vocab_size, C)
    chunk_s = []
    for i in range(a.prefill_chunks + 1):
        model.position = p
        t0 = time.perf_counter()
        model.prefill(ids)
        if i:                                            # the first recorded the graph
            chunk_s.append(time.perf_counter() - t0)
    model.position = p
    model.step()
    if warm is not None:
        warm()
    model.position = p
    step_s = []
    for _ in range(a.tokens):
        t0 = time.perf_counter()
        model.step()
        step_s.append(time.perf_counter() - t0)
    return {"prefill_tokens_per_s": C / float(np.median(chunk_s)), "prefill_ms_per_chunk": 1e3 * float(np.median(chunk_s)),
            "decode_tokens_per_s": 1.0 / float(np.median(step_s)), "decode_ms_per_token": 1e3 * float(np.median(step_s)),
            "profile": profiled(model, p, ids)}


def interleaved(models, p, n):
    """n decode steps of each model from position p (back to p every 16 steps), alternating one step
    of each in turn so that every model's steps meet the same load (a shared CPU): per model the
    median ms a step and the median of its step-by-step ratios to the first model's."""
    ms = {k: [] for k in models}
    for i in range(n):
        for k, m in models.items():
            if i % 16 == 0:
                m.position = p
            t0 = time.perf_counter()
            m.step()
            ms[k].append(1e3 * (time.perf_counter() - t0))
    first = np.array(next(iter(ms.values())))
    return {k: {"median_ms": float(np.median(v)), "p10_ms": float(np.percentile(v, 10)),
                "median_ratio_to_first": float(np.median(np.array(v) / first))} for k, v in ms.items()}


def long_context(a, dev):
    """--long (see the module docstring): {cache label: {position: measurements}} into a.out/."""
    positions = [int(v) for v in a.positions.split(",")]
    margin = a.tokens + a.chunk + 1                      # the decode steps and a chunk past the position
    caches = []
    for c in a.caches.split(","):
        if c == "shared":
            caches.append(("shared", a.shared_ctx or max(positions) + margin))
        elif c == "sized":
            caches.append(("sized", None))
        else:
            caches.append((f"cache {int(c)}", int(c)))
    cfg = config(a.preset, max(positions) + margin, a.layers, a.experts)
    t0 = time.perf_counter()
    weights = bench_weights(cfg, 0, DTYPES[a.dtype])
    wbytes = sum(w.nbytes for w in weights.values())
    print(f"device {dev.name}; model {a.preset} ({a.dtype}): {wbytes / 1e9:.2f} GB of weights built in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    warm = floor.ClockWarmer(dev, floor.default_warm_ms(dev) if a.warm_ms is None else a.warm_ms)
    res = {"device": dev.name, "preset": a.preset, "dtype": a.dtype, "chunk": a.chunk, "positions": positions,
           "decode_steps_timed": a.tokens, "prefill_chunks_timed": a.prefill_chunks, "rounds": a.rounds,
           "config": cfg.replace(max_ctx=1).to_hf(), "caches": {}}
    rounds = {}
    kept = {}                   # with --rounds > 1 the models stay (one per cache size) across rounds
    for rnd in range(a.rounds):
        for label, ctx in caches:
            model = None
            for p in positions:
                need = ctx if ctx is not None else p + margin
                key = f"{label}" if ctx is not None else "sized"
                if time.perf_counter() - t0 > a.budget_s:
                    res["caches"].setdefault(key, {})[str(p)] = {"skipped": f"past the {a.budget_s:.0f} s budget"}
                    continue
                if p + margin > need:
                    res["caches"].setdefault(key, {})[str(p)] = {"skipped": f"position {p} + {margin} past the "
                                                                           f"{need}-position cache"}
                    continue
                if model is None or model.cfg.max_ctx != need:
                    if model is not None and a.rounds == 1:
                        release(model)
                    model = kept.get(need)
                    if model is None:
                        try:
                            model = Model(cfg.replace(max_ctx=need), weights, fused=True, prefill_chunk=a.chunk)
                        except ValueError as e:            # check_memory: does not fit this device
                            res["caches"].setdefault(key, {})[str(p)] = {"max_ctx": need, "skipped": str(e)}
                            print(f"{key:12s} position {p:8d}: skipped ({e})", flush=True)
                            continue
                        fill_cache(model, p)
                        if a.rounds > 1:
                            kept[need] = model
                r = measure_at(model, p, a, np.random.default_rng(p), warm)
                r["max_ctx"] = need
                r["cache_bytes"] = model.memory()["cache"]
                rounds.setdefault((key, p), []).append(r)
                write_long(a.out, dict(res, partial=rounds_summary(rounds, a)))     # kept if the run is cut short
                print(f"{key:12s} position {p:8d} cache {need:8d}: prefill {r['prefill_tokens_per_s']:9.1f} tokens/s, "
                      f"decode {r['decode_tokens_per_s']:8.1f} tokens/s ({r['decode_ms_per_token']:.3f} ms)", flush=True)
            if model is not None and a.rounds == 1:
                release(model)
    res["interleaved"] = {}
    for p in positions if a.rounds > 1 else []:     # the kept models' decode steps alternated one by one
        at = {f"cache {c}": m for c, m in kept.items() if p + margin <= c}
        if len(at) > 1:
            res["interleaved"][str(p)] = interleaved(at, p, a.tokens * a.rounds)
    for model in kept.values():
        release(model)
    for (key, p), r in rounds_summary(rounds, a).items():
        res["caches"].setdefault(key, {})[str(p)] = r
    warm.close()
    lines = write_long(a.out, res)
    print("\n".join(lines))
    print(f"wrote {a.out}/long_context.json and long_context.txt")
    return 0


def rounds_summary(rounds, a):
    """{(cache, position): the first round's record with medians over rounds of the timings and of the
    profiled GPU ms (its slowest dispatches: the first round's)}."""
    out = {}
    for (key, p), rs in rounds.items():
        med = {k: float(np.median([x[k] for x in rs])) for k in ("decode_ms_per_token", "prefill_ms_per_chunk")}
        prof = {ph: dict(v) for ph, v in rs[0]["profile"].items()}
        for ph in prof:
            prof[ph]["gpu_ms"] = float(np.median([x["profile"][ph]["gpu_ms"] for x in rs]))
            prof[ph]["gpu_ms_by_op"] = dict(sorted(((op, float(np.median([x["profile"][ph]["gpu_ms_by_op"].get(op, 0.0)
                                                                           for x in rs])))
                                                    for op in prof[ph]["gpu_ms_by_op"]), key=lambda kv: -kv[1]))
        out[(key, p)] = dict(rs[0], **med, profile=prof, decode_tokens_per_s=1e3 / med["decode_ms_per_token"],
                             prefill_tokens_per_s=1e3 * a.chunk / med["prefill_ms_per_chunk"],
                             decode_ms_per_token_rounds=[x["decode_ms_per_token"] for x in rs],
                             prefill_ms_per_chunk_rounds=[x["prefill_ms_per_chunk"] for x in rs])
    return out


def write_long(out_dir, res):
    """long_context.json and .txt (the summary table) into out_dir; res["partial"]: the measurements
    so far, written after each one. Returns the table's lines."""
    if "partial" in res:
        res = dict(res, caches={k: dict(v) for k, v in res["caches"].items()})
        for (key, p), r in res.pop("partial").items():
            res["caches"].setdefault(key, {})[str(p)] = r
    lines = summary(res)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "long_context.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(out_dir, "long_context.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def summary(res):
    """The sweep as a table: per cache and position, tokens/s, and each against the first position."""
    out = [f"{res['device']}: {res['preset']} {res['dtype']}, prefill chunk {res['chunk']}, "
           f"{res['decode_steps_timed']} decode steps timed (median), {res['rounds']} round(s)",
           f"{'cache':12s} {'position':>9s} {'max_ctx':>9s} {'prefill tok/s':>14s} {'vs first':>9s} "
           f"{'decode tok/s':>13s} {'vs first':>9s}  top decode ops (GPU ms a step)"]
    for key, by_pos in res["caches"].items():
        first = None
        for p, r in by_pos.items():
            if "skipped" in r:
                out.append(f"{key:12s} {p:>9s}  skipped: {r['skipped']}")
                continue
            first = first or r
            ops = ", ".join(f"{k} {v:.3f}" for k, v in list(r["profile"]["decode"]["gpu_ms_by_op"].items())[:4])
            out.append(f"{key:12s} {p:>9s} {r['max_ctx']:>9d} {r['prefill_tokens_per_s']:>14.1f} "
                       f"{r['prefill_tokens_per_s'] / first['prefill_tokens_per_s']:>9.3f} "
                       f"{r['decode_tokens_per_s']:>13.1f} {r['decode_tokens_per_s'] / first['decode_tokens_per_s']:>9.3f}"
                       f"  {ops}")
    positions = {p for by_pos in res["caches"].values() for p in by_pos}
    for p in sorted(positions, key=int):
        row = {k: v[p] for k, v in res["caches"].items() if p in v and "skipped" not in v[p]}
        if len(row) > 1:
            for what, get in (("median of rounds", lambda r: r["decode_ms_per_token"]),
                              ("best round", lambda r: min(r["decode_ms_per_token_rounds"])),
                              ("profiled GPU", lambda r: r["profile"]["decode"]["gpu_ms"])):
                fast = min(get(r) for r in row.values())
                out.append(f"position {p}: decode ms a step ({what}) " + ", ".join(
                    f"{k} {get(r):.3f} ({get(r) / fast:.2f}x)" for k, r in row.items()))
    for p, row in res.get("interleaved", {}).items():
        out.append(f"position {p}: decode ms a step, steps of the caches alternated one by one: " + ", ".join(
            f"{k} median {r['median_ms']:.3f} (p10 {r['p10_ms']:.3f}), step-by-step ratio to the first "
            f"{r['median_ratio_to_first']:.3f}" for k, r in row.items()))
    return out


def main(argv=None):
    a = parse(argv if argv is not None else sys.argv[1:])
    dev = default_device()
    if a.long:
        return long_context(a, dev)
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
    if a.prefill_variants:
        res["prefill"] = prefill_variants(cfg, weights, prompt, a, warm)
        warm.close()
        return write_results(res, a.out)
    if a.load_only:
        report_load(res, cfg, weights, a)
        warm.close()
        return write_results(res, a.out)
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
        report_load(res, cfg, weights, a)
    res["decode_variants"] = {}
    for label, sets in a.variants:
        with tuned(sets):                   # the model built in decode_path takes these knobs
            toks, r = decode_path(cfg, weights, prompt, a, True, warm)
        r.pop("timeline")
        r["same_tokens_as_fused"] = toks == tokens["fused"]
        r["speed_over_fused"] = r["tokens_per_s"] / res["decode"]["fused"]["tokens_per_s"]
        res["decode_variants"][label] = r
        by_op = r["gpu_ms_per_token_by_op"]
        print(f"fused {label}: {r['tokens_per_s']:9.1f} tokens/s ({r['speed_over_fused']:.3f}x)  "
              f"{r['dispatches_per_token']} dispatches/token  GPU ms MUL_MAT {by_op.get('MUL_MAT', 0):.3f} "
              f"MUL_MAT_ID {by_op.get('MUL_MAT_ID', 0):.3f} RMS_NORM {by_op.get('RMS_NORM', 0):.3f}; same tokens: "
              f"{r['same_tokens_as_fused']}", flush=True)
    res["decode_offload"] = {}
    for n in a.offload_layers:
        try:
            toks, r = decode_path(cfg, weights, prompt, a, True, warm, expert_offload=n)
        except ValueError as e:             # check_memory: more layers than the model has, or no host heap
            res["decode_offload"][str(n)] = {"skipped": str(e)}
            print(f"fused, experts of {n} layers in host memory: skipped: {e}", flush=True)
            continue
        r.pop("timeline")
        r["same_tokens_as_fused"] = toks == tokens["fused"]
        r["speed_over_fused"] = r["tokens_per_s"] / res["decode"]["fused"]["tokens_per_s"]
        res["decode_offload"][str(n)] = r
        print(f"fused, experts of {n} layer{'s' if n != 1 else ''} in host memory ({r['host_weight_bytes'] / 1e9:.2f} GB, "
              f"{r['bus_bytes_per_token'] / 1e6:.1f} MB a token over the bus): {r['tokens_per_s']:9.1f} tokens/s "
              f"({r['speed_over_fused']:.3f}x), GPU ms MUL_MAT_ID {r['gpu_ms_per_token_by_op'].get('MUL_MAT_ID', 0):.3f}; "
              f"same tokens: {r['same_tokens_as_fused']}", flush=True)
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
    return write_results(res, a.out)


def write_results(res, out):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
