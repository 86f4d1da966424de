"""The hyper-connection ops: kernels at lavapipe subgroup sizes 4, 8 and 16 (each in its own process,
tests/hc_cases.py), the environment switches and the device contract, the numpy API's errors."""
import logging
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import dsv4_vk as dv
from dsv4_vk import Executor, Graph, hc
from dsv4_vk.hc import plan as hc_plan, policy as hc_policy, tcr
from dsv4_vk.hc.policy import HCUnsupported
from dsv4_vk.vk.caps import SubgroupCaps
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.hc.kernels import reference_comb, reference_post, reference_pre, reference_site_pre

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HC_ENV = ["DSV4_VK_DISABLE_HC", "DSV4_VK_DISABLE_HC_COMB", "DSV4_VK_DISABLE_HC_PRE", "DSV4_VK_DISABLE_HC_POST",
          "DSV4_VK_DISABLE_HC_SITE", "DSV4_VK_HC_COMB_VARIANT"]


@pytest.mark.parametrize("width, subgroup", [(128, 4), (256, 8), (512, 16)])
def test_kernels_at_lavapipe_subgroup_size(width, subgroup):
    env = {k: v for k, v in os.environ.items() if k not in HC_ENV}
    env.update(LP_NATIVE_VECTOR_WIDTH=str(width), DSV4_HC_EXPECT_SG=str(subgroup))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/hc_cases.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"worker at subgroup size {subgroup} failed:\n{out[-20000:]}"
    assert f"worker: subgroup size {subgroup}, expected {subgroup}" in out, out[-5000:]
    assert " passed" in out and " failed" not in out


# --- the environment switches ---------------------------------------------------------------------------

@pytest.fixture
def env(monkeypatch):
    """Set HC environment variables for one test; the policy is re-resolved before and after."""
    for k in HC_ENV:
        monkeypatch.delenv(k, raising=False)
    hc_policy.clear()

    def set_env(**kw):
        for k in HC_ENV:
            monkeypatch.delenv(k, raising=False)
        for k, v in kw.items():
            monkeypatch.setenv(k, v)
        hc_policy.clear()
    yield set_env
    hc_policy.clear()


def site_graph(T, D, fused=None):
    """One full site (hc.site): pre side, f = an input as the sublayer's output, post; its post
    carries the next site's mixes (next fn = fn) where the site kernels run."""
    g = Graph()
    t = {"X": g.input("X", (T, 4, D)), "fn": g.input("fn", (24, 4 * D)), "scale": g.input("scale", (3,)),
         "base": g.input("base", (24,)), "f": g.input("f", (T, D))}
    seen = {}

    def sublayer(u):
        seen["u"] = u
        return t["f"]
    X_new, carry = hc.site(g, t["X"], t["fn"], t["scale"], t["base"], sublayer, next_fn=t["fn"], fused=fused)
    g.output("u", seen["u"])
    g.output("X_new", X_new)
    return g


def site_inputs(rng, T, D):
    return {"X": rng.uniform(-1, 1, (T, 4, D)).astype(np.float32),
            "fn": (rng.uniform(-1, 1, (24, 4 * D)) * 2 / np.sqrt(4 * D)).astype(np.float32),
            "scale": rng.uniform(-0.5, 0.5, 3).astype(np.float32),
            "base": rng.uniform(-0.25, 0.25, 24).astype(np.float32),
            "f": rng.uniform(-1, 1, (T, D)).astype(np.float32)}


# (switches, dispatches, paths) for a site at T = 5, D = 64 at subgroup size 8. The site path: HC_MIX_PART,
# HC_SITE, HC_POST_MIX. Three-op: HC_MIX, HC_COEFS, HC_PRE, HC_POST; unfused mixes are RMS_NORM + MUL_MAT
# + 2 × 4 gate nodes, comb 141, pre 7, post 37 nodes.
THREE = "three-op"
SWITCHES = [({}, 3, ("fused:site",)),
            ({"DSV4_VK_DISABLE_HC_SITE": "1"}, 4, (THREE, "fused:rows4", "fused", "fused")),
            ({"DSV4_VK_DISABLE_HC": "1"}, 10 + 141 + 7 + 37, (THREE, "unfused", "unfused", "unfused")),
            ({"DSV4_VK_DISABLE_HC_COMB": "true"}, 10 + 141 + 1 + 1, (THREE, "unfused", "fused", "fused")),
            ({"DSV4_VK_DISABLE_HC_PRE": "yes"}, 1 + 1 + 7 + 1, (THREE, "fused:rows4", "unfused", "fused")),
            ({"DSV4_VK_DISABLE_HC_POST": "ON"}, 1 + 1 + 1 + 37, (THREE, "fused:rows4", "fused", "unfused")),
            ({"DSV4_VK_DISABLE_HC": "0", "DSV4_VK_DISABLE_HC_COMB": "off", "DSV4_VK_DISABLE_HC_PRE": "",
              "DSV4_VK_DISABLE_HC_POST": "no", "DSV4_VK_DISABLE_HC_SITE": "0"}, 3, ("fused:site",))]


def test_each_environment_switch_changes_the_path_and_results_agree(env, device, rng):
    # (SWITCHES name the comb kernel of a subgroup below 16 lanes; 16 and more run sg16)
    comb = "fused:sg16" if device.subgroup_size >= 16 and device.caps.subgroup.full_subgroups else "fused:rows4"
    T, D = 5, 64
    inputs = site_inputs(rng, T, D)
    ex = Executor(device)
    results = []
    for switches, n, paths in SWITCHES:
        env(**switches)
        g = site_graph(T, D)
        out = ex.run(g, **inputs)
        assert ex.last.check_guards() == []
        assert tuple(p[1] for p in g.paths) == tuple(comb if p == "fused:rows4" else p for p in paths), (switches, g.paths)
        assert ex.last.stats.dispatches == n, switches
        set_vars = [k for k, v in switches.items() if v not in ("0", "off", "", "no")]
        for op, path, reason in g.paths:
            if op == "HC_SITE":                      # three-op: says which switch turned it off
                assert (path == THREE) == any(k in reason for k in set_vars), reason
            else:
                assert ("disabled by environment" in reason) == (path == "unfused"), reason
        results.append((switches, out))
    ref = reference_site_pre(inputs["X"], inputs["fn"], inputs["scale"], inputs["base"])
    X_ref = reference_post(inputs["f"], inputs["X"], ref[1], ref[2])
    base = results[0][1]
    for switches, out in results:
        for k, r in (("u", ref[0]), ("X_new", X_ref)):
            assert nmse(out[k], base[k]) <= 1e-7, (switches, k)
            assert nmse(out[k], r) <= 1e-10, (switches, k)


def test_whole_site_dispatch_counts(env, device):
    """Decode: a chain of sites costs 2 dispatches per site (HC_SITE, HC_POST_MIX carrying the next
    site's mixes) plus one HC_MIX_PART at the start; the three-op path 4 per site; unfused ≈ 195."""
    env()
    g = Graph()
    T, D, n = 1, 16, 3
    X = g.input("X", (T, 4, D))
    fns = [g.input(f"fn{i}", (24, 4 * D)) for i in range(n)] + [g.input("fn_h", (4, 4 * D))]
    scale, base = g.input("scale", (3,)), g.input("base", (24,))
    carry = None
    for i in range(n):
        X, carry = hc.site(g, X, fns[i], scale, base, lambda u: g.op("SCALE", u, a=0.5, b=0.0), mix=carry,
                           next_fn=fns[i + 1])
    g.output("h", hc.head_pre(g, X, fns[n], scale[0:1], base[0:4], mix=carry))
    ops = [nd.op.name for nd in g.nodes]
    assert ops == ["HC_MIX_PART"] + n * ["HC_SITE", "SCALE", "HC_POST_MIX"] + ["HC_SITE"], ops
    env()
    fused = site_graph(5, 16)
    env(DSV4_VK_DISABLE_HC_SITE="1")
    three = site_graph(5, 16)
    env(DSV4_VK_DISABLE_HC="1")
    unfused = site_graph(5, 16)
    ex = Executor(device)
    counts = {name: ex.compile(gr).recording.n_dispatches for name, gr in
              (("site", fused), ("three-op", three), ("unfused", unfused))}
    # spec: ≈188 unfused vs 3 fused (+ the mixes)
    assert counts == {"site": 3, "three-op": 4, "unfused": 195}, counts


def test_switch_in_a_fresh_process_shows_in_info():
    env = {**{k: v for k, v in os.environ.items() if k not in HC_ENV}, "DSV4_VK_DISABLE_HC_COMB": "1"}
    r = subprocess.run([sys.executable, "-m", "dsv4_vk", "info"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("HC_")}
    assert "unfused: disabled by environment (DSV4_VK_DISABLE_HC_COMB=1)" in lines["HC_COMB"], r.stdout
    assert lines["HC_PRE"].split()[1] == "fused:" and lines["HC_POST"].split()[1] == "fused:", r.stdout
    assert lines["HC_SITE"].startswith("HC_SITE       three-op: part of the site is not fused: HC_COMB unfused"), r.stdout


def test_info_names_the_mixes_kernel_for_many_tokens():
    """info says which kernel the mixes of many tokens take, and why not TCR: with DSV4_VK_DISABLE_COOPMAT=1
    (any device), KSPLIT, because the cooperative-matrix shape is missing; --json carries the same."""
    env = {**{k: v for k, v in os.environ.items() if k not in HC_ENV}, "DSV4_VK_DISABLE_COOPMAT": "1"}
    r = subprocess.run([sys.executable, "-m", "dsv4_vk", "info"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("HC_MIX ")]
    assert line.startswith("HC_MIX        many tokens: KSPLIT (TCR needs VK_NV_cooperative_matrix's 16 × 8 × 16"), line
    r = subprocess.run([sys.executable, "-m", "dsv4_vk", "info", "--json"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    rep = json.loads(r.stdout)
    mix = rep["hc_mix"]
    assert mix["kernel"] == "ksplit" and "cooperative_matrix" in mix["tcr"], mix
    # without TCR the post carries at every T (lavapipe: the site path at decode, KSPLIT's carry past it)
    assert rep["hc_carry"] == {"D": 4096, "1-8": True, "9-511": True, ">=512": True}, rep["hc_carry"]


def test_info_says_where_the_post_carries_the_mixes(device, monkeypatch):
    """info's carry line follows hc.carries: on a GPU whose mixes run on TCR the prefill carry stops at
    TCR_MIN_T (faked here: lavapipe has no cooperative matrices)."""
    import dataclasses
    from dsv4_vk.cli import info
    from dsv4_vk.hc import mix_kernels, tcr
    sg = dataclasses.replace(device.caps.subgroup, operations=("basic", "arithmetic", "shuffle"),
                             full_subgroups=True, min_size=32, max_size=32)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", subgroup=sg))
    monkeypatch.setattr(tcr, "tcr_layout", lambda dev: tcr.TCR_H200_LAYOUT)
    hc_policy.clear()
    try:
        assert info.carry_summary(device) == {"D": 4096, "1-8": True, "9-511": True, ">=512": False}
        assert info.carry_summary(device, D=4100)[">=512"]             # 1025 chunks: no TCR, the carry runs
        line = info._human(info.report(device)).splitlines()[-1]
    finally:
        hc_policy.clear()
    assert line == "HC_POST_MIX   the post carries the next site's mixes (D = 4096) at T 1-8: yes, 9-511: yes, >=512: no", line


@pytest.mark.parametrize("name", HC_ENV[:5])
@pytest.mark.parametrize("value", ["2", "maybe", "enable"])
def test_bad_switch_values_are_errors_naming_the_variable(env, device, name, value):
    env(**{name: value})
    with pytest.raises(ValueError, match=f"{name}=.*1/true/yes/on.*0/false/no/off/empty"):
        hc_policy.resolve(device)


def test_comb_variant_forced_by_environment(env, device):
    env(DSV4_VK_HC_COMB_VARIANT="rows4")
    c = hc_policy.resolve(device)["HC_COMB"]
    assert c.path == "fused:rows4" and "DSV4_VK_HC_COMB_VARIANT=rows4" in c.reason
    env(DSV4_VK_HC_COMB_VARIANT="sg32")
    with pytest.raises(ValueError, match="DSV4_VK_HC_COMB_VARIANT='sg32'.*sg16, rows4"):
        hc_policy.resolve(device)
    if device.subgroup_size < 16:
        env(DSV4_VK_HC_COMB_VARIANT="sg16")
        with pytest.raises(HCUnsupported, match="DSV4_VK_HC_COMB_VARIANT=sg16.*subgroup size 8 < 16"):
            hc_policy.resolve(device)
        desc = hc_policy.describe(device)
        assert desc["HC_COMB"]["path"] == "error" and desc["HC_PRE"]["path"] == "fused", desc


def test_choice_is_logged_once_per_device(env, device, caplog):
    env()
    with caplog.at_level(logging.INFO, logger="dsv4_vk"):
        hc_policy.resolve(device)
        hc_policy.resolve(device)
        hc_policy.describe(device)
    msgs = [r.getMessage() for r in caplog.records if r.name == "dsv4_vk"]
    assert len(msgs) == 4 and all(any(m.startswith(op) for m in msgs) for op in hc_policy.OPS), msgs


# --- the device contract ----------------------------------------------------------------------------------

def fake_device(size, ops=("basic", "shuffle"), full=True, size_control=False, lo=None, hi=None):
    sg = SubgroupCaps(size=size, compute_stage=True, operations=tuple(ops), size_control=size_control,
                      full_subgroups=full, min_size=lo or size, max_size=hi or size, required_size_compute=size_control)
    return SimpleNamespace(caps=SimpleNamespace(subgroup=sg, type="discrete-gpu", is_cpu=False), subgroup_size=size, name=f"fake-sg{size}",
                           supports_subgroup_op=lambda op: op in ops)


@pytest.mark.parametrize("dev, path, reason", [
    (fake_device(32), "fused:sg16", "subgroup size 32 ≥ 16"),
    (fake_device(16), "fused:sg16", "subgroup size 16 ≥ 16"),
    (fake_device(8), "fused:rows4", "subgroup size 8 < 16: HC_COMB uses variant rows4"),
    (fake_device(4), "fused:rows4", "subgroup size 4 < 16: HC_COMB uses variant rows4"),
    (fake_device(32, full=False), "fused:rows4", "full subgroups cannot be required"),
    (fake_device(8, size_control=True, lo=8, hi=32), "fused:sg16", "≥ 16"),
    (fake_device(32, ops=("basic",)), "unfused", "device cannot run a fused HC_COMB (no subgroup shuffle"),
    (fake_device(2), "unfused", "device cannot run a fused HC_COMB (subgroup size 2 is not a multiple of 4"),
])
def test_device_contract(env, dev, path, reason):
    env()
    got = hc_policy.describe(dev)["HC_COMB"]
    assert got["path"] == path and reason in got["reason"], got
    assert "environment" not in got["reason"]
    if path == "unfused":
        with pytest.raises(HCUnsupported, match="cannot run a fused HC_COMB"):
            hc_policy.choose("HC_COMB", dev, fused=True)
    if path != "fused:sg16":
        with pytest.raises(HCUnsupported, match="sg16"):
            hc_policy.choose("HC_COMB", dev, variant="sg16")
    env(DSV4_VK_DISABLE_HC="yes")
    assert hc_policy.describe(dev)["HC_COMB"] == {"path": "unfused",
                                                   "reason": "disabled by environment (DSV4_VK_DISABLE_HC=yes)"}


def test_per_call_override_beats_the_environment(env, device):
    env(DSV4_VK_DISABLE_HC="1")
    assert hc_policy.choose("HC_PRE", device, fused=True).fused
    assert hc_policy.choose("HC_COMB", device, fused=True).path == "fused:rows4"
    env()
    assert hc_policy.choose("HC_POST", device, fused=False).path == "unfused"


# --- the numpy API -----------------------------------------------------------------------------------------

def test_api_results_and_last_run(env, rng):
    env()
    T, D = 5, 12
    m, s, b = rng.uniform(-2, 2, (T, 24)), rng.uniform(-0.5, 0.5, 3), rng.uniform(-0.25, 0.25, 24)
    c = dv.hc_comb(m, s, b)
    assert c.dtype == np.float32 and nmse(c, reference_comb(m, s, b)) <= 1e-11
    assert dv.last_run().dispatches == 1 and dv.last_run().paths[0][:2] == ("HC_COMB", "fused:rows4")
    c2 = dv.hc_comb(m, s, b, fused=False)
    assert dv.last_run().dispatches == 141 and nmse(c2, c) <= 1e-7
    x, w = rng.uniform(-1, 1, (T, 4, D)), rng.uniform(0, 1, (T, 4))
    assert max_abs(dv.hc_pre(x, w), reference_pre(x, w)) <= 1e-5 and dv.last_run().dispatches == 1
    f, p = rng.uniform(-1, 1, (T, D)), rng.uniform(0, 2, (T, 4))
    assert max_abs(dv.hc_post(f, x, p, c), reference_post(f, x, p, c)) <= 1e-5
    fn = rng.uniform(-1, 1, (24, 4 * D)) / np.sqrt(D)
    got = dv.hc_site_pre(x, fn, s, b)
    for a, r in zip(got, reference_site_pre(x, fn, s, b)):
        assert nmse(a, r) <= 1e-10
    assert [p[:2] for p in dv.last_run().paths] == [("HC_SITE", "fused:site")]
    # two site kernels; post and comb are strided views of HC_SITE's coefficients, copied out contiguous
    assert dv.last_run().labels == ["HC_MIX", "HC_SITE", "CONT", "CONT"]


def test_api_zero_tokens_return_empty_results_after_the_same_checks():
    """T = 0: empty results and no dispatch, after the checks a call with tokens makes — device= must be a
    Device, out= of the right shape (a closed device: test_library's use-after-close test)."""
    d = dv.default_device()
    assert dv.hc_comb(np.zeros((0, 24)), np.ones(3), np.ones(24), device=d).shape == (0, 4, 4)
    assert dv.hc_pre(np.zeros((0, 4, 7)), np.zeros((0, 4)), device=d).shape == (0, 7)
    assert dv.hc_post(np.zeros((0, 7)), np.zeros((0, 4, 7)), np.zeros((0, 4)), np.zeros((0, 4, 4)),
                      device=d).shape == (0, 4, 7)
    u, p, c = dv.hc_site_pre(np.zeros((0, 4, 3)), np.ones((24, 12)), np.ones(3), np.ones(24), device=d)
    assert (u.shape, p.shape, c.shape) == ((0, 3), (0, 4), (0, 4, 4))
    assert dv.last_run().dispatches == 0
    with pytest.raises(ValueError, match="device must be a dsv4_vk Device"):
        dv.hc_pre(np.zeros((0, 4, 7)), np.zeros((0, 4)), device="llvmpipe")
    with pytest.raises(ValueError, match=r"out\[0\] must have shape \[0, 7\], got \(5, 5\)"):
        dv.hc_pre(np.zeros((0, 4, 7)), np.zeros((0, 4)), out=d.empty((5, 5)))
    o = d.empty((0, 4, 4))
    assert dv.hc_comb(np.zeros((0, 24)), np.ones(3), np.ones(24), out=o) is o


M, S, B = np.zeros((3, 24)), np.zeros(3), np.zeros(24)
X, W = np.zeros((3, 4, 8)), np.zeros((3, 4))
F, P, C = np.zeros((3, 8)), np.zeros((3, 4)), np.zeros((3, 4, 4))


@pytest.mark.parametrize("call, match", [
    (lambda: dv.hc_comb(M[0], S, B), "mixes must have rank 2"),
    (lambda: dv.hc_comb(np.zeros((3, 16)), S, B), r"mixes must have shape \[\*, 24\]"),
    (lambda: dv.hc_comb(M.astype(np.int32), S, B), "mixes must be a floating-point array"),
    (lambda: dv.hc_comb(M, np.zeros(2), B), r"scale must have shape \[3\]"),
    (lambda: dv.hc_comb(M, S, np.zeros((1, 24))), "base must have rank 1"),
    (lambda: dv.hc_comb(M, S, B, n_iter=0), "n_iter must be an integer ≥ 1"),
    (lambda: dv.hc_comb(M, S, B, n_iter=2.5), "n_iter must be an integer ≥ 1"),
    (lambda: dv.hc_comb(M, S, B, eps=0.0), "eps must be a finite number > 0"),
    (lambda: dv.hc_comb(M, S, B, eps=-1e-6), "eps must be a finite number > 0"),
    (lambda: dv.hc_comb(M, S, B, eps=float("inf")), "eps must be a finite number > 0"),
    (lambda: dv.hc_comb(M, S, B, eps=float("nan")), "eps must be a finite number > 0"),
    (lambda: dv.hc_comb(M, S, B, variant="sg8"), "variant must be one of sg16, rows4"),
    (lambda: dv.hc_comb(M, S, B, fused=False, variant="rows4"), "fused=False"),
    (lambda: dv.hc_comb(M, S, B, fused="yes"), "fused must be None, True or False"),
    (lambda: dv.hc_pre(X, np.zeros((2, 4))), r"T \(tokens\) disagrees between x \(3\) and weights \(2\)"),
    (lambda: dv.hc_pre(X[:, :3], W), r"x must have shape \[\*, 4, \*\]"),
    (lambda: dv.hc_pre(np.zeros((3, 4, 0)), W), "hidden size D must be ≥ 1"),
    (lambda: dv.hc_pre(X, W.astype(bool)), "weights must be a floating-point array"),
    (lambda: dv.hc_post(F, np.zeros((3, 4, 9)), P, C), r"D \(hidden size\) disagrees between f \(8\) and residual \(9\)"),
    (lambda: dv.hc_post(F, X, P, np.zeros((3, 4, 3))), r"comb must have shape \[\*, 4, 4\]"),
    (lambda: dv.hc_post(F, X, np.zeros((2, 4)), C), r"T \(tokens\) disagrees between f \(3\) and post \(2\)"),
    (lambda: dv.hc_post(F, X, P, C[None]), "comb must have rank 3"),
    (lambda: dv.hc_site_pre(X, np.zeros((24, 31)), S, B), r"fn must have shape \[24, 32\]"),
    (lambda: dv.hc_site_pre(X, np.zeros((24, 32)), S, B, norm_eps=0), "norm_eps must be a finite number > 0"),
    (lambda: dv.hc_site_pre(X, np.zeros((24, 32)), S, B, hc_eps=float("nan")), "hc_eps must be a finite"),
    (lambda: dv.hc_site_pre(X, np.zeros((24, 32)), S, B, n_iter=-3), "n_iter must be an integer ≥ 1"),
    (lambda: dv.hc_comb(M, S, B, n_iter=1001), "n_iter must be an integer ≥ 1 and at most 1000"),
    (lambda: dv.hc_comb(M, S, B, eps=1e39), "eps must be a finite number > 0 that float32 holds"),
    (lambda: dv.hc_comb(M, S, B, eps=1e-50), "eps must be a finite number > 0 that float32 holds"),
    (lambda: dv.hc_comb(M, S, B, eps=True), "eps must be a finite number > 0"),
    (lambda: dv.hc_comb(M, S, B, eps="1e-6"), "eps must be a finite number > 0"),
    (lambda: dv.hc_site_pre(X, np.zeros((24, 32)), S, B, hc_eps=1e39), "hc_eps must be a finite number > 0"),
    (lambda: dv.hc_site_pre(X, np.zeros((24, 32)), S, B, norm_eps=10 ** 400), "norm_eps must be a finite number"),
    (lambda: dv.HcSite(np.zeros((24, 32)), S, B, norm_eps=1e39), "norm_eps must be a finite number > 0"),
    (lambda: dv.hc_comb(M, S, B, device="llvmpipe"), "device must be a dsv4_vk Device"),
    (lambda: dv.hc_pre(X, W, device=0), "device must be a dsv4_vk Device"),
    (lambda: dv.HcSite(np.zeros((24, 32)), S, B, device="llvmpipe"), "device must be a dsv4_vk Device"),
])
def test_api_bad_input_is_a_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_graph_functions_validate_their_tensors(device):
    g, other = Graph(), Graph()
    m, s, b = g.input("m", (3, 24)), g.input("s", (3,)), g.input("b", (24,))
    with pytest.raises(ValueError, match="mixes belongs to another graph"):
        hc.comb(g, other.input("m", (3, 24)), s, b, device=device)
    with pytest.raises(ValueError, match=r"base must have shape \[24\]"):
        hc.comb(g, m, s, m[0, :23], device=device)
    with pytest.raises(ValueError, match="mixes must be a GraphTensor"):
        hc.comb(g, np.zeros((3, 24)), s, b, device=device)
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        hc.comb(g, m, s, b, eps=0, device=device)
    x, f = g.input("x", (3, 4, 8)), g.input("f", (2, 8))
    with pytest.raises(ValueError, match=r"T \(tokens\) disagrees between f \(2\) and residual \(3\)"):
        hc.post(g, f, x, g.input("p", (2, 4)), g.input("c", (2, 4, 4)), device=device)
    with pytest.raises(ValueError, match=r"fn_h must have shape \[4, 32\]"):
        hc.head_pre(g, x, g.input("fn", (24, 32)), s[0:1], b[0:4], device=device)
    assert g.nodes == [], "a rejected call must not leave nodes behind"


def test_unfused_chains_follow_the_spec(device):
    """COMB: MUL → ADD → SOFT_MAX → +eps → columns, then (n_iter − 1) × (rows, columns); PRE 7 nodes;
    POST 4 × (MUL + 4 × (MUL, ADD)) then CONCAT. One primitive node (one dispatch) each."""
    g = Graph()
    m, s, b = g.input("m", (5, 24)), g.input("s", (3,)), g.input("b", (24,))
    hc.comb(g, m, s, b, n_iter=20, fused=False, device=device)
    ops = [n.op.name for n in g.nodes]
    columns, rows = ["CONT", "SUM_ROWS", "SCALE", "DIV"], ["SUM_ROWS", "SCALE", "DIV"]
    assert ops == ["MUL", "ADD", "SOFT_MAX", "SCALE"] + columns + 19 * (rows + columns)
    assert len(ops) == 141
    assert all(n.params == {"a": 1.0, "b": 1e-6} for n in g.nodes if n.op.name == "SCALE")
    g = Graph()
    x, w = g.input("x", (5, 4, 8)), g.input("w", (5, 4))
    hc.pre(g, x, w, fused=False, device=device)
    assert [n.op.name for n in g.nodes] == ["MUL"] + 3 * ["MUL", "ADD"]
    g = Graph()
    f, r, p, c = g.input("f", (5, 8)), g.input("r", (5, 4, 8)), g.input("p", (5, 4)), g.input("c", (5, 4, 4))
    hc.post(g, f, r, p, c, fused=False, device=device)
    assert [n.op.name for n in g.nodes] == 4 * (["MUL"] + 4 * ["MUL", "ADD"]) + ["CONCAT"]


VALIDATION_WORKER = r"""
import numpy as np, dsv4_vk as dv
from dsv4_vk import hc
from dsv4_vk.vk import default_device
dev = default_device()
assert dev.validation
rng = np.random.default_rng()
ex = dv.Executor(dev)
for T, D in ((9, 64), (3, 5), (70, 8)):           # vec4 / scalar kernels; T = 70: KSPLIT mixes
    g = dv.Graph()
    X, fn, f = g.input("X", (T, 4, D)), g.input("fn", (24, 4 * D)), g.input("f", (T, D))
    s, b, m = g.input("s", (3,)), g.input("b", (24,)), g.input("m", (T, 24))
    for fused, site in ((True, None), (True, True), (True, False), (False, None)):
        u, post, comb = hc.site_pre(g, X, fn, s, b, fused=fused, site=site)
        g.output(f"u{fused}{site}", u)
        g.output(f"x{fused}{site}", hc.post(g, f, X, post, comb, fused=fused))
    # a chain: HC_POST_MIX carries the mixes (T ≤ 8), the head collapse finishes them
    X1, carry = hc.site(g, X, fn, s, b, lambda u: g.op("SCALE", u, a=0.5, b=0.0), next_fn=fn[0:4], site=True)
    g.output("head", hc.head_pre(g, X1, fn[0:4], s[0:1], b[0:4], mix=carry, site=True))
    g.output("mixes", hc.mixes(g, X, fn))
    for v in hc.variants(dev)["HC_COMB"]:
        g.output(v, hc.comb(g, m, s, b, variant=v))
    for _ in range(2):
        ex.run(g, X=rng.standard_normal((T, 4, D)), fn=rng.standard_normal((24, 4 * D)), s=rng.standard_normal(3),
               b=rng.standard_normal(24), f=rng.standard_normal((T, D)), m=rng.standard_normal((T, 24)))
g = dv.Graph()                                     # row reductions by a whole workgroup (one long row)
x = g.input("x", (2, 4096))
g.output("r", g.op("RMS_NORM", x, eps=1e-6))
g.output("p", g.op("SOFT_MAX", x))
g.output("q", g.op("SUM_ROWS", x))
ex.run(g, x=rng.standard_normal((2, 4096)))
for sev, msg in dev.validation_messages:
    print(sev, msg[:400])
print("variants", hc.variants(dev)["HC_COMB"], "messages", len(dev.validation_messages))
"""


@pytest.mark.parametrize("width", [256, 512])
def test_hc_graphs_are_clean_under_validation(width):
    """Every HC kernel and chain, fused and unfused, under the Khronos layer with synchronization
    validation: no message (barriers, descriptors, push constants, subgroup-size requirements)."""
    env = {**{k: v for k, v in os.environ.items() if k not in HC_ENV}, "DSV4_VK_VALIDATION": "1",
           "LP_NATIVE_VECTOR_WIDTH": str(width)}
    r = subprocess.run([sys.executable, "-c", VALIDATION_WORKER], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("messages 0"), r.stdout
    assert ("sg16" in r.stdout) == (width == 512), r.stdout


@pytest.mark.parametrize("ops, kernel", [(("basic", "arithmetic", "shuffle"), "ksplit"), (("basic", "arithmetic"), "token")])
def test_many_tokens_mixes_on_a_gpu_take_ksplit_only_with_shuffles(tune, env, device, monkeypatch, ops, kernel):
    """The mixes of many tokens on a GPU: KSPLIT where its lanes can shuffle, else the per-token kernel
    (never a KSPLIT launch the device would refuse). (`env`: the policy's choices for the faked
    device are forgotten afterwards.)"""
    import dataclasses
    from dsv4_vk.hc import mix_kernels
    sg = dataclasses.replace(device.caps.subgroup, operations=ops, full_subgroups=True, min_size=32, max_size=32)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", subgroup=sg))
    # (without cooperative matrices: on a GPU that has them, TCR takes these mixes, as the next test checks)
    monkeypatch.setattr(tcr, "tcr_layout", lambda dev: "no cooperative matrices (this test's device)")
    lay = hc_plan.mix_layout(device, 4096, 1024)
    assert lay["split"] == (mix_kernels.KSPLIT_S if kernel == "ksplit" else 0) and "tile" not in lay
    tune({"carry.prefill": True})     # the prefill carry is KSPLIT's too
    assert hc.carries(device, None, 4096, 4096) == (kernel == "ksplit")


@pytest.mark.parametrize("mode", [None, True, False, 1, 0])
def test_prefill_carry_leaves_tcr_mixes_to_the_next_site(tune, env, device, monkeypatch, mode):
    """PREFILL_CARRY["prefill"] None (auto): a GPU whose mixes of many tokens run on TCR keeps the
    post plain there and the next site runs HC_MIX_FN_SPLIT + HC_MIX_TCR; below TCR_MIN_T, or where D
    has no whole 16-chunk steps, the post carries (KSPLIT). True carries everywhere past CARRY_MAX_T,
    False nowhere (1 and 0, as tools/hc_tune.py sets them, the same); anything else is refused by
    name. (The graphs are built, not run: lavapipe has no cooperative matrices, so the H200's layout
    is faked.)"""
    import dataclasses
    from dsv4_vk.hc import tcr
    sg = dataclasses.replace(device.caps.subgroup, operations=("basic", "arithmetic", "shuffle"),
                             full_subgroups=True, min_size=32, max_size=32)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", subgroup=sg))
    monkeypatch.setattr(tcr, "tcr_layout", lambda dev: tcr.TCR_H200_LAYOUT)
    tune({"carry.prefill": mode})
    big, small = tcr.TCR_MIN_T, tcr.TCR_MIN_T - 1
    expect = {None: (False, True, True), True: (True, True, True), False: (False, False, False)}[
        None if mode is None else bool(mode)]
    assert (hc.carries(device, None, big, 4096), hc.carries(device, None, small, 4096),
            hc.carries(device, None, big, 4100)) == expect          # 4100: 1025 chunks, no TCR
    assert hc.carries(device, None, 1, 4096)                           # decode carries in every mode

    rng = np.random.default_rng(7)
    D = 4096
    fn = (rng.uniform(-1, 1, (24, 4 * D)) / 128).astype(np.float32)
    scale, base = np.float32([0.5, 0.4, 0.3]), rng.uniform(-0.5, 0.5, 24).astype(np.float32)
    g = Graph()
    X = g.input("X", (big, 4, D))
    u, post, comb = hc.site_pre(g, X, g.const(fn), g.const(scale), g.const(base), device=device)
    X_new, carry = hc.site_post(g, u, X, post, comb, next_fn=g.const(fn), device=device)
    ops = [n.op.name for n in g.nodes]
    assert (carry is not None, ops.count("HC_POST_MIX")) == ((True, 1) if expect[0] else (False, 0)), ops
    assert ops.count("HC_MIX_TCR") == 1, ops                           # this site's own mixes: TCR

    for bad in ("yes", 2, 0.5):
        tune({"carry.prefill": bad})
        with pytest.raises(ValueError, match=rf"tuning knob 'carry.prefill' must be None \(auto\), True or False, got {bad!r}"):
            hc.carries(device, None, big, 4096)


def test_tcr_split_fits_the_workgroups_in_one_wave(tune, env, device, monkeypatch):
    """TCR's chunks per split: where splits make between half a wave and one wave of workgroups (token
    blocks × splits), the smallest of them; else TCR_SPLIT (32), or 16 where the stream is shorter.
    mix_layout takes it where no split is set, on a GPU with the H200's layout (faked here: lavapipe
    has no cooperative matrices)."""
    import dataclasses
    from dsv4_vk.hc import tcr
    # D = 4096 (1024 chunks), blocks of 128 tokens: T = 512 → 4 blocks, 64 splits of 16 = 256 workgroups
    # (32: 128, also in the band; 16 is smaller); T = 1024: 32 → 256 (16 → 512, two waves); T = 2048: 64 →
    # 256; T = 4096: 512 workgroups at the least, no split in one wave: 32
    assert [tcr.tcr_split_chunks(T, 1024, 2, 256) for T in (512, 1024, 2048, 4096)] == [16, 32, 64, 32]
    # D = 7168 (1792 chunks): T = 512 → 448, 224, 112 workgroups: 32; T = 1024: 64 (224); T = 2048: none
    assert [tcr.tcr_split_chunks(T, 1792, 2, 256) for T in (512, 1024, 2048)] == [32, 64, 32]
    assert tcr.tcr_split_chunks(512, 1024, 1, 256) == 32          # blocks of 64 tokens: twice the blocks
    assert tcr.tcr_split_chunks(4096, 32, 2, 256) == 32           # no split in one wave
    assert tcr.tcr_split_chunks(4096, 16, 2, 256) == 16           # a stream shorter than TCR_SPLIT
    sg = dataclasses.replace(device.caps.subgroup, operations=("basic", "arithmetic", "shuffle"),
                             full_subgroups=True, min_size=32, max_size=32)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", subgroup=sg))
    monkeypatch.setattr(tcr, "tcr_layout", lambda dev: tcr.TCR_H200_LAYOUT)
    for T, chunks, split in ((512, 1024, 16), (2048, 1024, 64), (4096, 1024, 32), (1024, 1792, 64)):
        lay = hc_plan.mix_layout(device, T, chunks)
        assert (lay["tcr"], lay["tt"], lay["split"], lay["groups"]) == (1, 2, split, -(-chunks // split))
    tune({"mix.split": 32})           # a split set: that one
    assert hc_plan.mix_layout(device, 2048, 1024, kernel="tcr")["split"] == 32


def test_mixes_layout_errors_name_the_parameter(tune, device, monkeypatch):
    """Bad layouts of the mixes kernels: a clear ValueError naming what is wrong, at graph build or at
    compile, before anything runs."""
    T, D = 70, 64
    g = Graph()
    X, fn = g.input("X", (T, 4, D)), g.input("fn", (24, 4 * D))
    with pytest.raises(ValueError, match=r"HC_MIX_PART: unknown parameter\(s\) \['tile'\]; accepted: "):
        g.op("HC_MIX_PART", X, fn, wg=64, groups=1, split=16, tile=1)
    tune({"mix.kernel": "bogus"})
    with pytest.raises(ValueError, match="mixes kernel must be one of .* got 'bogus'"):
        hc_plan.mix_layout(device, T, D // 4)
    tune({"mix.kernel": None})
    g = Graph()
    f, res = g.input("f", (T, D)), g.input("res", (T, 4, D))
    post, comb, fn = g.input("post", (T, 4)), g.input("comb", (T, 4, 4)), g.input("fn", (24, 4 * D))
    g.output("part", g.op("HC_POST_MIX", f, res, post, comb, fn, g.empty((T, 4, D)), wg=64, split=16, lpt=4, tb=64,
                          tpl=4))
    with pytest.raises(ValueError, match=r"tpl \(tokens per lane group\) must be one of \(1, 2\), got 4"):
        Executor(device).compile(g)


def test_post_mix_workgroup_must_hold_whole_streams():
    """HC_POST_MIX at few tokens gives each destination stream a quarter of the workgroup: a wg that
    is not a multiple of 4 is refused at graph build, naming the parameter."""
    g = Graph()
    T, D = 1, 64
    f, res = g.input("f", (T, D)), g.input("res", (T, 4, D))
    post, comb, fn = g.input("post", (T, 4)), g.input("comb", (T, 4, 4)), g.input("fn", (24, 4 * D))
    with pytest.raises(ValueError, match="HC_POST_MIX: wg must be a multiple of 4 .* got 30"):
        g.op("HC_POST_MIX", f, res, post, comb, fn, g.empty((T, 4, D)), wg=30)


def test_mix_workgroup_must_hold_whole_streams():
    """HC_MIX and HC_MIX_PART's per-token kernel give each stream a quarter of the workgroup: a wg that
    is not a multiple of 4 is refused at graph build, naming the parameter (KSPLIT's wg is free)."""
    g = Graph()
    X, fn = g.input("X", (1, 4, 64)), g.input("fn", (24, 256))
    with pytest.raises(ValueError, match="HC_MIX: the per-token kernel's workgroup .* multiple of 4, got 30"):
        g.op("HC_MIX", X, fn, wg=30)
    with pytest.raises(ValueError, match="HC_MIX_PART: the per-token kernel's workgroup .* multiple of 4, got 18"):
        g.op("HC_MIX_PART", X, fn, wg=18, groups=2)
    g.op("HC_MIX_PART", X, fn, wg=18, groups=1, split=16, lpt=1, tb=64)


def test_tensor_core_mixes_kernel_refuses_what_it_cannot_run(tune, env, device, monkeypatch):
    """HC_MIX_PART's tensor-core kernel: bad tc values and layouts are ValueErrors naming the parameter;
    tc = 1 on a device without cooperative matrices (lavapipe; elsewhere faked, `env`) is HCUnsupported
    naming the extension and pointing at tc = 2, never a pipeline the driver would refuse."""
    import dataclasses
    from dsv4_vk.hc import mix_kernels
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, coopmat=()))
    T, D = 70, 64
    g = Graph()
    X, fn = g.input("X", (T, 4, D)), g.input("fn", (24, 4 * D))
    with pytest.raises(ValueError, match=r"tc must be 0 .* got 3"):
        g.op("HC_MIX_PART", X, fn, wg=128, groups=1, split=16, tb=64, tc=3)

    def compile_one(D, tc=2, **layout):
        g = Graph()
        X, fn = g.input("X", (T, 4, D)), g.input("fn", (24, 4 * D))
        chunks = D // 4 if D % 4 == 0 else D
        lay = {"wg": 128, "split": 16, "groups": -(-chunks // 16), "tb": 64, "tc": tc, **layout}
        g.output("part", g.op("HC_MIX_PART", X, fn, **lay))
        Executor(device).compile(g)

    with pytest.raises(ValueError, match=r"stages chunks of 4 floats.* got D = 7"):
        compile_one(7)
    with pytest.raises(ValueError, match="takes wg 128, tb 64 .* got wg 64"):
        compile_one(D, wg=64)
    with pytest.raises(ValueError, match=r"groups = ceil\(16 / split\), got .* groups 3"):
        compile_one(D, groups=3)
    assert mix_kernels.tc_tile_n(device) is None
    with pytest.raises(HCUnsupported, match=r"tc = 1 needs VK_NV_cooperative_matrix.*tc = 2"):
        compile_one(D, tc=1)
    g = Graph()                                     # HC_POST_MIX: the tensor-core form is a many-token layout
    f, res = g.input("f", (T, D)), g.input("res", (T, 4, D))
    post, comb, fn = g.input("post", (T, 4)), g.input("comb", (T, 4, 4)), g.input("fn", (24, 4 * D))
    with pytest.raises(ValueError, match=r"HC_POST_MIX: the tensor-core kernel \(tc\) takes a split"):
        g.op("HC_POST_MIX", f, res, post, comb, fn, g.empty((T, 4, D)), wg=128, tc=2)
    with pytest.raises(ValueError, match=r"HC_POST_MIX: tc must be 0 .* got 5"):
        g.op("HC_POST_MIX", f, res, post, comb, fn, g.empty((T, 4, D)), wg=128, split=64, lpt=1, tb=64, tpl=1, tc=5)
    tune({"carry.kernel": "tile"})
    with pytest.raises(ValueError, match=r"tuning knob 'carry.kernel' must be one of \('ksplit', 'tc'\), got 'tile'"):
        hc.plan.carry_splits(64, D)


@pytest.mark.parametrize("shapes, sg, want", [([(16, 8, 16), (16, 16, 16)], 32, 8), ([(16, 16, 16)], 32, 16),
                                              ([(16, 8, 16)], 64, None), ([(16, 8, 32)], 32, None), ([], 32, None)])
def test_tensor_core_kernel_takes_the_devices_fp16_shape(tune, env, device, monkeypatch, shapes, sg, want):
    """tc = 1 where the device has a 16 × 8 (preferred: no padding of 24 rows) or 16 × 16 × 16 fp16 shape
    accumulating in fp32, with 32-lane subgroups (4 subgroups of 16 tokens); the portable tc = 2 otherwise."""
    import dataclasses
    from dsv4_vk.hc import mix_kernels
    from dsv4_vk.vk.caps import CoopMatShape
    cm = tuple(CoopMatShape(m, n, k, "f16", "f16", "f32", "f32") for m, n, k in shapes)
    cm += (CoopMatShape(16, 8, 16, "f16", "f16", "f16", "f16"),)       # fp16 accumulation: never taken
    sgc = dataclasses.replace(device.caps.subgroup, min_size=sg, max_size=sg, size=sg)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, coopmat=cm, subgroup=sgc))
    assert mix_kernels.tc_tile_n(device) == want
    tune({"mix.kernel": "tc"})
    lay = hc_plan.mix_layout(device, 4096, 1024)
    assert lay["tc"] == (1 if want else 2) and lay["groups"] == 1024 // mix_kernels.TC_SPLIT


# --- the plan ----------------------------------------------------------------------------------------------

def test_the_graph_functions_build_what_the_plan_says(env, device):
    """hc.plan.plan is the one decision: the mixes node's params are the plan's layout, the site's path
    and the post's carry are the plan's, and g.paths records the plan's path and reason."""
    T, D = 70, 64
    mix_plan = hc.plan.plan("HC_MIX", device, T, D)
    assert mix_plan.fused and mix_plan.variant in ("ksplit", "token") and mix_plan.reason
    g = Graph()
    X, fn = g.input("X", (T, 4, D)), g.input("fn", (24, 4 * D))
    hc.mixes(g, X, fn, device=device)
    (part,) = [n for n in g.nodes if n.op.name == "HC_MIX_PART"]
    assert {k: part.params.get(k) for k in mix_plan.params} == mix_plan.params, (part.params, mix_plan.params)
    for T in (1, 8, 9, 600):
        site_plan = hc.plan.plan("HC_SITE", device, T, D)
        g = Graph()
        X, fn = g.input("X", (T, 4, D)), g.input("fn", (24, 4 * D))
        scale, base = g.input("scale", (3,)), g.input("base", (24,))
        hc.site_pre(g, X, fn, scale, base, device=device)
        assert ("HC_SITE", site_plan.path, site_plan.reason) in g.paths
        assert hc.carries(device, None, T, D) == hc.plan.plan("HC_POST_MIX", device, T, D).fused
    assert hc.plan.plan("HC_SITE", device, 9, D).path == "three-op"
    assert hc.plan.plan("HC_MIX", device, 600, D, fused=False).path == "unfused"
    with pytest.raises(ValueError, match="op must be one of HC_COMB, HC_PRE, HC_POST, HC_SITE, HC_MIX, HC_POST_MIX"):
        hc.plan.plan("HC_MIXES", device)
