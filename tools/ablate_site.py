"""Where the decode site's GPU time goes: the site (HC_SITE, HC_POST_MIX) at T = 1, D = 4096 timed with
parts of its kernels removed. Each ablation is a copy of shaders/ with a few source lines replaced
(the results are wrong on purpose: only the time is read), run in a subprocess of its own so that
every pipeline is built from the patched source. Per row: GPU µs of one site (rep1), of 8 sites
back to back in one command buffer (rep8, per site), and each dispatch with a timestamp after it.
"base" also times HC_PRE, HC_POST, HC_COMB and the three-op site for comparison.

    . .vkdev/enter.sh; python3 tools/ablate_site.py [NAME ...]        (OUT set: OUT/ablate_site.json)

A replaced line that dead-code elimination removes takes its inputs with it: e.g. without the
reduction (post_noreduce) the fn products are dead too.
"""
import json
import os

from ablation import main

# scalar chunks everywhere: every module that chooses vec4 loads (kernels for HC_PRE/HC_POST/HC_SITE,
# mix_kernels for the mixes kernels) told that no tensor allows them
SCALAR = ("import dsv4_vk.hc.kernels as K, dsv4_vk.hc.mix_kernels as MK; "
          "K.vec4_ok = MK.vec4_ok = lambda D, tensors: False")
SINK_HEAD = "vec4 hc_sinkhorn_rows4(vec4 l, float eps, uint n_iter) {"
SINK_LOOP = "        c /= hc_hsum(c) + eps;\n        c /= hc_col_sum4(c) + eps;\n"
NR_RCP = """#define HC_NR(r, x) r = r * (2.0 - (x) * r)
float hc_rcp(float x) { float r = uintBitsToFloat(0x7EF311C3u - floatBitsToUint(x)); HC_NR(r, x); HC_NR(r, x); HC_NR(r, x); return r; }
vec4 hc_rcp(vec4 x) { vec4 r = uintBitsToFloat(uvec4(0x7EF311C3u) - floatBitsToUint(x)); HC_NR(r, x); HC_NR(r, x); HC_NR(r, x); return r; }
"""
SINK_FN = """    for (uint it = 1u; it < n_iter; ++it) {
        c /= hc_hsum(c) + eps;
        c /= hc_col_sum4(c) + eps;
    }
    return c;"""
TCOPY_FN = """    uint base = gl_SubgroupInvocationID & ~3u, me = gl_SubgroupInvocationID & 3u;
    vec4 k;                                     // k[m] = c[m][me]: lane m ^ r gives its c[me ^ r ^ r]
    [[unroll]] for (uint r = 0u; r < 4u; ++r) k[me ^ r] = subgroupShuffleXor(c[me ^ r], r);
    for (uint it = 1u; it < n_iter; ++it) {
        float s = hc_hsum(c) + eps;
        c *= RCP(s);
        vec4 sv = vec4(subgroupShuffle(s, base), subgroupShuffle(s, base + 1u), subgroupShuffle(s, base + 2u),
                       subgroupShuffle(s, base + 3u));
        k *= RCP(sv);
        float t = hc_hsum(k) + eps;
        k *= RCP(t);
        vec4 tv = vec4(subgroupShuffle(t, base), subgroupShuffle(t, base + 1u), subgroupShuffle(t, base + 2u),
                       subgroupShuffle(t, base + 3u));
        c *= RCP(tv);
    }
    return c;"""
ABL = {
    "base": [],
    "site_sink1": [("hc_site.comp", "hc_sinkhorn_rows4(l, p.eps, p.n_iter)", "hc_sinkhorn_rows4(l, p.eps, 1u)")],
    "site_nopart": [("hc_site.comp", "i < p.G; i += gl_WorkGroupSize.x", "i < 0u; i += gl_WorkGroupSize.x")],
    "site_noreduce": [("hc_site.comp", "mixacc_put(A);\n    barrier();", "")],
    "site_nox": [("hc_site.comp", "u[p.u_off + t * p.u_st + c] = v;", "u[p.u_off + t * p.u_st + c] = VEC(pre[0]+pre[1]+pre[2]+pre[3]);")],
    "site_nosink_nox": [("hc_site.comp", "hc_sinkhorn_rows4(l, p.eps, p.n_iter)", "l"),
                        ("hc_site.comp", "u[p.u_off + t * p.u_st + c] = v;", "u[p.u_off + t * p.u_st + c] = VEC(pre[0]+pre[1]+pre[2]+pre[3]);")],
    "post_nofn": [("hc_post.comp", "mixacc_add(A, r, p.fn_off + d * p.n_chunks + c, p.fn_sj, true);",
                   "A.ss += dot_v(r, r);")],
    "post_fnL1": [("hc_post.comp", "mixacc_add(A, r, p.fn_off + d * p.n_chunks + c, p.fn_sj, true);",
                   "mixacc_add(A, r, p.fn_off + (c & 7u), 8u, true);")],
    "post_noreduce": [("hc_post.comp", "mixacc_put(A);\n    barrier();", "")],
    "no_transpose": [("hc_site.comp", "#define MIXACC_TRANSPOSE ", "// "), ("hc_post.comp", "#define MIXACC_TRANSPOSE ", "// ")],
    # host-side layouts: entries "name": [patches] above, or "name": ([patches], "python run in the child")
    "scalar": ([], SCALAR),
    "post_wg32": ([], "import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 32"),
    "post_wg128": ([], "import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 128"),
    "post_wg256": ([], "import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 256"),
    "scalar_wg128": ([], SCALAR + "; import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 128"),
    "scalar_wg256": ([], SCALAR + "; import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 256"),
    # the Sinkhorn's divisions: none (multiplied instead: the floor of their cost), or reciprocals by
    # three Newton steps from a bit-trick guess (FMAs only, no division subroutine)
    "sink_nodiv": [("hc_math.glsl", SINK_LOOP, SINK_LOOP.replace("/=", "*="))],
    "sink_nr": [("hc_math.glsl", SINK_HEAD, NR_RCP + SINK_HEAD),
                ("hc_math.glsl", SINK_LOOP, "        c *= hc_rcp(hc_hsum(c) + eps);\n        c *= hc_rcp(hc_col_sum4(c) + eps);\n")],
    # the Sinkhorn's loop unrolled for the bench's 20 iterations (wrong for others); its column sums
    # without shuffles (wrong on purpose: the floor of their cost)
    "sink_unroll": [("hc_math.glsl", "    for (uint it = 1u; it < n_iter; ++it) {",
                     "    [[unroll]] for (uint it = 1u; it < 20u; ++it) {")],
    "sink_noshuf": [("hc_math.glsl", "    vec4 a = subgroupShuffleXor(v, 1u), b = subgroupShuffleXor(v, 2u), c = subgroupShuffleXor(v, 3u);",
                     "    vec4 a = v * 0.5, b = v * 0.25, c = v * 0.125;")],
    # the loop's divisions as products with 1/|s| by inversesqrt(s·s) (one MUFU.RSQ, no division
    # subroutine; s > 0 here)
    "sink_rsq": [("hc_math.glsl", SINK_LOOP,
                  "        { float s = hc_hsum(c) + eps; c *= inversesqrt(s * s); }\n"
                  "        { vec4 s = hc_col_sum4(c) + eps; c *= inversesqrt(s * s); }\n")],
    # each lane also keeps its column of the matrix, so that a half-step's sums are local and only
    # the 4 scalar sums cross lanes (8 float shuffles an iteration instead of 3 vec4 = 12, but two
    # shuffle latencies instead of one); with the divisions as in sink_rsq too
    "sink_tcopy": [("hc_math.glsl", SINK_FN, "#define RCP(x) (1.0 / (x))\n" + TCOPY_FN)],
    "sink_tcopy_rsq": [("hc_math.glsl", SINK_FN, "#define RCP(x) inversesqrt((x) * (x))\n" + TCOPY_FN)],
    "post_nopostwrite": [("hc_post.comp", "o[p.o_off + t * p.o_st + c + d * p.o_sd] = r;", "")],
}


def child(name, flags):
    import numpy as np
    from dsv4_vk.hc import cases as C
    from dsv4_vk.cli import floor as F
    from dsv4_vk.cli.bench import bench_path, dispatch_times
    from dsv4_vk.vk import default_device
    dev = default_device()
    rng = np.random.default_rng(0)
    out = {"name": name}
    others = [("HC_PRE", "fused"), ("HC_POST", "fused"), ("HC_COMB", None), ("HC_SITE", C.THREE_OP)]
    with F.ClockWarmer(dev, 500) as warm:
        for op, path in [("HC_SITE", C.SITE)] + (others if name == "base" else []):
            case = C.Case(op, 1, 4096)
            if path is None:
                path = [p for p in C.paths(dev, op) if p.startswith("fused")][0]
            inputs = C.make_inputs(case, rng)
            r1 = bench_path(dev, case, path, inputs, 30, 1, warm)
            r8 = bench_path(dev, case, path, inputs, 30, 8, warm)
            parts = dispatch_times(dev, case, path, inputs, 30, warm)
            out[f"{op}:{path}"] = {"rep1": r1["gpu_us"], "rep8": r8["gpu_us"], "parts": parts}
    print(json.dumps(out))


RESULTS = []


def report(name, proc):
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        d = json.loads(line)
    except ValueError:
        print(name, "FAILED", proc.stderr[-1500:], flush=True)
        return
    RESULTS.append(d)
    for k, v in d.items():
        if k != "name":
            print(f"{name:18s} {k:22s} rep1 {v['rep1']:6.1f}  rep8 {v['rep8']:6.1f}  parts " +
                  ", ".join(f"{lab} {us:.1f}" for lab, us in v["parts"]), flush=True)


if __name__ == "__main__":
    main(__file__, ABL, child, report)
    if RESULTS and os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "ablate_site.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
