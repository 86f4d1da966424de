"""Write a random, seeded checkpoint (safetensors, F32, config in the metadata) for any model config.

    python tools/make_checkpoint.py --out model.safetensors [--dim 64 --n_layers 2 ... --seed 0]

Every field of dsv4_vk.model.Config is an option (defaults: the Config defaults).
"""
import argparse
import dataclasses
import os
import sys


from dsv4_vk.model import Config, random_weights, save


def _bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="checkpoint path to write")
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    for f in dataclasses.fields(Config):
        kind = _bool if f.type in (bool, "bool") else type(f.default)
        ap.add_argument(f"--{f.name}", type=kind, default=f.default, help=f"(default {f.default})")
    args = ap.parse_args(argv)
    try:
        cfg = Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})
    except ValueError as e:
        ap.error(str(e))
    weights = random_weights(cfg, args.seed)
    save(args.out, weights, cfg)
    n = sum(a.size for a in weights.values())
    print(f"wrote {args.out}: {len(weights)} tensors, {n} parameters ({4 * n / 2**20:.1f} MiB), seed {args.seed}")
    print(f"config: {cfg.to_json()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
