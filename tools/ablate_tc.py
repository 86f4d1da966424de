"""What bounds the tensor-core mixes kernel (HC_MIX_PART tc = 1) on a GPU: `tools/hc_tune.py --ops HC_MIX
--t 4096 --d 4096 --set mix.kernel=tc --per-dispatch` run once per ablation, each in a subprocess of
its own with a copy of shaders/ whose lines are replaced (results wrong on purpose: only the time is
read): nomma (no cooperative-matrix products: loads, staging, epilogue only), cheapsplit (hi = v·σ
unrounded: the split's arithmetic left out), noxload (X not read: the token index staged), and
nomma_cheap (both of the first two); for TCX (mix.kernel=tcx, x loaded from memory as fp32 matrices)
x_base, x_nomma, x_nosplit (the element-wise split left out), x_noload (x not read), x_nosplit_noload,
x_mma_only (neither, and fn's matrices not loaded from shared memory) and x_skeleton (no products either).

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; python3 tools/ablate_tc.py [NAME ...]
"""
from ablation import line_reporter, main, run_tool

NOMMA = [("hc_mix.comp", f"                {acc} = coopMatMulAddNV({a}, {b}, {acc});", "")
         for acc, a, b in (("c1[n]", "ah", "bh"), ("c2[n]", "ah", "bl"), ("c2[n]", "al", "bh"))]
CHEAP = [("hc_mix.comp", "    return mix(normal, sub, lessThan(abs(a), vec4(1.0 / 16384.0)));", "    return a;")]
# TCX (mix.kernel=tcx: x loaded from memory as fp32 matrices): its products, its element-wise split, its loads
X_NOMMA = [("hc_mix.comp", f"                    c{k}[i * NT + n] = coopMatMulAddNV({a}[i], {b}, c{k}[i * NT + n]);", "")
           for k, a, b in ((1, "ah", "bh"), (2, "ah", "bl"), (2, "al", "bh"))]
X_NOSPLIT = [("hc_mix.comp", "                [[unroll]] for (int e = 0; e < a.length(); ++e) {",
              "                [[unroll]] for (int e = 0; e < 0; ++e) {")]
X_CONSTB = [("hc_mix.comp", "                coopMatLoadNV(bh, fh, n * CM_N * FS + kk, FS, true);",
             "                bh = fcoopmatNV<16, gl_ScopeSubgroup, 16, CM_N>(float16_t(kk));"),
            ("hc_mix.comp", "                coopMatLoadNV(bl, fl, n * CM_N * FS + kk, FS, true);",
             "                bl = fcoopmatNV<16, gl_ScopeSubgroup, 16, CM_N>(float16_t(n));")]
X_NOEPI = [("hc_mix.comp", "            out_[p.o_off + t * p.o_st + split * p.o_s2 + j] = o;\n        }\n        subgroupMemoryBarrierShared();",
            "        }\n        subgroupMemoryBarrierShared();")]
X_NOSTAGE = [("hc_mix.comp", "        stage_f(j * FS + 4u * q, v, 1.0);", "")]
X_NOCONV = [("hc_mix.comp", "                ah[i] = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(h);",
             "                ah[i] = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(float16_t(i));"),
            ("hc_mix.comp", "                al[i] = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(l);",
             "                al[i] = fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(float16_t(xo));")]
X_NOLOAD = [("hc_mix.comp", "                coopMatLoadNV(a, xf, xb[i] + xo, xst, false);",
             "                a = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(float(xo));")]
ABL = {
    "base": [],
    "nomma": NOMMA,
    "cheapsplit": CHEAP,
    "noxload": [("hc_mix.comp", "vec4 v = live ? x[p.x_off + t * p.x_st + s * p.x_ss + c] : vec4(0.0);",
                 "vec4 v = vec4(float(t));")],
    "nomma_cheap": NOMMA + CHEAP,
    "x_base": [],
    "x_nomma": X_NOMMA,
    "x_nosplit": X_NOSPLIT,
    "x_noload": X_NOLOAD,
    "x_nosplit_noload": X_NOSPLIT + X_NOLOAD,
    "x_mma_only": X_NOSPLIT + X_NOLOAD + X_CONSTB,
    "x_skeleton": X_NOSPLIT + X_NOLOAD + X_CONSTB + X_NOMMA,
    "x_loadonly": X_NOSPLIT + X_CONSTB + X_NOMMA,
    "x_sk_noepi": X_NOSPLIT + X_NOLOAD + X_CONSTB + X_NOMMA + X_NOEPI,
    "x_sk_nostage": X_NOSPLIT + X_NOLOAD + X_CONSTB + X_NOMMA + X_NOSTAGE,
    "x_sk_noconv": X_NOSPLIT + X_NOLOAD + X_CONSTB + X_NOMMA + X_NOCONV,
    "x_sk_none": X_NOSPLIT + X_NOLOAD + X_CONSTB + X_NOMMA + X_NOEPI + X_NOSTAGE + X_NOCONV,
}


def child(name, flags):
    kernel = "tcx" if name.startswith("x_") else "tc"
    run_tool("hc_tune.py", ["--ops", "HC_MIX", "--t", "4096", "--d", "4096", "--set", f"mix.kernel={kernel}",
                            "--per-dispatch", *flags])


report = line_reporter(["HC_MIX"])


if __name__ == "__main__":
    main(__file__, ABL, child, report)
