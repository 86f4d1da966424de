"""What bounds TCR (HC_MIX_TCR, the mixes on tensor cores from registers) on a GPU: `tools/hc_tune.py
--ops HC_MIX --t 4096 --d 4096 --set mix.kernel=tcr --set mix.tt=TT --per-dispatch` once per
ablation, each in a subprocess with a copy of shaders/ whose lines are replaced (results wrong on purpose:
only the time is read): nomma (no matrix products), cheapsplit (hi = v·σ: the split's rounding left out),
oldsplit (x split by split16's integer rounding, the form before tcr_split: correct, for comparison),
fnperj (fn's words loaded per 16-deep product: correct, a candidate), coal (each load instruction
reading 64 contiguous bytes of a token), fnsame (every workgroup reading the same fn words), part_t
(the partials stored split-major), noxload (X not read: the token index instead).

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; python3 tools/ablate_tcr.py [NAME ...] [--tt=2] [--t=4096] [--d=4096]
"""
from ablation import line_reporter, main, run_tool

NOMMA = [("hc_mix.comp", f"                        {acc} = coopMatMulAddNV({a}, {b}[n], {acc});", "")
         for acc, a, b in (("c1[tt][n]", "mh", "bh"), ("c2[tt][n]", "mh", "bl"), ("c2[tt][n]", "ml", "bh"))]
CHEAP = [("hc_mix.comp", "    vec4 hi = vec4(unpackHalf2x16(hb.x ^ p.zero), unpackHalf2x16(hb.y ^ p.zero));", "    vec4 hi = a;")]
# x split as before tcr_split (split16's integer rounding, then each part converted)
OLDSPLIT = [("hc_mix.comp", "void tcr_split(vec4 v, out uvec2 hb, out uvec2 lb) {\n", """void tcr_split(vec4 v, out uvec2 hb, out uvec2 lb) {
    vec4 h_, l_;
    split16(v, X_SIGMA, h_, l_);
    hb = uvec2(packHalf2x16(h_.xy), packHalf2x16(h_.zw));
    lb = uvec2(packHalf2x16(l_.xy), packHalf2x16(l_.zw));
    return;
""")]
# fn's words loaded per 16-deep product j (3 uvec4 live instead of 12: registers for more warps)
FNPERJ = [("hc_mix.comp", """            uvec4 fv[4][3];
            uint fb""", "            uint fb"),
          ("hc_mix.comp", """            [[unroll]] for (uint j = 0u; j < 4u; ++j) [[unroll]] for (uint n = 0u; n < 3u; ++n)
                fv[j][n] = fnp[fb + (j * 3u + n) * 32u];
""", ""),
          ("hc_mix.comp", "                    uvec4 b = fv[j][n];", "                    uvec4 b = fnp[fb + (j * 3u + n) * 32u];")]
# x read as chunk q + 4j (4 lanes of a token: 64 contiguous bytes per load) instead of 4q + j (fn's
# words left as they are: wrong values, the time of that access pattern)
COAL = [("hc_mix.comp", "            uint cb = c_begin + 16u * ss + 4u * q;", "            uint cb = c_begin + 16u * ss + q;"),
        ("hc_mix.comp", "                    vec4 v = x[xrow[tt][h] + s * p.x_ss + cb + j];",
         "                    vec4 v = x[xrow[tt][h] + s * p.x_ss + cb + 4u * j];")]
# every workgroup's fn words from the same step (6 KiB in every L1): what fn's traffic costs
FNSAME = [("hc_mix.comp", "            uint fb = p.f_off + (s * (p.chunks / 16u) + c_begin / 16u + ss) * 384u + lane;",
           "            uint fb = p.f_off + lane;")]
# partials stored [G, T, m+1] (a permuted view): TCR writes a workgroup's tokens contiguously, REDUCE's
# lanes read consecutive floats
PART_T = ([], """
import dsv4_vk.hc.mix_kernels as mk
plain = mk.mix_partials
def mix_partials(g, X, fn, layout):
    if not layout.get("tcr"):
        return plain(g, X, fn, layout)
    lay = {k: v for k, v in layout.items() if k != "tcr"}
    fw = g.op("HC_MIX_FN_SPLIT", fn, layout=lay["layout"])
    out = g.empty((lay["groups"], X.shape[0], fn.shape[0] + 1), "f32").permute(1, 0, 2)
    return g.op("HC_MIX_TCR", X, fw, m=fn.shape[0], out=out, **lay)
mk.mix_partials = mix_partials
""")
ABL = {
    "base": [],
    "nomma": NOMMA,
    "cheapsplit": CHEAP,
    "oldsplit": OLDSPLIT,
    "fnperj": FNPERJ,
    "coal": COAL,
    "fnsame": FNSAME,
    "part_t": PART_T,
    "noxload": [("hc_mix.comp", "                    vec4 v = x[xrow[tt][h] + s * p.x_ss + cb + j];",
                 "                    vec4 v = vec4(float(xrow[tt][h] + cb + j));")],
}


def child(name, flags):
    opt = {k: v for k, v in (f[2:].split("=", 1) for f in flags if f.startswith(("--tt=", "--t=", "--d=")))}
    rest = [f for f in flags if not f.startswith(("--tt=", "--t=", "--d="))]
    run_tool("hc_tune.py", ["--ops", "HC_MIX", "--t", opt.get("t", "4096"), "--d", opt.get("d", "4096"), "--set",
                            "mix.kernel=tcr", "--set", f"mix.tt={opt.get('tt', '1')}", "--per-dispatch", *rest])


report = line_reporter(["HC_MIX"])


if __name__ == "__main__":
    main(__file__, ABL, child, report)
