"""What bounds the mixes kernels at prefill (HC_MIX_PART, T = 4096, D = 4096): `tools/hc_tune.py --ops
HC_MIX --t 4096 --d 4096 --set mix.kernel=ksplit --per-dispatch` run once per
ablation, each in a subprocess of its own with a copy of shaders/ whose lines are replaced (results
wrong on purpose: only the time is read):
- KSPLIT (the GPU default: 4 tokens a lane group, 2 row groups): base; nofnlds (the fn chunks not read from
  shared memory: made from their index, the products kept); noproducts (x read, only Σx² formed: no
  fn reads, no products); noxload (x not read: made from its index);
- the carrying post (HC_POST_MIX's KSPLIT form, timed inside the three-op site at prefill, `--ops
  HC_SITE --site-path three-op`: read its HC_POST column): carry (base); carry_nofnlds;
  carry_noproducts; carry_nopost (the new streams as residual + f: no post or comb read, no
  coefficient arithmetic; the loads and stores kept); carry_nostore (the new streams not written);
  carry_noxload (the residual not read).
If nofnlds is much faster than base, the products wait on shared-memory operands (each fn load
serves TPL products); if it is not, on the products themselves.

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; python3 tools/ablate_mix.py [NAME ...] [--t=T] [--d=D]
"""
from ablation import line_reporter, main, run_tool

F = "hc_mix.comp"
NOFNLDS = [(F, "#define FN(i) fs[i]", "#define FN(i) VEC(uintBitsToFloat(i))")]
NOXLOAD_A = [(F, "va[s] = x[xt[0] + s * p.x_ss + c];", "va[s] = VEC(float(c + s));")]   # (the carry: one token a group)
ABL = {
    "base": [],
    "nofnlds": NOFNLDS,
    "noproducts": [(F, "if (TPL > 2u) mixacc_add4(A, B, C, E, va[s], vb[s], vc[s], ve[s], row0 + s * S + c, 4u * S);",
                    "if (TPL > 2u) { A.ss += dot_v(va[s], va[s]); B.ss += dot_v(vb[s], vb[s]); "
                    "C.ss += dot_v(vc[s], vc[s]); E.ss += dot_v(ve[s], ve[s]); }")],
    "noxload": NOXLOAD_A + [
                (F, "if (TPL > 1u) vb[s] = x[xt[1] + s * p.x_ss + c];", "if (TPL > 1u) vb[s] = VEC(float(c));"),
                (F, "if (TPL > 2u) { vc[s] = x[xt[2] + s * p.x_ss + c]; ve[s] = x[xt[3] + s * p.x_ss + c]; }",
                 "if (TPL > 2u) { vc[s] = VEC(float(c + 1u)); ve[s] = VEC(float(c + 2u)); }")],
    "carry": [],
    "carry_nofnlds": NOFNLDS,
    "carry_noproducts": [(F, "else mixacc_add(A, va[s], row0 + s * S + c, 4u * S, true);",
                          "else A.ss += dot_v(va[s], va[s]);")],
    "carry_nopost": [(F, "r[d] = post_stream(fv, P.pw[d], P.cw[d], v[0], v[1], v[2], v[3]);", "r[d] = v[d] + fv;")],
    "carry_nostore": [(F, "    if (store) [[unroll]] for (uint d = 0u; d < 4u; ++d) xnew[", "    if (false) for (uint d = 0u; d < 4u; ++d) xnew[")],
    "carry_noxload": NOXLOAD_A,
}


def child(name, flags):
    if name.startswith("carry"):
        run_tool("hc_tune.py", ["--ops", "HC_SITE", "--t", "4096", "--d", "4096", "--site-path", "three-op",
                                "--set", "carry.prefill=1", "--per-dispatch", *flags])   # (one row, not a sweep)
        return
    run_tool("hc_tune.py", ["--ops", "HC_MIX", "--t", "4096", "--d", "4096", "--set", "mix.kernel=ksplit",
                            "--per-dispatch", *flags])


report = line_reporter(["HC_MIX", "HC_SITE"], 16)


if __name__ == "__main__":
    main(__file__, ABL, child, report)
