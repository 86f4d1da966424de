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
import json, os, shutil, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABL = {
    "base": [],
    "site_sink1": [("hc_site.comp", "hc_sinkhorn_rows4(l, p.eps, p.n_iter)", "hc_sinkhorn_rows4(l, p.eps, 1u)")],
    "site_nopart": [("hc_site.comp", "i < p.G; i += gl_WorkGroupSize.x", "i < 0u; i += gl_WorkGroupSize.x")],
    "site_noreduce": [("hc_site.comp", "mixacc_put(A);\n    barrier();", "")],
    "site_nox": [("hc_site.comp", "u[p.u_off + t * p.u_st + c] = v;", "u[p.u_off + t * p.u_st + c] = VEC(pre[0]+pre[1]+pre[2]+pre[3]);")],
    "site_nosink_nox": [("hc_site.comp", "hc_sinkhorn_rows4(l, p.eps, p.n_iter)", "l"),
                        ("hc_site.comp", "u[p.u_off + t * p.u_st + c] = v;", "u[p.u_off + t * p.u_st + c] = VEC(pre[0]+pre[1]+pre[2]+pre[3]);")],
    "post_nofn": [("hc_post.comp", "[[unroll]] for (uint d = 0u; d < 4u; ++d) mixacc_add(A, r[d], p.fn_off + d * p.n_chunks + c, p.fn_sj, true);",
                   "[[unroll]] for (uint d = 0u; d < 4u; ++d) A.ss += dot_v(r[d], r[d]);")],
    "post_fnL1": [("hc_post.comp", "mixacc_add(A, r[d], p.fn_off + d * p.n_chunks + c, p.fn_sj, true);",
                   "mixacc_add(A, r[d], p.fn_off + (c & 7u), 8u, true);")],
    "post_noreduce": [("hc_post.comp", "mixacc_put(A);\n    barrier();", "")],
    "no_transpose": [("hc_site.comp", "#define MIXACC_TRANSPOSE ", "// "), ("hc_post.comp", "#define MIXACC_TRANSPOSE ", "// ")],
    # host-side layouts: entries "name": [patches] above, or "name": ([patches], "python run in the child")
    "scalar": ([], "import dsv4_vk.hc.kernels as K; K.vec4_ok = lambda D, tensors: False"),
    "post_wg32": ([], "import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 32"),
    "post_wg128": ([], "import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 128"),
    "post_wg256": ([], "import dsv4_vk.hc.composite as H; H.SITE_TUNING['post_wg'] = 256"),
    "scalar_wg128": ([], "import dsv4_vk.hc.kernels as K, dsv4_vk.hc.composite as H; "
                         "K.vec4_ok = lambda D, tensors: False; H.SITE_TUNING['post_wg'] = 128"),
    "scalar_wg256": ([], "import dsv4_vk.hc.kernels as K, dsv4_vk.hc.composite as H; "
                         "K.vec4_ok = lambda D, tensors: False; H.SITE_TUNING['post_wg'] = 256"),
    "post_nopostwrite": [("hc_post.comp", "[[unroll]] for (uint d = 0u; d < 4u; ++d) o[ob + d * p.o_sd] = r[d];", "")],
}


def child(name):
    import numpy as np
    tmp = Path(tempfile.mkdtemp())
    shutil.copytree(ROOT / "shaders", tmp / "shaders")
    patches, host = ABL[name] if isinstance(ABL[name], tuple) else (ABL[name], "")
    for f, a, b in patches:
        p = tmp / "shaders" / f
        s = p.read_text()
        assert a in s, (name, a)
        p.write_text(s.replace(a, b))
    from dsv4_vk.vk import shader
    shader.shader_dir = lambda: tmp / "shaders"
    shader.SHADER_DIR = tmp / "shaders"
    exec(host)
    from dsv4_vk.hc import cases as C
    from dsv4_vk.cli import floor as F
    from dsv4_vk.cli.bench import bench_path, dispatch_times
    from dsv4_vk.vk import default_device
    dev = default_device()
    rng = np.random.default_rng(0)
    out = {"name": name}
    with F.ClockWarmer(dev, 500) as warm:
        for op, path in [("HC_SITE", C.SITE)] + ([("HC_PRE", "fused"), ("HC_POST", "fused"), ("HC_COMB", None), ("HC_SITE", C.THREE_OP)] if name == "base" else []):
            case = C.Case(op, 1, 4096)
            if path is None:
                path = [p for p in C.paths(dev, op) if p.startswith("fused")][0]
            inputs = C.make_inputs(case, rng)
            r1 = bench_path(dev, case, path, inputs, 30, 1, warm)
            r8 = bench_path(dev, case, path, inputs, 30, 8, warm)
            parts = dispatch_times(dev, case, path, inputs, 30, warm)
            out[f"{op}:{path}"] = {"rep1": r1["gpu_us"], "rep8": r8["gpu_us"], "parts": parts}
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        sys.exit()
    names = sys.argv[1:] or list(ABL)
    unknown = [n for n in names if n not in ABL]
    if unknown:
        sys.exit(f"unknown ablation(s) {unknown}: expected names from {list(ABL)}")
    res = []
    for name in names:
        p = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True, timeout=120)
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        try:
            d = json.loads(line)
        except Exception:
            print(name, "FAILED", p.stderr[-1500:], flush=True)
            continue
        res.append(d)
        for k, v in d.items():
            if k != "name":
                print(f"{name:18s} {k:22s} rep1 {v['rep1']:6.1f}  rep8 {v['rep8']:6.1f}  parts " +
                      ", ".join(f"{l} {u:.1f}" for l, u in v["parts"]), flush=True)
    if os.environ.get("OUT"):
        json.dump(res, open(os.path.join(os.environ["OUT"], "ablate_site.json"), "w"), indent=1)
