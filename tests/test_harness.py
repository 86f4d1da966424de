"""The eval / bench harnesses, the device floor and profiling.

The eval sweep runs at lavapipe subgroup sizes 4, 8 and 16, each in a subprocess (the size is fixed
when the process creates its Vulkan instance). Speed is not asserted anywhere: only that the
numbers exist, are sane and count what they claim to count.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dsv4_vk import Executor, Graph
from dsv4_vk.cli import bench, floor
from dsv4_vk.cli import eval as evaluate
from dsv4_vk.core import profile
from dsv4_vk.hc import cases

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^(HC_\w+ T=\d+.*?)\s+(fused:\w+|fused|unfused|three-op)\s+(PASS|FAIL)\b")


def _python(args, **env):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


# --- eval --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width,subgroup", [(128, 4), (256, 8), (512, 16)])
def test_eval_quick_passes_at_subgroup_size(width, subgroup):
    r = _python(["-m", "dsv4_vk", "eval", "--quick"], LP_NATIVE_VECTOR_WIDTH=str(width))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert f"subgroup size {subgroup}," in lines[0]
    rows = [ROW.match(ln) for ln in lines if ln.startswith("HC_")]
    assert rows and all(rows), "unparsed result line"
    assert {m.group(3) for m in rows} == {"PASS"}
    paths = {m.group(2) for m in rows}
    # the 16-lane kernel must run where the subgroup has 16 lanes, and never where it has fewer
    assert ("fused:sg16" in paths) == (subgroup >= 16)
    assert {"fused:rows4", "fused", "unfused", "fused:site", "three-op"} <= paths
    ops = {m.group(1).split()[0] for m in rows}
    assert ops == set(cases.OPS)
    assert re.search(rf"# {len(rows)} passed, 0 failed .*subgroup size {subgroup}\)", lines[-1])


def test_eval_cases_cover_spec_and_device_boundaries(device):
    full = cases.eval_cases(device)
    names = {c.name for c in full}
    for T, n in ((1, 1), (17, 4), (257, 8), (17, 20), (513, 20), (2048, 20)):
        assert f"HC_COMB T={T} n_iter={n}" in names
    for D, T in ((1, 1), (31, 17), (128, 257), (4096, 21)):
        assert f"HC_PRE T={T} D={D}" in names and f"HC_POST T={T} D={D}" in names
    sg = device.subgroup_size
    assert {f"HC_COMB T={sg // 4 + 1} n_iter=20", f"HC_COMB T={sg + 1} n_iter=20"} <= names
    assert any(c.peaked for c in full) and any(c.T == 0 for c in full)
    assert any(c.T > 65535 * 16 for c in full if c.op == "HC_COMB")       # grid folded into y
    assert len(cases.eval_cases(device, quick=True)) < len(full)


def _tampered_run(kind):
    """cases.run_path with the fused path's result or guards corrupted in one way."""
    real = cases.run_path

    def run(device, case, path, inputs):
        out, guards, n = real(device, case, path, inputs)
        if path != cases.UNFUSED:
            k = next(iter(out))
            a = out[k]
            if kind == "offset":          # one element off by 1e-3: max-abs must catch it
                a.reshape(-1)[0] += 1e-3
            elif kind == "scale":         # every element 1% off: NMSE must catch it
                out[k] = a * 1.01
            elif kind == "nan":
                a.reshape(-1)[-1] = np.nan
            elif kind == "guards":
                guards = ["out"]
        return out, guards, n
    return run


@pytest.mark.parametrize("kind", ["offset", "scale", "nan", "guards"])
def test_eval_fails_on_wrong_results(monkeypatch, capsys, kind):
    monkeypatch.setattr(cases, "run_path", _tampered_run(kind))
    rc = evaluate.main(["--op", "HC_POST", "--filter", "^HC_POST T=17 D=31$", "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == 1
    assert re.search(r"HC_POST T=17 D=31\s+unfused\s+PASS", out)
    assert re.search(r"HC_POST T=17 D=31\s+fused\s+FAIL", out)
    assert "# 1 passed, 1 failed" in out


def test_eval_json_list_and_argument_errors(tmp_path, capsys):
    path = tmp_path / "eval.json"
    assert evaluate.main(["--op", "HC_COMB,HC_PRE", "--filter", "T=(0|17) ", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["failed"] == 0 and doc["passed"] == len(doc["results"]) > 0
    assert {r["op"] for r in doc["results"]} == {"HC_COMB", "HC_PRE"}
    empty = [r for r in doc["results"] if r["T"] == 0]
    assert empty and all(r["pass"] and (r["note"].startswith("rejected: ") or r["note"] == "empty result")
                         for r in empty)
    timed = [r for r in doc["results"] if r["T"] and r["path"] != cases.UNFUSED]
    assert all(r["nmse_unfused"] <= evaluate.NMSE_MAX for r in timed)
    capsys.readouterr()
    assert evaluate.main(["--list", "--op", "HC_POST", "--quick"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed and all(ln.startswith("HC_POST ") for ln in listed)
    assert evaluate.main(["--filter", "no such case"]) == 2
    for bad in (["--op", "HC_FOO"], ["--filter", "("]):
        with pytest.raises(SystemExit) as e:
            evaluate.main(bad)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "HC_FOO" in err and "HC_COMB, HC_PRE, HC_POST, HC_STEP, HC_SITE_PRE" in err and "regular expression" in err


# --- floor -------------------------------------------------------------------------------------------

def test_floor_functions_on_tiny_sizes(device):
    f = floor.measure(device, chain=8, copy_bytes=64 << 10, replays=2, record_n=50)
    for k in ("dispatch_barrier_us", "dispatch_nobarrier_us", "submit_wait_us", "record_us_per_dispatch",
              "copy_gbps"):
        assert np.isfinite(f[k]) and f[k] > 0, k
    assert f["subgroup_size"] == device.subgroup_size and f["copy_bytes"] == 64 << 10
    assert "copy bandwidth" in floor.format_floor(f)
    assert set(f["float_edges"].values()) <= {"kept", "flushed"} and len(f["float_edges"]) == 5
    assert "subnormals (no float mode)  f32 subnormal results " in floor.format_floor(f)
    limit = device.caps.limits.max_storage_buffer_range
    for bad in (100, 0, limit + 16):
        with pytest.raises(ValueError, match="copy_bytes"):
            floor.copy_gbps(device, bad)
    with pytest.raises(ValueError, match="n ≥ 1"):
        floor.dispatch_chain_us(device, 0)
    t = floor.read_us(device, 64 << 10, copies=2, replays=2, repeat=1)
    assert np.isfinite(t) and t > 0
    for bad in ((100, 1), (0, 1), (64 << 10, 0)):
        with pytest.raises(ValueError, match="read_us: nbytes must be a positive multiple of 16"):
            floor.read_us(device, *bad)


def test_float_edges_refuse_arithmetic_ieee_754_does_not_allow(device, monkeypatch):
    """Each subnormal edge reads back as the exact value (kept) or the flushed one; anything else is an
    error naming the edge, not a silent 'kept' or 'flushed'."""
    edges = floor.float_edges(device)
    assert list(edges) == [e[0] for e in floor._FLOAT_EDGES]
    bad = [(n, i, exact * 3, flushed * 3 + 1.0) for n, i, exact, flushed in floor._FLOAT_EDGES]
    monkeypatch.setattr(floor, "_FLOAT_EDGES", tuple(bad))
    with pytest.raises(RuntimeError, match="f32_subnormal_results gave .* expected .* \\(kept\\) or .* \\(flushed\\)"):
        floor.float_edges(device)


def test_clock_warmup_keeps_the_device_busy_for_its_time(device, capsys):
    """ClockWarmer submits its load back to back for `ms` and frees its scratch memory; ms = 0 is a
    no-op; the floor and bench record the setting; a negative --warm-ms is refused."""
    with floor.ClockWarmer(device, 0) as w0:
        t0 = time.perf_counter()
        w0()
        assert time.perf_counter() - t0 < 0.01 and w0._rec is None
    with floor.ClockWarmer(device, 40, nbytes=1 << 20, copies=2) as w:
        before = w._rec.n_submits
        t0 = time.perf_counter()
        w()
        assert time.perf_counter() - t0 >= 0.04 and w._rec.n_submits > before
    assert w._rec is None and w._bufs == []
    assert floor.default_warm_ms(device) == (0 if device.caps.type == "cpu" else 500)
    f = floor.measure(device, chain=4, copy_bytes=64 << 10, replays=2, record_n=10, warm_ms=5)
    assert f["warm_ms"] == 5 and "clock warm-up" in floor.format_floor(f)
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--warm-ms", "-1"])
    assert "--warm-ms must be ≥ 0" in capsys.readouterr().err


def test_recorder_ends_only_timestamps(device):
    """timestamps="ends": one timestamp before and one after the whole recording, none in between."""
    from dsv4_vk.vk import Buffer, Recorder, pack_push
    pipe = device.pipelines.get("floor", 1, {"OP_STEP": 1}, (1,))
    buf = Buffer(device, 64)
    buf.write(np.zeros(16, np.float32))
    rec = Recorder(device, timestamps="ends")
    for i in range(5):
        rec.dispatch(pipe, [buf], pack_push(i, i + 1), (1, 1, 1), [(buf, 4 * i, 4 * i + 4)],
                     [(buf, 4 * i + 4, 4 * i + 8)])
    r = rec.finish()
    r.submit()
    ts = r.timestamps_ns()
    assert len(ts) == 2 and ts[1] > ts[0] and r.n_dispatches == 5 and r.n_barriers == 4
    assert buf.read(20, 4).view(np.float32)[0] == 5.0
    r.destroy()
    device.pipelines.forget_buffer(buf)
    buf.destroy()


def test_floor_cli_writes_json(tmp_path):
    out = tmp_path / "floor.json"
    r = _python(["-m", "dsv4_vk", "floor", "--chain", "8", "--copy-mib", "0.25", "--replays", "2", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    assert "dependent dispatch+barrier" in r.stdout
    assert json.loads(out.read_text())["copy_bytes"] == 1 << 18


# --- bench -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    assert bench.main(["--quick", "--d", "8,64", "--t", "16,32", "--copy-mib", "1", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_bench_quick_json_is_sane(bench_doc, device):
    doc = bench_doc
    assert doc["subgroup_size"] == device.subgroup_size and doc["replays"] >= 10
    assert doc["floor"]["dispatch_barrier_us"] > 0 and doc["floor"]["copy_gbps"] > 0
    assert doc["floor"]["copy_bytes"] == 1 << 20 and doc["floor"]["chain"] == 64
    rows = doc["rows"]
    assert not [r for r in rows if r["error"]]
    assert {r["section"] for r in rows} == {"decode", "prefill"}
    assert {r["T"] for r in rows if r["section"] == "prefill"} == {16}          # --quick: smallest T only
    for op in cases.OPS:
        want = set(cases.paths(device, op))
        for T in (1, 16):
            for D in ((0,) if op == "HC_COMB" else (8, 64)):
                assert {r["path"] for r in rows if (r["op"], r["T"], r["D"]) == (op, T, D)} == want
    for r in rows:
        assert r["gpu_us"] > 0 and r["wall_us"] > 0 and r["record_us"] > 0 and r["gbps"] > 0
        case = cases.Case(r["op"], r["T"], r["D"])
        assert r["bytes"] == cases.io_bytes(case)
        # the dispatch count is the graph's: the launches its nodes lower to
        g = cases.build(case, r["path"], device)
        assert r["dispatches"] == sum(len(n.op.lower(n, device)) for n in g.nodes) >= len(g.nodes)
        if r["op"] in ("HC_COMB", "HC_PRE", "HC_POST") and r["path"] != cases.UNFUSED:
            assert r["dispatches"] == 1
    assert set(doc["summary"]["decode_ratio"]) == {"8", "64"}
    assert all(v["ratio"] > 1 for v in doc["summary"]["decode_ratio"].values())
    assert {v["op"] for v in doc["summary"]["prefill_copy_pct"].values()} == {"HC_PRE", "HC_POST"}


def test_bench_plot_from_saved_json(bench_doc, tmp_path, capsys):
    src, png = tmp_path / "b.json", tmp_path / "b.png"
    src.write_text(json.dumps(bench_doc))
    assert bench.main(["--plot-from", str(src), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## summary" in capsys.readouterr().out


def test_bench_plot_without_matplotlib_is_a_clear_error(bench_doc, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import matplotlib -> ImportError
    src = tmp_path / "b.json"
    src.write_text(json.dumps(bench_doc))
    assert bench.main(["--plot-from", str(src), "--plot", str(tmp_path / "b.png")]) == 2
    assert bench.main(["--plot", str(tmp_path / "c.png"), "--d", "8"]) == 2      # refused before benchmarking
    err = capsys.readouterr().err
    assert err.count("matplotlib") >= 2 and "pip install matplotlib" in err
    assert not (tmp_path / "b.png").exists()


# --- profile -----------------------------------------------------------------------------------------

def _tagged_graph(T=5, D=40):
    g = Graph()
    x = g.input("x", (T, D))
    with g.tag("first"):
        y = g.op("SCALE", x, a=2.0, b=1.0)
        y = g.op("EXP", y)
    g.output("z", g.op("ADD", y, x))
    return g


def test_profile_counts_match_the_graphs(device, rng):
    ex = Executor(device)
    g = _tagged_graph()
    hc_case = cases.Case("HC_COMB", 3)
    hc_graph = cases.build(hc_case, cases.UNFUSED, device)
    hc_inputs = cases.make_inputs(hc_case, rng)
    x = rng.uniform(-1, 1, (5, 40)).astype(np.float32)
    with profile.profile() as prof:
        with profile.phase("prefill"):
            ex.run(g, x=x)
            ex.run(hc_graph, hc_inputs)
            prefill = ex.last.stats
        with profile.phase("decode"):
            for _ in range(3):
                ex.run(g, x=x)
            small = ex.last.stats
    ex.run(g, x=x)                                  # outside: not counted
    d = prof.as_dict()
    assert list(d["phases"]) == ["prefill", "decode"]
    dec, pre = d["phases"]["decode"], d["phases"]["prefill"]
    assert dec["runs"] == dec["submits"] == 3
    assert dec["dispatches"] == 3 * len(g.nodes) == 3 * small.dispatches
    assert dec["barriers"] == 3 * small.barriers
    assert {k: v["dispatches"] for k, v in dec["ops"].items()} == {"first": 6, "ADD": 3}
    assert pre["dispatches"] == len(g.nodes) + len(hc_graph.nodes)
    assert pre["ops"]["HC_COMB"]["dispatches"] == len(hc_graph.nodes) == prefill.dispatches
    assert all(v["gpu_ms"] > 0 for ph in d["phases"].values() for v in ph["ops"].values())
    assert d["total"]["dispatches"] == pre["dispatches"] + dec["dispatches"]
    assert abs(d["total"]["gpu_ms"] - pre["gpu_ms"] - dec["gpu_ms"]) < 1e-9
    table = prof.table()
    assert re.search(r"^decode\s+first\s+6\s+2\.0\s", table, re.M)
    assert re.search(r"^prefill\s+HC_COMB\s+141\s", table, re.M)
    assert "runs 3, submits 3" in table
    with pytest.raises(ValueError, match="phase name"):
        with profile.phase(""):
            pass


def test_profile_env_prints_table_at_exit():
    code = ("import numpy as np\n"
            "from dsv4_vk import Executor, Graph\n"
            "from dsv4_vk.core import profile\n"
            "g = Graph(); x = g.input('x', (3, 7)); g.output('y', g.op('SIGMOID', g.op('EXP', x)))\n"
            "ex = Executor()\n"
            "with profile.phase('decode'):\n"
            "    for _ in range(2): ex.run(g, x=np.ones((3, 7)))\n")
    r = _python(["-c", code], DSV4_VK_PROFILE="1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^decode\s+EXP\s+2\s+1\.0\s", r.stderr, re.M)
    assert re.search(r"^decode\s+total\s+4\s+2\.0\s.*runs 2, submits 2, barriers 2", r.stderr, re.M)


# --- command-line errors -------------------------------------------------------------------------------

CLI_ERRORS = [  # (argv, what the one error line says)
    (["demo", "--temperature", "-1"], "--temperature must be a finite number ≥ 0, got -1.0"),
    (["demo", "--top-k", "1000"], "--top-k must be from 1 to 64, got 1000"),
    (["demo", "--tokens", "many"], "argument --tokens: invalid int value: 'many'"),
    (["demo", "--checkpoint", "/nonexistent"], "'/nonexistent' does not exist"),
    (["bench", "--seed", "-1"], "--seed must be ≥ 0, got -1"),
    (["floor", "--copy-mib", "-1"], "--copy-mib must be a number > 0, got -1.0"),
    (["--device", "7", "info"], "--device=7 but only"),
    (["info", "--device", "²"], "--device='²' matches no device name"),
    (["info", "--device", "9" * 5000], "but only"),
    (["floor", "--chain", "4", "--replays", "1", "--copy-mib", "0.25", "--out", "/nonexistent/floor.json"],
     "/nonexistent/floor.json: No such file or directory"),
    (["floor", "--chain", "4", "--replays", "1", "--copy-mib", "0.25", "--out", "{tmp}/loop"],
     "/loop: a symbolic link loop"),
    (["bench", "--plot-from", "{tmp}/loop", "--plot", "{tmp}/p.png"], "/loop: a symbolic link loop"),
    (["demo", "--checkpoint", "{tmp}/loop"], "/loop' cannot be opened (a symbolic link loop"),
]


CLI_CHILD = """
import contextlib, io, json, sys
import dsv4_vk.vk.device
from dsv4_vk.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    dsv4_vk.vk.device._chosen = None                  # (each run as a fresh process would start)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    out.append([rc, err.getvalue()])
print(json.dumps(out))
"""


def test_cli_errors_are_one_line_and_a_nonzero_exit(tmp_path):
    """Every error is one `error:` line on stderr and a non-zero exit, never a traceback; a --device the
    user gave is named as such (not as DSV4_VK_DEVICE, which they never set). One child runs them all
    (DSV4_VK_DEVICE unset there), each through the console script's main."""
    env = {k: v for k, v in os.environ.items() if k != "DSV4_VK_DEVICE"}
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    argvs = [[a.format(tmp=tmp_path) for a in argv] for argv, _ in CLI_ERRORS]
    r = subprocess.run([sys.executable, "-c", CLI_CHILD, json.dumps(argvs)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for (argv, message), (rc, err) in zip(CLI_ERRORS, json.loads(r.stdout)):
        lines = err.strip().splitlines()
        assert rc != 0 and len(lines) == 1 and lines[0].startswith("error: "), (argv[:3], err[-2000:])
        assert message in lines[0] and "DSV4_VK_DEVICE" not in lines[0], (argv[:3], lines[0][:300])


def test_bench_exits_nonzero_when_a_row_failed(monkeypatch, capsys):
    real = bench.bench_path

    def failing(device, case, path, *a, **k):
        if path == cases.UNFUSED:
            raise RuntimeError("this path broke")
        return real(device, case, path, *a, **k)
    monkeypatch.setattr(bench, "bench_path", failing)
    argv = ["--quick", "--d", "8", "--op", "HC_COMB", "--no-prefill", "--copy-mib", "0.25"]
    assert bench.main(argv) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: 1 of \d+ rows failed; the first: decode HC_COMB T=1 D=0 unfused: "
                        r"RuntimeError: this path broke\n", err), err
    monkeypatch.setattr(bench, "bench_path", real)
    assert bench.main(argv) == 0


def test_h200_targets_are_judged_only_on_an_h200():
    summary = {"decode_ratio": {"4096": {"unfused_us": 10.0, "fused_us": 5.0, "ratio": 2.0}},
               "prefill_copy_pct": {"HC_PRE T=4096 D=4096": {"T": 4096, "D": 4096, "gbps": 1.0, "pct_of_copy": 1.0}},
               "site": {"decode": {"D=4096": {"path": "site", "gpu_us": 99.0, "dispatches": 2}},
                        "mix": {"T=512": {"gbps": 1.0, "pct_of_copy": 1.0}}}}
    on_h200 = bench.format_summary(summary, "NVIDIA H200")
    assert on_h200.count("NOT met") == 4
    elsewhere = bench.format_summary(summary, "llvmpipe (LLVM 15.0.6, 256 bits)")
    assert "NOT met" not in elsewhere and " met" not in elsewhere and elsewhere.count("not judged here") == 4
    assert "the targets are an H200's: not judged on llvmpipe" in elsewhere
