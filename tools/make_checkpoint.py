"""Write a random, seeded DeepSeek-V4 checkpoint: a Hugging Face model directory (config.json +
safetensors, the names `save_pretrained` writes or DeepSeek's original ones) that
`Model.load(dir)` and transformers' `DeepseekV4ForCausalLM.from_pretrained(dir)` both read.

    python tools/make_checkpoint.py --out DIR [--preset demo] [--set hidden_size=128 --set index_topk=16]
                                    [--dtype f32|bf16|f16|fp8] [--experts fp4|fp8] [--scales e8m0|u8|f32]
                                    [--naming save_pretrained|deepseek] [--shards 1] [--seed 0]

--set takes any V4Config field (model/config.py) as key=JSON value. --dtype fp8 writes DeepSeek's
published layout (docs/quantized_weights.md): FP8 linears with 128 × 128 block scales, routed
experts in --experts (default FP4), the rest BF16/F32, scales stored as --scales.
"""
import argparse
import json
import sys

import numpy as np


from dsv4_vk.model.synthetic import write_random
from dsv4_vk.model.config import PRESETS, ConfigError, preset


def parse_set(text):
    key, eq, value = text.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value                                   # a bare string (e.g. scoring_func=sigmoid)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--preset", default="demo", choices=sorted(PRESETS), help="base config (default demo)")
    ap.add_argument("--set", type=parse_set, action="append", default=[], help="field=JSON value (repeatable)")
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16", "f16", "fp8"),
                    help="linear weights (default f32; fp8: the published FP8/FP4 layout)")
    ap.add_argument("--experts", default="fp4", choices=("fp4", "fp8"), help="routed experts with --dtype fp8")
    ap.add_argument("--scales", default="e8m0", choices=("e8m0", "u8", "f32"), help="scale storage with --dtype fp8")
    ap.add_argument("--naming", default="save_pretrained", choices=("save_pretrained", "deepseek"))
    ap.add_argument("--shards", type=int, default=1, help="safetensors files (default 1; > 1 adds the index)")
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    args = ap.parse_args(argv)
    try:
        cfg = preset(args.preset, **dict(args.set))
    except (ConfigError, TypeError) as e:
        ap.error(str(e))
    if args.shards < 1:
        ap.error(f"--shards must be ≥ 1, got {args.shards}")
    quant = {"experts": args.experts, "scale_dtype": args.scales} if args.dtype == "fp8" else {}
    w = write_random(args.out, cfg, args.seed, args.dtype, args.naming, args.shards, **quant)
    n = sum(int(np.prod(a.shape)) for a in w.values())
    mib = sum(a.nbytes for a in w.values()) / 2 ** 20
    print(f"wrote {args.out}: {len(w)} tensors, {n} parameters ({mib:.1f} MiB, {args.dtype} linears), "
          f"{args.naming} names, seed {args.seed}")
    print(f"layers: {', '.join(cfg.layer_types)}; MoE: {', '.join(cfg.mlp_layer_types)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
