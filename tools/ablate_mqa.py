"""Where the tiled MQA_ATTENTION's decode time goes: `tools/bench_decode_ops.py --only mqa --kernels
tiled --splits 8` (each layer kind at DeepSeek-V4-Flash widths, 8 splits and the model's decode
choice; MQA_COMBINE included) run once per ablation, each in a subprocess of its own with a copy of
shaders/ whose lines are replaced (results wrong on purpose: only the time is read) or a layout knob
set: noload (keys not read: the staged values made from their index), nodot (no q·k products),
nosum (no cluster sums of the scores), noacc (no value accumulation), noq (q not read), tile16 /
tile4 (16 or 4 keys staged at a time instead of 8; results/h200/ablate_mqa_h200.txt ran at the then
default of 16, with a tile8 ablation instead of tile16).

    . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; python3 tools/ablate_mqa.py [NAME ...] [--quick]
"""
from ablation import line_reporter, main, run_tool

F = "mqa_attention.comp"
ABL = {
    "base": ([], ""),
    "noload": ([(F, "v[i] = (kflag[k] & 2u) != 0u ? kv[kbase[k] + c] : ent[kbase[k] + c];", "v[i] = float(c);")], ""),
    "nodot": ([(F, "d += qv[m] * ks[k * ROW + lane + LANES * m];", "d += qv[m];")], ""),
    "nosum": ([(F, "sc[k] = cluster_sum(sc[k]);", "sc[k] = sc[k];")], ""),
    "noacc": ([(F, "acc[m] += e * ks[k * ROW + lane + LANES * m];", "acc[m] += e;")], ""),
    "noq": ([(F, "qv[m] = c < p.hd ? q[qb + c] * p.scale : 0.0;", "qv[m] = p.scale;")], ""),
    "tile16": ([], "from dsv4_vk.ops import v4_attention; v4_attention.MQA_TILE['keys'] = 16"),
    "tile4": ([], "from dsv4_vk.ops import v4_attention; v4_attention.MQA_TILE['keys'] = 4"),
}


def child(name, flags):
    run_tool("bench_decode_ops.py", ["--only", "mqa", "--kernels", "tiled", "--splits", "8", "--replays", "20",
                                     *flags])


report = line_reporter(["MQA"], 7)


if __name__ == "__main__":
    main(__file__, ABL, child, report)
