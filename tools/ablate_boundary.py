"""Where HC_POST_SITE's time goes (the layer boundary in one dispatch, hc_post.comp -D SITE_NEXT): its
boundary timed by tools/boundary_bench.py with parts of the kernel removed (tools/ablation.py: each
ablation a patched copy of shaders/ in a subprocess of its own; the results are wrong on purpose).

    . .vkdev/enter.sh; python3 tools/ablate_boundary.py [NAME ...] [--wg=256] [--d=4096]
"""
from ablation import line_reporter, main, run_tool

FENCE = "    memoryBarrierBuffer();                     // this invocation's stores before the count\n"
COUNT = "is_last = live && atomicAdd(count[t], 1u) == p.groups_per_token - 1u;"
SLICE_LAST = "is_last = live && g % p.groups_per_token == p.groups_per_token - 1u;"
TAIL = "    if (!is_last) return;                      // uniform: the workgroup's shared flag"
COL2 = "vec4 hc_col_sum4(vec4 v) { v += subgroupShuffleXor(v, 1u); return v + subgroupShuffleXor(v, 2u); }"
COL3 = ("vec4 hc_col_sum4(vec4 v) { vec4 a = subgroupShuffleXor(v, 1u), b = subgroupShuffleXor(v, 2u), "
        "c = subgroupShuffleXor(v, 3u); return (v + a) + (b + c); }")
ROW_DIV = "        c /= hc_hsum(c) + eps;\n"
ROW_RCP = "        c *= 1.0 / (hc_hsum(c) + eps);\n"
ABL = {
    "base": [],
    "no_tail": [("hc_post.comp", TAIL, "    return;")],                     # post, fence and count only
    "post_only": [("hc_post.comp", FENCE, ""), ("hc_post.comp", COUNT, "is_last = false;"),
                  ("hc_post.comp", TAIL, "    return;")],
    "no_count": [("hc_post.comp", COUNT, SLICE_LAST)],   # the last slice's workgroup runs the tail unsynchronised
    "no_fence": [("hc_post.comp", FENCE, "")],
    "no_sync": [("hc_post.comp", FENCE, ""), ("hc_post.comp", COUNT, SLICE_LAST)],
    "no_sink": [("hc_site.glsl", "hc_sinkhorn_rows4(l, eps, n_iter)", "l")],
    # the ROWS4 Sinkhorn's forms (HC_SITE's and the tail's alike): a column sum by three shuffles at
    # once (the same sums, bit for bit) instead of two rounds; the row step by one reciprocal
    "col3": [("hc_math.glsl", COL2, COL3)],
    "rowrcp": [("hc_math.glsl", ROW_DIV, ROW_RCP)],
    "col3_rowrcp": [("hc_math.glsl", COL2, COL3), ("hc_math.glsl", ROW_DIV, ROW_RCP)],
    "no_collapse": [("hc_post.comp", "u[t * p.n_chunks + c] = site_collapse(pre, xs[4u * k], xs[4u * k + 1u], xs[4u * k + 2u], "
                     "xs[4u * k + 3u]);", "u[t * p.n_chunks + c] = VEC(pre[0]);")],
}


def child(name, flags):
    args = [f.replace("=", " ").split() for f in flags]
    run_tool("boundary_bench.py", ["--rounds", "1", "--wg", "256"] + [x for a in args for x in a])


if __name__ == "__main__":
    main(__file__, ABL, child, line_reporter(["boundary", "two-dispatch"], 12))
