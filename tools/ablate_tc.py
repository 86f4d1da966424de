"""What bounds the tensor-core mixes kernel (HC_MIX_PART tc = 1) on a GPU: `tools/hc_tune.py --ops HC_MIX
--t 4096 --d 4096 --set mix.kernel=tc --per-dispatch` run once per ablation, each in a subprocess of
its own with a copy of shaders/ whose lines are replaced (results wrong on purpose: only the time is
read): nomma (no cooperative-matrix products: loads, staging, epilogue only), cheapsplit (hi = v·σ
unrounded: the split's arithmetic left out), noxload (X not read: the token index staged), and
nomma_cheap (both of the first two).

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; python3 tools/ablate_tc.py [NAME ...]
"""
from ablation import line_reporter, main, run_tool

NOMMA = [("hc_mix.comp", f"                {acc} = coopMatMulAddNV({a}, {b}, {acc});", "")
         for acc, a, b in (("c1[n]", "ah", "bh"), ("c2[n]", "ah", "bl"), ("c2[n]", "al", "bh"))]
CHEAP = [("hc_mix.comp", "    hi = mix(normal, sub, lessThan(abs(a), vec4(1.0 / 16384.0)));", "    hi = a;")]
ABL = {
    "base": [],
    "nomma": NOMMA,
    "cheapsplit": CHEAP,
    "noxload": [("hc_mix.comp", "vec4 v = live ? x[p.x_off + t * p.x_st + s * p.x_ss + c] : vec4(0.0);",
                 "vec4 v = vec4(float(t));")],
    "nomma_cheap": NOMMA + CHEAP,
}


def child(name, flags):
    run_tool("hc_tune.py", ["--ops", "HC_MIX", "--t", "4096", "--d", "4096", "--set", "mix.kernel=tc",
                            "--per-dispatch", *flags])


report = line_reporter(["HC_MIX"])


if __name__ == "__main__":
    main(__file__, ABL, child, report)
