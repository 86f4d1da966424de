"""The mixes mat-mul alone in PyTorch (CUDA), the reference point for HC_MIX at prefill: mix = (x @ fnᵀ) ·
rsqrt(mean(x²) + eps), x [T, 4·D] fp32, fn [24, 4·D] — cuBLAS's fp32 GEMM (TF32 off), the same with TF32 on
(not fp32 accuracy), the bare GEMM, and torch.compile of the whole. GPU time per call back to back (CUDA events
around N calls, the fastest of 5 rounds), after a clock warm-up; GB/s counts X's bytes.

    python3 tools/mixes_torch.py --t 512,4096 --d 4096 > $OUT/mixes_torch.txt
"""
import argparse
import time

import torch


def timed(fn, calls=50, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / calls)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", default="512,4096")
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--warm-ms", type=float, default=500)
    a = ap.parse_args()
    dev = "cuda"
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}")

    def mixes(x, fn):
        return (x @ fn.t()) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    compiled = torch.compile(mixes)
    for T in map(int, a.t.split(",")):
        x = torch.rand(T, 4 * a.d, device=dev) * 2 - 1
        fn = torch.rand(24, 4 * a.d, device=dev) * 2 - 1
        gb = x.numel() * 4 / 1e9
        end = time.time() + a.warm_ms / 1e3
        while time.time() < end:
            x @ fn.t()
        torch.cuda.synchronize()
        rows = []
        for name, tf32, f in (("matmul fp32", False, lambda: x @ fn.t()),
                              ("mixes fp32 eager", False, lambda: mixes(x, fn)),
                              ("mixes torch.compile", False, lambda: compiled(x, fn)),
                              ("matmul tf32", True, lambda: x @ fn.t())):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            f(); torch.cuda.synchronize()
            us = timed(f)
            rows.append(f"T={T} D={a.d} {name:22s} {us:8.1f} µs  {gb / us * 1e6:7.1f} GB/s")
        torch.backends.cuda.matmul.allow_tf32 = False
        print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
