"""Where INDEX_SCORE's decode time goes: `tools/bench_decode_ops.py --only select` (INDEX_SCORE, TOPK,
V4_ROUTE, SAMPLE at DeepSeek-V4-Flash widths) run once per ablation, each in a subprocess of its
own with a copy of shaders/ whose lines are replaced (results wrong on purpose: only the time is
read) or a layout knob set: nosum (no cluster sums), noq (no q loads), nowt (no head weights),
heads16, lanes8 / lanes4 (fewer lanes per key).

    . .vkdev/enter.sh; python3 tools/ablate_select.py [NAME ...] [--quick]
"""
import json, shutil, subprocess, sys, tempfile
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
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
def child(name):
    patches, host = ABL[name]
    tmp = Path(tempfile.mkdtemp())
    shutil.copytree(ROOT / "shaders", tmp / "shaders")
    for f, a, b in patches:
        p = tmp / "shaders" / f; s = p.read_text(); assert a in s, a; p.write_text(s.replace(a, b))
    from dsv4_vk.vk import shader
    shader.shader_dir = lambda: tmp / "shaders"; shader.SHADER_DIR = tmp / "shaders"
    exec(host)
    sys.argv = ["x", "--only", "select", "--replays", "20"] + (["--quick"] if "--quick" in sys.argv else [])
    import runpy
    runpy.run_path(str(ROOT / "tools" / "bench_decode_ops.py"), run_name="__main__")
if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2]); sys.exit()
    for name in [a for a in sys.argv[1:] if a != "--quick"] or ABL:
        p = subprocess.run([sys.executable, __file__, "--child", name] + (["--quick"] if "--quick" in sys.argv else []), capture_output=True, text=True)
        for line in p.stdout.splitlines():
            if line.startswith(("INDEX", "TOPK")):
                print(f"{name:8s} {line}", flush=True)
        if p.returncode:
            print(name, "FAILED", p.stderr[-800:])
