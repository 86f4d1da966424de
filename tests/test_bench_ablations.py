"""The benches' ablations (tools/ablation.py): each kernel timed again from a patched copy of shaders/.
Every ablation's texts are found once in the current sources, the patched kernels compile and differ
from the unpatched ones, the other kernels of the same shader stay as they are (the same SPIR-V), and
the benches run their ablations in child processes (on lavapipe, tiny shapes)."""
import importlib
import json
import os
import subprocess
import sys

import pytest

from dsv4_vk.vk import shader

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOLS = os.path.join(ROOT, "tools")


@pytest.fixture
def tools(monkeypatch):
    """import NAME of tools/ (they import tools/ablation.py as the scripts they are do)."""
    monkeypatch.syspath_prepend(TOOLS)
    return importlib.import_module


def staged(name):
    """The declared -D X_SHARED variants of shaders/NAME.comp (at one lane layout: the ablations do not
    touch the reductions)."""
    return [dict(v) for v in shader.declared_variants(name)
            if ("X_SHARED", "1") in v and not any(k.startswith("LANES_") for k, _ in v)]


def coopmat_id(quantised):
    """The declared GEMM variants of mul_mat_id_coopmat.comp (both modes, every weight format, NORM_X, CM_NV and
    not; not its -D X_ROWS pass) with FP8 / FP4 weights (True), or with float weights (False), or all (None)."""
    return [dict(v) for v in shader.declared_variants("mul_mat_id_coopmat") if ("X_ROWS", "1") not in v
            and (quantised is None or any(k in ("W_FP8", "W_FP4") for k, _ in v) == quantised)]


# (tool, its table, ablation -> {shader: variants it changes}, ablation -> {shader: variants it must leave alone})
GEMV = {"MODE_GEMV": 1, "VEC4": 1, "TB": 1}
ONE_TOKEN_ID = [{"MODE_SWIGLU": 1, "VEC4": 1, "W_FP4": 1, "NORM_X": 1}, {"MODE_SUM": 1, "ROUTES": 1, "VEC4": 1, "W_FP8": 1}]
CASES = {
    # (nonorm: the staged variants with the folded norm only, the others kept)
    "gemv": ("bench_gemv", "GEMV_ABLATIONS",
             lambda name: {"mul_mat": [v for v in staged("mul_mat") if name != "nonorm" or "NORM_X" in v]},
             lambda name: {"mul_mat": [{**GEMV, "W_FP8": 1}, {**GEMV, "W_FP4": 1, "NORM_X": 1}]
                           + ([v for v in staged("mul_mat") if "NORM_X" not in v] if name == "nonorm" else [])}),
    "moe": ("bench_moe", "MOE_ABLATIONS", lambda _: {"mul_mat_id": staged("mul_mat_id")},
            lambda _: {"mul_mat_id": ONE_TOKEN_ID, "mul_mat": [{**GEMV, "W_FP4": 1}]}),
    # the prefill's grouped GEMM on the matrix units: every variant (nowscan: those with a scale scan)
    "moe_prefill": ("bench_moe", "MOE_PREFILL_ABLATIONS",
                    lambda name: {"mul_mat_id_coopmat": coopmat_id(True if name == "nowscan" else None)},
                    lambda name: {"mul_mat_id_coopmat": (coopmat_id(False) if name == "nowscan" else [])
                                  + [{"X_ROWS": 1}, {"X_ROWS": 1, "NORM_X": 1}],
                                  "mul_mat_id_grouped": [{"MODE_SWIGLU": 1, "NORM_X": 1, "W_BF16": 1}],
                                  "mul_mat_id": ONE_TOKEN_ID, "mul_mat_coopmat": [{"W_BF16": 1, "CM_NV": 1, "VEC8": 1}]}),
    "primitives": ("bench_primitives", "COOPMAT_ABLATIONS",
                   lambda _: {"mul_mat_coopmat": [{"W_BF16": 1, "CM_NV": 1, "VEC8": 1}]},
                   lambda _: {"mul_mat": [{**GEMV, "W_FP8": 1}], "mul_mat_id_coopmat": coopmat_id(None)[:2]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ablations_change_their_kernels_only(case, tools, monkeypatch, tmp_path):
    ablation = tools("ablation")
    tool, table_name, changed_by, kept_by = CASES[case]
    table = getattr(tools(tool), table_name)
    original = {}
    for name, edits in table.items():
        changed, kept = changed_by(name), kept_by(name)
        assert all(changed.values()), (name, changed)
        for n, ds in [*changed.items(), *kept.items()]:
            for d in ds:
                if (n, repr(d)) not in original:
                    original[(n, repr(d))] = shader.compile_shader(n, d)
        tmp = ablation.patched_shaders(name, edits, tmp_path / name)
        with monkeypatch.context() as m:
            m.setattr(shader, "shader_dir", lambda: tmp)
            for n, ds in changed.items():
                for d in ds:
                    assert shader.compile_shader(n, d) != original[(n, repr(d))], (name, n, d)
            for n, ds in kept.items():
                for d in ds:
                    assert shader.compile_shader(n, d) == original[(n, repr(d))], (name, n, d)


def test_an_edit_that_no_longer_matches_names_its_file_and_text(tools, tmp_path):
    ablation = tools("ablation")
    with pytest.raises(SystemExit, match=r"ablation gone: weights.glsl holds 'no such line' 0 times, not once"):
        ablation.patched_shaders("gone", [("weights.glsl", "no such line", "")], tmp_path)
    with pytest.raises(SystemExit, match=r"mul_mat.comp holds 'barrier\(\);' \d+ times"):
        ablation.patched_shaders("twice", [("mul_mat.comp", "barrier();", "")], tmp_path / "b")


@pytest.mark.parametrize("tool, argv, why", [
    ("bench_gemv", ["--ablate", "nox,bogus", "--formats", "fp8", "--x-shared", "1"],
     r"--ablate: unknown ablation\(s\) \['bogus'\]; expected names from \['nocvt', 'nodecode', 'nox', 'nofma', 'noload', 'nonorm', 'nostage'\]"),
    ("bench_gemv", ["--ablate", "nox", "--formats", "bf16,fp8"], r"needs --formats fp8 and/or fp4 and --x-shared 1"),
    ("bench_moe", ["--ablate", "nostage,nomma", "--formats", "fp4", "--x-shared", "1"],
     r"--ablate: unknown ablation\(s\) \['nomma'\]; expected names from \['nocvt', 'nodecode', 'nox', 'nofma', 'noload', 'nostage'\]"),
    ("bench_moe", ["--ablate", "nox", "--formats", "fp4", "--x-shared", "1", "--prefill", "16", "--cm-tiles", "default"],
     r"--ablate: unknown ablation\(s\) \['nox'\]; expected names from \['nomma', 'nostage', 'noload', 'noscan', 'nowscan'\]"),
    ("bench_moe", ["--ablate", "nomma", "--prefill", "16", "--emulate"],
     r"--ablate with --prefill times the matrix-unit rows again: it needs --cm-tiles .* got --cm-tiles None"),
    ("bench_moe", ["--ablate", "nomma", "--prefill", "16", "--cm-tiles", "default", "--prefill-kernels", "grouped"],
     r"and coopmat in --prefill-kernels; got --cm-tiles default --prefill-kernels grouped"),
    ("bench_moe", ["--shared-fp8", "--formats", "fp4,fp8"],
     r"--shared-fp8 .* it needs --formats fp4, no --prefill, --experts ≥ 2 and --routes-per-token ≥ 2; got --formats fp4,fp8"),
    ("bench_moe", ["--prefill", "16", "--prefill-kernels", "grouped,mma"],
     r"--prefill-kernels: unknown kernel\(s\) \['mma'\]; expected names from per_route, grouped, coopmat"),
    ("bench_primitives", ["--gemm", "--coopmat-ablate", "nox"],
     r"--coopmat-ablate: unknown ablation\(s\) \['nox'\]; expected names from \['nomma', 'nostage', 'noload'\]"),
])
def test_bad_ablations_are_refused_before_the_device_starts(tool, argv, why, tools, monkeypatch):
    module = tools(tool)
    for where in ("default_device", "Executor"):
        if hasattr(module, where):
            monkeypatch.setattr(module, where, lambda *a, **k: pytest.fail("the device was started"))
    with pytest.raises(SystemExit, match=why):
        module.main(argv)


def test_cm_tiles_take_default_for_the_knobs_tiling(tools):
    assert tools("bench_moe").cm_tile_knobs("default;16x64x16x32x32x2") == [
        {}, {"tokens": 16, "outputs": 64, "warp_tokens": 16, "warp_outputs": 32, "k_step": 32, "output_tiles": 2}]
    assert tools("bench_moe").cm_tile_knobs(None) == [{}]


def test_prefill_ablations_without_the_matrix_units_need_emulate(tools):
    with pytest.raises(SystemExit, match=r"--ablate with --prefill times the matrix-unit rows again, but .* has none "
                                         r"\(.*\): --emulate times their FMA twin"):
        tools("bench_moe").main(["--ablate", "nomma", "--prefill", "16", "--cm-tiles", "default", "--warm-ms", "0"])


@pytest.mark.parametrize("tool, argv, names, ablated", [
    ("bench_gemv", ["--formats", "fp8", "--shapes", "wkv", "--x-shared", "0,1", "--xs-rows", "-1", "--spread", "0",
                    "--unroll", "1"],
     ["nodecode", "noload"], lambda row: row["x_shared"]),
    ("bench_moe", ["--formats", "bf16,fp4", "--experts", "3", "--routes-per-token", "2", "--d", "128", "--f", "64",
                   "--x-shared", "0,1", "--unroll", "2", "--routes", "1", "--wg", "0", "--cold"], ["nox", "nostage"],
     lambda row: row["staged"]),
    # the model's layout: FP4 routed experts and the FP8 shared one, the new staged knobs swept, results checked
    ("bench_moe", ["--formats", "fp4", "--shared-fp8", "--experts", "5", "--routes-per-token", "3", "--d", "256", "--f",
                   "64", "--x-shared", "0,1", "--unroll", "1", "--routes", "1", "--wg", "0", "--cold", "--xs-unroll", "1",
                   "--xs-route-groups", "1,2", "--xs-heavy", "1", "--xs-lanes", "0,2"], ["nox", "nostage"],
     lambda row: row["staged"]),
    # the prefill's matrix-unit rows (their FMA twin here, at the tiling asked), the per-route and f32 grouped
    # rows not again
    ("bench_moe", ["--prefill", "32", "--emulate", "--cm-tiles", "16x64x16x32x32", "--formats", "fp4+fp8", "--experts", "5",
                   "--routes-per-token", "3", "--d", "256", "--f", "128"],
     ["nomma", "nostage", "noload", "noscan", "nowscan"],
     lambda row: row["kernel"] == "coopmat_fma" and row["tiling"].startswith("16x64x16x32x32x")),
])
def test_bench_ablate_dry_run(tool, argv, names, ablated, tmp_path):
    """The ablations' rows: the parent's ablated rows again (same knobs, --cold passed on), one child each."""
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, f"tools/{tool}.py", *argv, "--replays", "1", "--repeat", "1", "--warm-ms", "0",
                        "--ablate", ",".join(names), "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    parent = [row for row in doc["rows"] if ablated(row)]
    assert parent and len(parent) < len(doc["rows"])
    if tool == "bench_moe" and "--prefill" not in argv:     # each one-token row beside reading its bytes alone
        assert all(row["read_us"] > 0 and row["pct_read"] == pytest.approx(100 * row["read_us"] / row["us"])
                   for row in doc["rows"]), doc["rows"]
    if "--shared-fp8" in argv:              # every row checked against float64, the shared route last
        assert doc["shared_fp8"] and doc["route_sets"] == 2 and all(row["nmse"] <= 1e-8 for row in doc["rows"]), doc
        assert {row.get("route_groups_used") for row in parent} == {None, 1, 2}, parent
    if tool == "bench_gemv":                # --xs-rows -1: the knob's default, 1 row a cluster at wkv's N = 512
        assert all(row["xs_rows"] == 1 for row in parent), parent
        # each row beside the time of reading the same bytes alone (floor.read_us)
        assert all(row["read_us"] > 0 and row["pct_read"] == pytest.approx(100 * row["read_us"] / row["us"])
                   for row in doc["rows"]), doc["rows"]
        assert sum(line.startswith("read fp8  wkv ") for line in r.stdout.splitlines()) == 1, r.stdout
    skip = {"us", "gbps", "pct_copy", "ms", "tflops", "nmse", "read_us", "pct_read"}
    assert list(doc["ablations"]) == names
    for name in names:
        child = doc["ablations"][name]
        assert child["cold"] == doc["cold"], name
        assert [{k: v for k, v in row.items() if k not in skip} for row in child["rows"]] == \
               [{k: v for k, v in row.items() if k not in skip} for row in parent], name
        assert sum(line.startswith(f"ablation {name} ") for line in r.stdout.splitlines()) == len(parent), r.stdout
