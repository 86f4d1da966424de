"""How much a dependent dispatch costs when its dependency is carried by a counter instead of a
pipeline barrier. A chain of N dispatches, each of G workgroups of 64: dispatch k reads values the
previous dispatch wrote in other workgroups (a permuted index) and writes its own. Variants:

  barrier   a pipeline barrier between consecutive dispatches (what the recorder does today)
  spin      no barrier: each workgroup of dispatch k waits until the counter shows every workgroup of
            dispatch k-1 arrived (polled by atomicAdd(0)), then reads with coherent loads; each
            workgroup fences its stores and increments the counter when done
  spinload  the same, the counter polled by volatile loads
  launch    no barrier and no wait (the results race; the launch floor only)

Every replay checks d[N] == N everywhere (except `launch`). GPU µs per dispatch, median of replays.

    . .vkdev/enter.sh; python3 tools/handoff_bench.py [--n 64] [--groups 1,16,64] [--warm-ms 500]
"""
import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SRC = r"""#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(binding = 0) coherent buffer D { float d[]; };
layout(binding = 1) coherent volatile buffer C { uint cnt[]; };
layout(push_constant) uniform P { uint step, arrived_before, spin; } p;
void main() {
    if (gl_LocalInvocationIndex == 0u) {
        uint n = 0u;
        if (p.spin != 0u)
            while ((p.spin == 2u ? cnt[0] : atomicAdd(cnt[0], 0u)) < p.arrived_before && n < (1u << 22)) ++n;
        if (n >= (1u << 22)) atomicAdd(cnt[1], 1u);      // a wait that timed out: reported, not hung
    }
    memoryBarrierBuffer();
    barrier();
    uint W = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint i = flat_index();
    d[(p.step + 1u) * W + i] = d[p.step * W + (i * 7919u + 13u) % W] + 1.0;
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u && p.spin != 0u) atomicAdd(cnt[0], 1u);
}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--groups", default="1,16,64")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--warm-ms", type=float, default=0.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp()) / "shaders"
    shutil.copytree(ROOT / "shaders", tmp)
    (tmp / "handoff.comp").write_text(SRC)
    from dsv4_vk.vk import shader
    shader.shader_dir = lambda: tmp
    shader.SHADER_DIR = tmp
    from dsv4_vk.vk import Buffer, Recorder, default_device, pack_push
    dev = default_device()
    print(f"device: {dev.name}")
    warm = None
    if a.warm_ms > 0:
        from dsv4_vk.cli.floor import ClockWarmer
        warm = ClockWarmer(dev, a.warm_ms)
    WG = 64
    pipe = dev.pipelines.get("handoff", 2, {}, (WG,))
    with dev.in_use:
        for G in [int(g) for g in a.groups.split(",")]:
            W = G * WG
            d = Buffer(dev, 4 * W * (a.n + 1))
            c = Buffer(dev, 16)
            zero = Buffer(dev, 16)
            d.write(np.zeros(W * (a.n + 1), np.float32))
            zero.write(np.zeros(4, np.uint32))
            for mode in ("barrier", "spin", "spinload", "launch", "spinload"):
                rec = Recorder(dev, timestamps="ends")
                rec.copy(zero, 0, c, 0, 16)
                rec.barrier()
                for k in range(a.n):
                    if mode == "barrier":
                        rw = ([(d, 4 * W * k, 4 * W * (k + 1))], [(d, 4 * W * (k + 1), 4 * W * (k + 2))])
                    else:
                        rw = ((), ())
                    spin = {"spin": 1, "spinload": 2}.get(mode, 0)
                    rec.dispatch(pipe, [d, c], pack_push(k, k * G, spin), (G, 1, 1), *rw)
                r = rec.finish()
                r.submit()
                if warm is not None:
                    warm()
                per, bad = [], 0
                for _ in range(a.replays):
                    d.write(np.zeros(W, np.float32))          # d[0] = 0; later rows are overwritten
                    r.submit()
                    ts = r.timestamps_ns()
                    per.append((ts[-1] - ts[0]) / a.n / 1e3)
                    if mode != "launch":
                        last = d.read(4 * W * a.n, 4 * W).view(np.float32)
                        cnt = c.read(0, 8).view(np.uint32)
                        if not np.all(last == a.n) or cnt[1] != 0:
                            bad += 1
                r.destroy()
                print(f"G={G:3d} {mode:8s} {statistics.median(per):7.3f} µs/dispatch "
                      f"(min {min(per):.3f})  wrong replays {bad}/{a.replays}", flush=True)
            for b in (d, c, zero):
                dev.pipelines.forget_buffer(b)
                b.destroy()


if __name__ == "__main__":
    main()
