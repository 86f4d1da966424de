"""MQA_ATTENTION's prefill kernel (shaders/mqa_prefill.comp, kernel="prefill"): against a float64
reference of the attention on fresh random inputs (sliding, HCA and CSA layers, chunks that are no
multiple of the tiles, positions past the window, chunks starting mid-cache, a ring cache, positions
past the capacity), equal to the cluster kernel it replaces, how `auto` and the knobs choose it, and
the model against transformers with it. In this process at lavapipe's subgroup size 8, and at 4 and
16 in child processes (LP_NATIVE_VECTOR_WIDTH=128 / 512):

    LP_NATIVE_VECTOR_WIDTH=512 .venv/bin/python -m pytest -q tests/test_attention_prefill.py -k "not child"
"""
import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from test_model import check_fixture
from v4_ops_cases import check, f32, nmse, tables

from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.ops import get_op, v4_attention
from dsv4_vk.vk import default_device

HERE = os.path.dirname(os.path.abspath(__file__))
OLD_NMSE_MAX = 1e-7             # against the cluster kernel: the same sums in another order
C = 64                          # the capacity (positions) of the cases


def float64_attention(q, kv, p0, sinks, ent=None, idx=None, *, scale, window, mode, rate, capacity,
                      q_norm=None):
    """The attention written out in float64, independently of the op's reference: for token t at
    p = p0 + t, the keys are the raw rows j of the window (row j % rows of kv), then HCA's closed
    entries w < (p + 1) / rate or CSA's selected ones; a softmax over their scores and the head's
    sink, whose probability is dropped. q_norm = (cos, sin, eps): q's per-head RMS norm and its
    trailing channels' interleaved rotation at p first."""
    q = np.array(q, np.float64)
    T, H, hd = q.shape
    out = np.full((T, H, hd), np.nan)
    for t in range(T):
        p = p0 + t
        if not 0 <= p < capacity:
            continue
        qt = q[t]
        if q_norm is not None:
            cos, sin, eps = q_norm
            qt = qt / np.sqrt((qt * qt).mean(-1, keepdims=True) + eps)
            half = cos.shape[1]
            a, b = qt[:, hd - 2 * half::2].copy(), qt[:, hd - 2 * half + 1::2].copy()
            cs, sn = np.float64(cos[p]), np.float64(sin[p])
            qt[:, hd - 2 * half::2], qt[:, hd - 2 * half + 1::2] = a * cs - b * sn, a * sn + b * cs
        rows = [kv[j % len(kv)] for j in range(max(0, p - window + 1), p + 1)]
        if mode == "hca":
            rows += [ent[w] for w in range(min((p + 1) // rate, len(ent)))]
        elif mode == "csa":
            rows += [ent[w] for w in idx[t] if 0 <= w < len(ent)]
        k = np.array(rows, np.float64)
        for h in range(H):
            s = np.append(k @ qt[h] * scale, np.float64(sinks[h]))
            e = np.exp(s - s.max())
            out[t, h] = e[:-1] @ k / e.sum()
    return out


def case_arrays(rng, mode, T, H, hd, p0, window, rate, rows, q_norm):
    """(op inputs, op params, float64 reference) of one case."""
    n_ent = C // rate
    q = f32(rng, T, H, hd, scale=7.0 if q_norm else 1.0)
    arrays = [q, f32(rng, rows, hd), np.array([p0], np.int32), f32(rng, H)]
    prm = {"scale": hd ** -0.5, "window": window, "mode": mode, "rate": rate, "capacity": C}
    ent = idx = None
    if mode != "sliding":
        ent = f32(rng, n_ent, hd)
        arrays.append(ent)
    if mode == "csa":           # the indexer's picks: distinct entries, some −1 (none), per token
        idx = np.stack([rng.permutation(n_ent)[:7] for _ in range(T)]).astype(np.int32)
        idx[:, ::3] = -1
        arrays.append(idx)
    rope = None
    if q_norm:
        cos, sin = tables(rng, C + 3, min(hd // 2, 6))
        arrays += [cos, sin]
        prm["q_norm_eps"] = 1e-6
        rope = (cos, sin, 1e-6)
    want = float64_attention(q, arrays[1], p0, arrays[3], ent, idx, scale=prm["scale"], window=window, mode=mode,
                             rate=rate, capacity=C, q_norm=rope)
    return arrays, prm, want


def run_mqa(arrays, prm, kernel):
    g = Graph()
    g.output("out", g.op("MQA_ATTENTION", *[g.const(a) for a in arrays], kernel=kernel, **prm))
    cg = Executor().compile(g)
    return cg.run()["out"], cg.check_guards()


# (mode, T, H, hd, p0, window, rate, kv rows): T past a tile and no multiple of it; p0 past the
# window and mid-cache; a ring of 13 rows; the last tokens past the capacity 64 (NaN rows); H no
# multiple of a workgroup's heads; hd no multiple of 4 lanes' vec4s, and (18) of 4: the rows loaded
# by floats, not vec4s
CASES = [("sliding", 9, 4, 32, 0, 8, 1, 64), ("sliding", 6, 3, 16, 30, 6, 1, 13), ("sliding", 7, 5, 36, 60, 6, 1, 64),
         ("hca", 7, 3, 32, 30, 8, 8, 64), ("hca", 11, 6, 16, 17, 6, 4, 64), ("csa", 5, 4, 16, 20, 6, 4, 64),
         ("csa", 9, 5, 36, 58, 6, 4, 64), ("csa", 6, 2, 16, 40, 6, 4, 13), ("hca", 5, 3, 18, 33, 6, 4, 64),
         ("csa", 6, 4, 128, 40, 6, 4, 64)]
IDS = [f"{c[0]}-T{c[1]}-H{c[2]}-hd{c[3]}-p{c[4]}-rows{c[7]}" for c in CASES]
# knobs: the defaults; small tiles (several a list, a partial last one) with 1 and 3 heads a cluster
# and steps of keys past the tile's end; one key a step
KNOBS = {"default": {}, "tile3_heads1_keys2": {"mqa_prefill.tile": 3, "mqa_prefill.heads": 1, "mqa_prefill.keys": 2},
         "tile4_heads3_keys3": {"mqa_prefill.tile": 4, "mqa_prefill.heads": 3, "mqa_prefill.keys": 3},
         "keys1": {"mqa_prefill.keys": 1}, "literal": {"mqa_arrays.literal": True}}
# every case with the default knobs, with and without the q norm; the others on a few
MATRIX = ([(c, q_norm, "default") for c in range(len(CASES)) for q_norm in (False, True)]
          + [(c, c % 2 == 0, k) for c in (1, 4, 6, 7) for k in ("tile3_heads1_keys2", "tile4_heads3_keys3")]
          + [(c, False, "keys1") for c in (2, 5)]
          + [(c, True, "literal") for c in (8,)])


@pytest.mark.parametrize("case,q_norm,knobs", MATRIX,
                         ids=[f"{IDS[c]}-{'q_norm' if qn else 'q'}-{k}" for c, qn, k in MATRIX])
def test_prefill_matches_float64(tune, rng, case, q_norm, knobs):
    case, knobs = CASES[case], KNOBS[knobs]
    tune(knobs)
    arrays, prm, want = case_arrays(rng, *case, q_norm)
    got, bad = run_mqa(arrays, prm, "prefill")
    check(got, want, bad, nmse_max=1e-10, atol=1e-5)
    assert np.isnan(got).any() == (case[4] + case[1] > C)         # the rows past the capacity, only they


@pytest.mark.parametrize("case,q_norm", [(c, i % 2 == 1) for i, c in enumerate(CASES)],
                         ids=[f"{n}-{'q_norm' if i % 2 else 'q'}" for i, n in enumerate(IDS)])
def test_prefill_equals_the_cluster_kernel(rng, case, q_norm):
    arrays, prm, _ = case_arrays(rng, *case, q_norm)
    new, bad_new = run_mqa(arrays, prm, "prefill")
    old, bad_old = run_mqa(arrays, prm, "cluster")
    assert not bad_new and not bad_old
    assert np.array_equal(np.isnan(new), np.isnan(old))
    fin = np.isfinite(old)
    assert nmse(new[fin], old[fin]) <= OLD_NMSE_MAX
    assert np.abs(new[fin] - old[fin]).max() <= 1e-5 * max(1.0, np.abs(old[fin]).max())


def flash_csa_case(rng):
    """V4-Flash's widths: 64 heads of 512 channels sharing one key head, 6 tokens of a CSA layer at
    position 300 (lists past the window, 3 −1 slots a token), the q norm and RoPE: (arrays, params)."""
    T, H, hd, p0 = 6, 64, 512, 300
    n_ent = 80
    arrays = [f32(rng, T, H, hd, scale=5.0), f32(rng, 512, hd), np.array([p0], np.int32), f32(rng, H),
              f32(rng, n_ent, hd), np.stack([rng.permutation(n_ent)[:24] for _ in range(T)]).astype(np.int32)]
    arrays[5][:, -3:] = -1
    cos, sin = tables(rng, 512, 32)
    arrays += [cos, sin]
    return arrays, {"scale": hd ** -0.5, "window": 128, "mode": "csa", "rate": 4, "capacity": 512, "q_norm_eps": 1e-6}


def test_prefill_at_deepseek_v4_flash_widths(rng):
    """64 heads of 512 channels sharing one key head, a CSA layer's lists past the window, one
    token a workgroup group of heads over several tiles; against the op's float64 reference."""
    arrays, prm = flash_csa_case(rng)
    got, bad = run_mqa(arrays, prm, "prefill")
    check(got, get_op("MQA_ATTENTION").reference(*arrays, **prm), bad, nmse_max=1e-10, atol=1e-5)


def test_literal_arrays_apply_where_they_fit(tune):
    """mqa_arrays.literal: -D LITERAL_ARRAYS on whole-subgroup clusters whose arrays fit the literal
    sizes (head_dim 128 on lavapipe's 8 lanes: 4 vec4s a lane), never on smaller clusters."""
    tune({"mqa_prefill.on": True, "mqa_arrays.literal": True})
    assert "LITERAL_ARRAYS" not in lowered(8, hd=32)[0].defines                  # 2-lane clusters
    if default_device().subgroup_size == 8:
        assert "LITERAL_ARRAYS" in lowered(8, hd=128)[0].defines
    assert "LITERAL_ARRAYS" not in lowered(8, hd=4096)[0].defines                # 128 vec4s a lane


def test_key_rows_load_by_vec4_where_aligned(tune):
    """ROWS4 (spec constant 8): vec4 loads of the key rows only where head_dim and the rows' offsets
    and strides are multiples of 4 floats."""
    tune({"mqa_prefill.on": True, "mqa_prefill.coopmat": False})          # the f32 prefill kernel on any device
    assert lowered(8, hd=32)[0].spec[8] == 1 and lowered(8, hd=18)[0].spec[8] == 0
    g = Graph()
    kv = g.input("kv", (64, 34))[:, 1:33]                 # rows of 32 at offset 1, stride 34
    g.op("MQA_ATTENTION", g.input("q", (8, 4, 32)), kv, g.input("p", (1,), "i32"), g.input("s", (4,)),
         scale=0.5, window=8)
    assert get_op("MQA_ATTENTION").lower(g.nodes[-1], default_device())[0].spec[8] == 0


def lowered(T, H=4, hd=32, splits=1, device=None):
    g = Graph()
    g.op("MQA_ATTENTION", g.input("q", (T, H, hd)), g.input("kv", (64, hd)), g.input("p", (1,), "i32"),
         g.input("s", (H,)), scale=0.5, window=8, splits=splits)
    return get_op("MQA_ATTENTION").lower(g.nodes[-1], device or default_device())


def test_auto_takes_prefill_past_the_decode_tokens_on_gpus_and_the_knob_decides(tune, monkeypatch):
    """auto: the prefill kernel past TILED_MAX_TOKENS tokens with whole lists on GPUs, the cluster
    kernel on CPU devices; mqa_prefill.on (a program cache key like every knob) True: the prefill
    kernel there too, False: the cluster kernel everywhere, as before the prefill kernel."""
    T = v4_attention.TILED_MAX_TOKENS
    dev = default_device()
    tune({"mqa_prefill.coopmat": False})                                        # the f32 prefill kernel
    assert [ln.shader for ln in lowered(T + 1)] == (["mqa_attention"] if dev.caps.is_cpu else ["mqa_prefill"])
    tune({"mqa_prefill.on": True})
    assert [ln.shader for ln in lowered(T + 1)] == ["mqa_prefill"]
    assert v4_attention.describe(dev)["prefill"] == "prefill"
    tune({"mqa_prefill.on": None})
    monkeypatch.setattr(v4_attention, "is_cpu", lambda device: False)             # lowered as on a GPU
    assert [ln.shader for ln in lowered(T + 1)] == ["mqa_prefill"]
    assert [ln.shader for ln in lowered(T)] == ["mqa_attention"]                # decode: unchanged
    assert [ln.shader for ln in lowered(T + 1, splits=2)] == ["mqa_attention"]   # split lists: cluster
    tune({"mqa_prefill.on": False})
    assert [ln.shader for ln in lowered(T + 1)] == ["mqa_attention"]
    assert v4_attention.describe(dev)["prefill"] == "cluster"


def test_prefill_refuses_split_lists_and_a_device_without_room_for_a_key_row(monkeypatch):
    dev = default_device()
    with pytest.raises(ValueError, match=r"kernel='prefill' takes whole key lists \(splits=1\), got splits=2"):
        g = Graph()
        g.op("MQA_ATTENTION", g.input("q", (8, 2, 16)), g.input("kv", (64, 16)), g.input("p", (1,), "i32"),
             g.input("s", (2,)), scale=0.5, window=8, splits=2, kernel="prefill")
        get_op("MQA_ATTENTION").lower(g.nodes[-1], dev)
    small = dataclasses.replace(dev.caps.limits, max_shared_memory=1024)
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, limits=small))
    assert v4_attention.mqa_prefill_plan(dev, 512, 64)["tile"] == 0
    assert [ln.shader for ln in lowered(8, 64, 512, device=dev)] == ["mqa_attention"]      # auto: cluster
    with pytest.raises(ValueError, match=r"kernel='prefill' stages key rows of 512 floats in shared memory; .* 1024 B"):
        g = Graph()
        g.op("MQA_ATTENTION", g.input("q", (8, 2, 512)), g.input("kv", (64, 512)), g.input("p", (1,), "i32"),
             g.input("s", (2,)), scale=0.5, window=8, kernel="prefill")
        get_op("MQA_ATTENTION").lower(g.nodes[-1], dev)


def device_as(monkeypatch, subgroup: int, shared: int):
    """(the default device, whether it now counts as a GPU) with its subgroup size and shared memory
    set as given; 48 KiB or more counts as a GPU (the H200's), less as a CPU device (lavapipe's)."""
    dev = default_device()
    sg = dataclasses.replace(dev.caps.subgroup, size=subgroup, min_size=subgroup, max_size=subgroup)
    lim = dataclasses.replace(dev.caps.limits, max_shared_memory=shared)
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, subgroup=sg, limits=lim))
    gpu = shared >= 49152
    monkeypatch.setattr(v4_attention, "is_cpu", lambda device: not gpu)
    return dev, gpu


@pytest.mark.parametrize("subgroup,shared,limit", [(32, 49152, 48 * 1024), (8, 32768, 32 * 1024),
                                                   (4, 32768, 32 * 1024), (16, 32768, 32 * 1024)])
def test_the_default_tiles_fit_the_devices_shared_memory(monkeypatch, subgroup, shared, limit):
    """V4-Flash widths (64 heads × 512): the default tile of 8 keys fits the GPU's 48 KiB and lavapipe's
    32 KiB at every subgroup size (4 heads a cluster on GPUs); a tile asked for past the memory takes as
    many as fit."""
    dev, gpu = device_as(monkeypatch, subgroup, shared)
    plan = v4_attention.mqa_prefill_plan(dev, 512, 64)
    assert plan["tile"] == 8 and plan["shared_bytes"] + 64 <= limit
    assert plan["heads"] == (4 if gpu else 2)
    if gpu:
        assert plan["heads"] * plan["clusters"] == 32 and plan["workgroup"] == 256
    with tuned({"mqa_prefill.tile": 64}):
        plan = v4_attention.mqa_prefill_plan(dev, 512, 64)
    assert plan["tile"] == (shared - 64) // (2048 + 8) and plan["shared_bytes"] + 64 <= limit


def test_info_says_which_attention_kernels_run(tune):
    from dsv4_vk.cli.info import _human, report
    dev = default_device()
    if not dev.caps.is_cpu:                                  # a GPU's choices, as on lavapipe below
        tune({"mqa_prefill.on": False})
    rep = report(dev)
    assert rep["mqa_attention"]["prefill"] == "cluster"
    assert rep["mqa_attention"]["decode"] == ("cluster" if dev.caps.is_cpu else "tiled")
    assert (f"MQA_ATTENTION 64 heads × 512: decode {rep['mqa_attention']['decode']} (splits merged by MQA_COMBINE, "
            "mqa_merge.on=False), prefill cluster — prefill: the cluster kernel "
            + ("on CPU devices" if dev.caps.is_cpu else "(mqa_prefill.on=False)")) in _human(rep)
    tune({"mqa_merge.on": True})
    assert "splits merged in the dispatch" in _human(report(dev))
    tune({"mqa_prefill.on": True, "mqa_prefill.coopmat": False})
    rep = report(default_device())
    assert rep["mqa_attention"]["prefill"] == "prefill"
    assert re.search(r"prefill prefill — prefill: \d+ heads a workgroup share each staged key row", _human(rep))


@pytest.mark.parametrize("kernel", ["mqa_prefill", "mqa_attention", "mqa_prefill_coopmat"],
                         ids=["prefill", "cluster", "coopmat"])
def test_long_context_model_matches_transformers_with_the_prefill_kernel(tune, monkeypatch, kernel):
    """The long fixture (CSA layers past the indexer's top-k) in prefill chunks of 32, with the
    prefill kernel (auto as on a GPU), with the knob forcing the cluster kernel, and with the
    matrix-unit prefill kernel (mqa_prefill.coopmat=True: the FMA twin where the device has no
    matrix units): every chunk's attention took the kernel asked for."""
    monkeypatch.setattr(v4_attention, "is_cpu", lambda device: False)
    tune({"mqa_prefill.on": False if kernel == "mqa_attention" else None,
          "mqa_prefill.coopmat": kernel == "mqa_prefill_coopmat"})
    shaders, rows4, lower = [], [], v4_attention.MqaAttention.lower
    rows4_spec = {"mqa_prefill": 8, "mqa_prefill_coopmat": 6}

    def spy(self, node, device):
        launches = lower(self, node, device)
        shaders.extend((node.inputs[0].shape[0], ln.shader) for ln in launches)
        rows4.extend(ln.spec[rows4_spec[ln.shader]] for ln in launches if ln.shader in rows4_spec)
        return launches
    monkeypatch.setattr(v4_attention.MqaAttention, "lower", spy)
    check_fixture("long", True, chunk=32, max_ctx=160)
    prefill = {s for T, s in shaders if T > v4_attention.TILED_MAX_TOKENS}
    assert prefill == {kernel}
    assert all(rows4)                           # the model's cache and entries: rows loaded by vec4s


@pytest.mark.parametrize("width,subgroup", [(128, 4), (512, 16)])
def test_child_at_another_subgroup_size(width, subgroup):
    env = dict(os.environ, LP_NATIVE_VECTOR_WIDTH=str(width))
    code = "from dsv4_vk.vk import default_device; print('subgroup', default_device().subgroup_size)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert f"subgroup {subgroup}" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                        "cluster_kernel"], cwd=os.path.dirname(HERE), env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and " passed" in r.stdout and "failed" not in r.stdout, (r.stdout + r.stderr)[-4000:]


@pytest.mark.parametrize("case", [CASES[3], CASES[6]], ids=[IDS[3], IDS[6]])
def test_prefill_without_subgroup_operations(tune, rng, monkeypatch, case):
    """A device without subgroup operations: one-lane clusters (LANES = 1, no cluster sums), each
    lane a whole row of its heads."""
    dev = default_device()
    no_ops = dataclasses.replace(dev.caps.subgroup, operations=())
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, subgroup=no_ops))
    assert v4_attention.mqa_prefill_plan(dev, case[3], case[2])["lanes"] == {"LANES": 1}
    arrays, prm, want = case_arrays(rng, *case, True)
    got, bad = run_mqa(arrays, prm, "prefill")
    check(got, want, bad, nmse_max=1e-10, atol=1e-5)


# ---- the matrix-unit prefill kernel (shaders/mqa_prefill_coopmat.comp): the cooperative matrices
# themselves where the device has them (the H200), else its FMA twin (lavapipe), which has the same
# staging, power-of-two row scales, fp16 rounding and order of steps
NO_UNITS = "the device has no VK_NV_cooperative_matrix 16 × 16 × 16 fp16·fp16+fp32 shape"


def cm_kernel():
    """The matrix units where the device has them, else their FMA twin."""
    return "prefill_coopmat" if v4_attention.coopmat_unavailable(default_device()) is None else "prefill_coopmat_fma"

CM_NMSE_MAX = 1e-5              # fp16 inputs (11 significant bits), f32 sums
CM_ATOL = 5e-3                  # of max(1, |reference|)
# knobs: the defaults (16 heads a workgroup, 4 warps, 16 keys a tile here); 32 heads a workgroup
# (H past it: one partial group), a tile of 32 keys, one warp (each owning all channels), two warps,
# 8 warps (256 invocations) over 32 heads
CM_KNOBS = {"default": {}, "head_tiles2": {"mqa_prefill.cm_head_tiles": 2},
            "tile32": {"mqa_prefill.cm_tile": 32}, "warps1": {"mqa_prefill.cm_warps": 1},
            "warps2_tile32": {"mqa_prefill.cm_warps": 2, "mqa_prefill.cm_tile": 32},
            "warps8_head_tiles2": {"mqa_prefill.cm_warps": 8, "mqa_prefill.cm_head_tiles": 2}}
CM_MATRIX = ([(c, i % 2 == 1, "default") for i, c in enumerate(range(len(CASES)))]
             + [(6, i % 2 == 0, k)
                for i, k in enumerate(("head_tiles2", "tile32", "warps1", "warps2_tile32", "warps8_head_tiles2"))])


@pytest.mark.parametrize("case,q_norm,knobs", CM_MATRIX,
                         ids=[f"{IDS[c]}-{'q_norm' if qn else 'q'}-{k}" for c, qn, k in CM_MATRIX])
def test_coopmat_prefill_matches_float64_and_the_f32_kernel(tune, rng, case, q_norm, knobs):
    case = CASES[case]
    tune(CM_KNOBS[knobs])
    arrays, prm, want = case_arrays(rng, *case, q_norm)
    got, bad = run_mqa(arrays, prm, cm_kernel())
    check(got, want, bad, nmse_max=CM_NMSE_MAX, atol=CM_ATOL)
    assert np.isnan(got).any() == (case[4] + case[1] > C)         # the rows past the capacity, only they
    f32_out, bad = run_mqa(arrays, prm, "prefill")
    check(got, f32_out, bad, nmse_max=CM_NMSE_MAX, atol=CM_ATOL)


def test_coopmat_prefill_scales_rows_past_the_fp16_range(rng):
    """Key rows from 1e-4 to 3e5 (past fp16's 65504; rounded unscaled, they would be inf or lose
    their bits) and q rows of 1e-3 .. 1e3 (HCA, no q norm; the scale keeps the scores within ±4):
    each row's power-of-two shift keeps every value finite with 11 significant bits."""
    T, H, hd, p0 = 7, 5, 32, 30
    arrays, prm, _ = case_arrays(rng, "hca", T, H, hd, p0, 8, 4, 64, False)
    arrays[0] = (arrays[0] * 10.0 ** rng.uniform(-3, 3, (T, H, 1))).astype(np.float32)
    for i in (1, 4):
        arrays[i] = (arrays[i] * 10.0 ** rng.uniform(-4, 5.5, (len(arrays[i]), 1))).astype(np.float32)
    arrays[1][p0] *= 2e5 / np.abs(arrays[1][p0]).max()           # in every token's window: past 65504
    keys = np.concatenate([arrays[1], arrays[4]])
    prm["scale"] = 4.0 / np.abs(np.einsum("thc,kc->thk", arrays[0], keys)).max()   # scores within ±4 (fp16
    # rounds a score by about 2⁻¹² of its size: larger logits would spread the softmax's error, not test the range)
    want = float64_attention(arrays[0], arrays[1], p0, arrays[3], arrays[4], scale=prm["scale"], window=8,
                             mode="hca", rate=4, capacity=C)
    got, bad = run_mqa(arrays, prm, cm_kernel())
    check(got, want, bad, nmse_max=CM_NMSE_MAX, atol=CM_ATOL)


def test_coopmat_prefill_skips_tiles_of_empty_slots(rng):
    """CSA lists whose middle tiles (16 slots each on lavapipe, 32 on GPUs) hold only −1 slots: skipped,
    and the slots and maxima of the tiles after them still prepared."""
    T, H, hd, p0, window = 6, 5, 32, 40, 6
    arrays, prm, _ = case_arrays(rng, "csa", T, H, hd, p0, window, 4, 64, True)
    n_ent = len(arrays[4])
    idx = np.full((T, 90), -1, np.int32)
    idx[:, :5] = np.stack([rng.permutation(n_ent)[:5] for _ in range(T)])
    idx[:, 80:] = np.stack([rng.permutation(n_ent)[:10] for _ in range(T)])
    arrays[5] = idx
    want = float64_attention(arrays[0], arrays[1], p0, arrays[3], arrays[4], idx, scale=prm["scale"], window=window,
                             mode="csa", rate=4, capacity=C, q_norm=(arrays[6], arrays[7], prm["q_norm_eps"]))
    got, bad = run_mqa(arrays, prm, cm_kernel())
    check(got, want, bad, nmse_max=CM_NMSE_MAX, atol=CM_ATOL)


def test_coopmat_prefill_at_deepseek_v4_flash_widths(rng):
    """64 heads of 512 channels (4 workgroups a token, 128 channels a warp), a CSA layer's lists past
    the window with −1 slots, the q norm and RoPE; against the op's float64 reference."""
    arrays, prm = flash_csa_case(rng)
    got, bad = run_mqa(arrays, prm, cm_kernel())
    check(got, get_op("MQA_ATTENTION").reference(*arrays, **prm), bad, nmse_max=CM_NMSE_MAX, atol=CM_ATOL)


def shaders_of(launches):
    """(shader, -D CM_NV, and for the matrix-unit kernel whether it asks for full subgroups)."""
    return [(ln.shader, "CM_NV" in ln.defines, ln.shader == "mqa_prefill_coopmat" and ln.full_subgroups)
            for ln in launches]


def test_coopmat_knob_chooses_the_kernel(tune, monkeypatch):
    """mqa_prefill.coopmat: False the f32 prefill kernel; None (the default) the matrix units where the
    device has them (CM_NV, full subgroups), else the f32 kernel; True the same, else the FMA twin.
    DSV4_VK_DISABLE_COOPMAT (device.coopmat_disabled) leaves them off; decode keeps its kernels."""
    T = v4_attention.TILED_MAX_TOKENS
    dev = default_device()
    monkeypatch.setattr(v4_attention, "coopmat_unavailable", lambda device: NO_UNITS)   # as on lavapipe
    tune({"mqa_prefill.on": True})
    assert shaders_of(lowered(T + 1)) == [("mqa_prefill", False, False)]        # the default: no matrix units
    assert v4_attention.describe(dev)["prefill"] == "prefill"
    assert "no VK_NV_cooperative_matrix" in v4_attention.describe(dev)["reason"]
    tune({"mqa_prefill.coopmat": False})
    assert shaders_of(lowered(T + 1)) == [("mqa_prefill", False, False)]
    assert "mqa_prefill.coopmat=False" in v4_attention.describe(dev)["reason"]
    tune({"mqa_prefill.coopmat": None})
    assert shaders_of(lowered(T + 1)) == [("mqa_prefill", False, False)]        # no matrix units
    assert "no VK_NV_cooperative_matrix" in v4_attention.describe(dev)["reason"]
    tune({"mqa_prefill.coopmat": True})
    assert shaders_of(lowered(T + 1)) == [("mqa_prefill_coopmat", False, False)]
    assert v4_attention.describe(dev)["prefill"] == "prefill_coopmat_fma"
    assert [ln.shader for ln in lowered(T)] == ["mqa_attention"]                # decode: unchanged
    assert [ln.shader for ln in lowered(T + 1, splits=2)] == ["mqa_attention"]   # split lists: cluster
    monkeypatch.setattr(v4_attention, "coopmat_unavailable", lambda device: None)     # as on a GPU with them
    for on in (None, True):
        tune({"mqa_prefill.coopmat": on})
        assert shaders_of(lowered(T + 1)) == [("mqa_prefill_coopmat", True, True)]
        assert v4_attention.describe(dev)["prefill"] == "prefill_coopmat"
    monkeypatch.undo()
    monkeypatch.setattr(dev, "coopmat_disabled", True, raising=False)
    tune({"mqa_prefill.coopmat": None, "mqa_prefill.on": True})
    assert shaders_of(lowered(T + 1)) == [("mqa_prefill", False, False)]
    assert "DSV4_VK_DISABLE_COOPMAT=1" in v4_attention.describe(dev)["reason"]


def test_coopmat_kernels_refuse_what_they_cannot_run(tune, monkeypatch):
    dev = default_device()
    monkeypatch.setattr(v4_attention, "coopmat_unavailable", lambda device: NO_UNITS)

    def lower_forced(kernel, hd=16, splits=1, device=dev):
        g = Graph()
        g.op("MQA_ATTENTION", g.input("q", (8, 2, hd)), g.input("kv", (64, hd)), g.input("p", (1,), "i32"),
             g.input("s", (2,)), scale=0.5, window=8, splits=splits, kernel=kernel)
        return get_op("MQA_ATTENTION").lower(g.nodes[-1], device)
    with pytest.raises(ValueError, match=r"kernel='prefill_coopmat' cannot run on .*no VK_NV_cooperative_matrix.*"
                                         r"'prefill_coopmat_fma' runs its FMA twin anywhere"):
        lower_forced("prefill_coopmat")
    with pytest.raises(ValueError, match=r"kernel='prefill_coopmat_fma' takes whole key lists \(splits=1\)"):
        lower_forced("prefill_coopmat_fma", splits=2)
    for knob, value in (("cm_warps", 3), ("cm_head_tiles", 8), ("cm_tile", 24), ("coopmat", "yes")):
        with tuned({f"mqa_prefill.{knob}": value}), pytest.raises(ValueError, match=f"mqa_prefill.{knob}"):
            v4_attention.prefill_coopmat_choice(dev, 512, 64) if knob == "coopmat" else lower_forced(
                "prefill_coopmat_fma")
    small = dataclasses.replace(dev.caps.limits, max_shared_memory=16384)
    monkeypatch.setattr(dev, "caps", dataclasses.replace(dev.caps, limits=small))
    assert v4_attention.mqa_prefill_coopmat_plan(dev, 512, 64)["tile"] == 0
    with pytest.raises(ValueError, match=r"stages 16 key rows of 512 halves and 16 heads' scores .* 16384 B, too little"):
        lower_forced("prefill_coopmat_fma", hd=512)
    tune({"mqa_prefill.on": True, "mqa_prefill.coopmat": True})
    assert [ln.shader for ln in lowered(8, 64, 512, device=dev)] == ["mqa_prefill"]       # auto: f32 lanes


@pytest.mark.parametrize("subgroup,shared,limit", [(32, 49152, 48 * 1024), (8, 32768, 32 * 1024),
                                                   (4, 32768, 32 * 1024), (16, 32768, 32 * 1024)])
def test_the_coopmat_defaults_fit_the_devices_shared_memory(monkeypatch, subgroup, shared, limit):
    """V4-Flash widths (64 heads × 512): the GPU's default tile of 32 keys fits 48 KiB, lavapipe's of 16
    its 32 KiB; more head tiles a workgroup take smaller tiles to fit."""
    dev, gpu = device_as(monkeypatch, subgroup, shared)
    plan = v4_attention.mqa_prefill_coopmat_plan(dev, 512, 64)
    assert plan["tile"] == (32 if gpu else 16) and plan["shared_bytes"] <= limit
    assert plan["workgroup"] == 128 and plan["hd_pad"] == 512
    with tuned({"mqa_prefill.cm_head_tiles": 2, "mqa_prefill.cm_tile": 64}):
        plan = v4_attention.mqa_prefill_coopmat_plan(dev, 512, 64)
    assert plan["tile"] == 16 and plan["shared_bytes"] <= limit                 # (32 heads' scores)


def test_info_says_when_the_matrix_unit_prefill_runs(tune, monkeypatch):
    from dsv4_vk.cli.info import _human, report
    monkeypatch.setattr(v4_attention, "coopmat_unavailable", lambda device: NO_UNITS)
    tune({"mqa_prefill.on": True, "mqa_prefill.coopmat": True})
    rep = report(default_device())
    assert rep["mqa_attention"]["prefill"] == "prefill_coopmat_fma"
    assert "prefill prefill_coopmat_fma — prefill: the FMA twin (mqa_prefill.coopmat=True)" in _human(rep)


@pytest.mark.parametrize("width,subgroup", [(128, 4), (512, 16)])
def test_coopmat_child_at_another_subgroup_size(width, subgroup):
    env = dict(os.environ, LP_NATIVE_VECTOR_WIDTH=str(width))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                        "coopmat_prefill_matches and default and (csa-T9 or hca-T11)"], cwd=os.path.dirname(HERE),
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and " passed" in r.stdout and "failed" not in r.stdout, (r.stdout + r.stderr)[-4000:]
