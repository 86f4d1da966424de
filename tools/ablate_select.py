"""Where INDEX_SCORE's decode time goes: `tools/bench_decode_ops.py --only select` (INDEX_SCORE, TOPK,
V4_ROUTE, SAMPLE at DeepSeek-V4-Flash widths) run once per ablation, each in a subprocess of its
own with a copy of shaders/ whose lines are replaced (results wrong on purpose: only the time is
read) or a layout knob set: nosum (no cluster sums), noq (no q loads), nowt (no head weights),
heads16, lanes8 / lanes4 (fewer lanes per key).

    . .vkdev/enter.sh; python3 tools/ablate_select.py [NAME ...] [--quick]
"""
from ablation import line_reporter, main, run_tool

ABL = {
    "base": ([], ""),
    "nosum": ([("index_score.comp", "d[j] = cluster_sum(d[j]);", "d[j] = d[j];")], ""),
    "noq": ([("index_score.comp", "d[j] += q[qb + c] * kr[m];", "d[j] += kr[m] * kr[m];")], ""),
    "nowt": ([("index_score.comp", "s += wt[p.w_off + t * p.w_s0 + h0 + j] * max(d[j], 0.0);", "s += max(d[j], 0.0);")], ""),
    "heads16": ([], "from dsv4_vk.ops import compress; compress.INDEX_HEADS['heads'] = 16"),
    "lanes8": ([], "from dsv4_vk.ops import compress as C, base as B\n"
                   "C.cluster_lanes = lambda dev, n, per_lane=4, max_lanes=None, _cl=B.cluster_lanes: _cl(dev, n, per_lane=16)"),
    "lanes4": ([], "from dsv4_vk.ops import compress as C, base as B\n"
                   "C.cluster_lanes = lambda dev, n, per_lane=4, max_lanes=None, _cl=B.cluster_lanes: _cl(dev, n, per_lane=32)"),
}


def child(name, flags):
    run_tool("bench_decode_ops.py", ["--only", "select", "--replays", "20", *flags])


report = line_reporter(["INDEX", "TOPK"], 8)


if __name__ == "__main__":
    main(__file__, ABL, child, report)
