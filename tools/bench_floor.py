#!/usr/bin/env python3
"""Measure the device floor (dsv4_vk/floor.py): dispatch latency with and without barriers, submit
round trip, host recording cost, copy bandwidth.

    python tools/bench_floor.py [--chain 256] [--copy-mib 1024] [--replays 10] [--json] [--out f.json]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4_vk.floor import format_floor, measure  # noqa: E402
from dsv4_vk.vk import default_device  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", type=int, default=256, help="dispatches in the timed chain (default 256)")
    ap.add_argument("--copy-mib", type=float, default=None,
                    help="bytes copied, MiB (default: 1024 on GPUs, 16 on CPU devices)")
    ap.add_argument("--replays", type=int, default=10, help="replays per GPU measurement (median)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    ap.add_argument("--out", help="also write the JSON to this file")
    args = ap.parse_args(argv)
    if args.chain < 1 or args.replays < 1:
        ap.error("--chain and --replays must be ≥ 1")
    copy_bytes = None if args.copy_mib is None else int(args.copy_mib * 2**20) // 16 * 16
    result = measure(default_device(), chain=args.chain, copy_bytes=copy_bytes, replays=args.replays)
    print(json.dumps(result, indent=2) if args.json else format_floor(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
