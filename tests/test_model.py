"""The DeepSeek-V4-shaped model: its kernels against their float64 references, the whole model
against the numpy model (prefill and 16 decode steps, fused and unfused HC, subgroup sizes 8,
16 and 4), greedy tokens equal on both paths, chunked prefill + decode equal to recomputing, checkpoint
errors, a decode step that replays one recording, a clean run under the validation layer, the
demo and the tools.

Run as a script, the file is the subprocess worker: `worker` runs the end-to-end checks at another
lavapipe subgroup size (LP_NATIVE_VECTOR_WIDTH is read when the process creates its Vulkan
instance), `validation` runs the model under the Khronos validation layer.
"""
import dataclasses
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4_vk.core.executor as executor_module
from dsv4_vk import Executor, Graph
from dsv4_vk.core import profile
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.model import CheckpointError, Config, Model, ReferenceModel, Sampling, random_weights, save
from dsv4_vk.model import checkpoint as ckpt
from dsv4_vk.ops import get_op
from dsv4_vk.ops.attention import rope_tables
from dsv4_vk.ops.sample import sample_candidates, sample_uniform

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = Config(vocab=48, dim=32, n_layers=2, n_heads=2, head_dim=8, n_experts=4, top_k=2, expert_dim=16, max_ctx=32)
PROMPT, STEPS, CHUNK = 11, 16, 8        # 11 prompt tokens: one full chunk of 8 and a padded one
NMSE_MAX = 1e-6


def run_graph(g, **inputs):
    ex = Executor()
    out = ex.run(g, **inputs)
    assert ex.last.check_guards() == []
    return out


# --- kernels against their references ---------------------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 9), S=st.integers(1, 2), H=st.integers(1, 3), half=st.integers(1, 9),
       C=st.integers(1, 24), p0=st.integers(-2, 26), seed=st.integers(0, 2**31))
def test_kv_write_writes_rotated_rows_at_the_device_position_only(T, S, H, half, C, p0, seed):
    rng = np.random.default_rng(seed)
    hd = 2 * half
    cos, sin = (a.astype(np.float32) for a in rope_tables(hd, C))
    cache = rng.standard_normal((C, S, H, hd)).astype(np.float32)
    x = rng.standard_normal((T, 2 * S, H, hd)).astype(np.float32)          # written from a strided view
    rot = int(rng.integers(0, S + 1))
    g = Graph()
    c, xi, pi = g.input("cache", cache.shape), g.input("x", x.shape), g.input("pos", (1,), "i32")
    g.output("c", g.op("KV_WRITE", c, xi[:, ::2], pi, g.const(cos), g.const(sin), rotate=rot, out=c))
    got = run_graph(g, cache=cache, x=x, pos=np.array([p0], np.int32))["c"]
    ref = get_op("KV_WRITE").reference(cache, x[:, ::2], [p0], cos, sin, rotate=rot)
    assert nmse(got, ref) <= 1e-12 and max_abs(got, ref) <= 1e-5
    untouched = [p for p in range(C) if not p0 <= p < p0 + T]
    assert np.array_equal(got[untouched], cache[untouched])


@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 6), H=st.integers(1, 4), half=st.integers(1, 40), C=st.integers(1, 40),
       p0=st.integers(0, 40), rope=st.booleans(), seed=st.integers(0, 2**31))
def test_attention_is_causal_over_the_cache_and_nan_past_capacity(T, H, half, C, p0, rope, seed):
    rng = np.random.default_rng(seed)
    hd = 2 * half
    cos, sin = (a.astype(np.float32) for a in rope_tables(hd, C))
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    kv = (rng.standard_normal((C, 2, H, hd)) * 2).astype(np.float32)
    g = Graph()
    qi, ki, pi = g.input("q", q.shape), g.input("kv", kv.shape), g.input("pos", (1,), "i32")
    g.output("o", g.op("ATTENTION", qi, ki[:, 0], ki[:, 1], pi, g.const(cos), g.const(sin), scale=hd ** -0.5, rope=rope))
    got = run_graph(g, q=q, kv=kv, pos=np.array([p0], np.int32))["o"]
    ref = get_op("ATTENTION").reference(q, kv[:, 0], kv[:, 1], [p0], cos, sin, scale=hd ** -0.5, rope=rope)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got).any() == (p0 + T > C)
    if not np.isnan(ref).all():
        assert nmse(got, ref) <= 1e-10 and max_abs(got, ref) <= 1e-4


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
@pytest.mark.parametrize("norm", [True, False])
def test_moe_route_picks_top_k_with_ties_to_the_lower_id(router, norm, rng):
    T, E, K = 37, 9, 3
    lg = rng.standard_normal((T, E)).astype(np.float32)
    lg[0, [2, 5, 7]] = lg[0].max() + 1.0                  # a three-way tie at the top
    lg[1, 4] = np.nan                                      # never picked
    g = Graph()
    li = g.input("l", (T, E))
    g.output("r", g.op("MOE_ROUTE", li, top_k=K, router=router, norm=norm, route_scale=1.5, n_shared=2))
    got = run_graph(g, l=lg)["r"]
    ref = get_op("MOE_ROUTE").reference(np.nan_to_num(lg, nan=-np.inf), top_k=K, router=router, norm=norm,
                                        route_scale=1.5, n_shared=2)
    assert np.array_equal(got[..., 0], ref[..., 0])
    assert list(got[0, :K, 0]) == [2, 5, 7] and 4 not in got[1, :, 0]
    ok = np.arange(T) != 1                                 # the softmax denominator of row 1 is NaN
    assert max_abs(got[ok, :, 1], ref[ok, :, 1]) <= 1e-6


@pytest.mark.parametrize("as_gpu", [False, True])
def test_mul_mat_id_reads_only_the_chosen_experts(as_gpu, rng, monkeypatch, device):
    """SwiGLU over the routes, then the weighted sum (+ add); an invalid id gives NaN, not a wild read."""
    if as_gpu:      # lower as for a GPU: subgroup-lane clusters over K instead of one lane per output
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    T, E, F, D = 5, 6, 12, 20
    route = get_op("MOE_ROUTE").reference(rng.standard_normal((T, E - 1)), top_k=2, n_shared=1).astype(np.float32)
    route[3, 1, 0] = E + 7                                 # out of range: token 3 -> NaN
    w13 = rng.standard_normal((E, 2 * F, D)).astype(np.float32)
    w2 = rng.standard_normal((E, D, F)).astype(np.float32)
    x, add = rng.standard_normal((T, D)).astype(np.float32), rng.standard_normal((T, D)).astype(np.float32)
    g = Graph()
    xi, ri, ai = g.input("x", x.shape), g.input("r", route.shape), g.input("a", add.shape)
    h = g.output("h", g.op("MUL_MAT_ID", xi.reshape(T, 1, D), g.const(w13), ri, mode="swiglu"))
    g.output("y", g.op("MUL_MAT_ID", h, g.const(w2), ri, ai, mode="sum"))
    out = run_graph(g, x=x, r=route, a=add)
    op = get_op("MUL_MAT_ID")
    rh = op.reference(x[:, None, :], w13, route, mode="swiglu")
    ry = op.reference(rh, w2, route, add, mode="sum")
    for got, ref in ((out["h"], rh), (out["y"], ry)):
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(got[3]).any()
        assert nmse(got, ref) <= 1e-10


def test_sample_greedy_and_top_k_match_the_reference_draw_by_draw(rng):
    T, V = 400, 70
    lg = (rng.standard_normal((T, V)) * 2).astype(np.float32)
    lg[0] = np.nan
    lg[1, :] = -np.inf
    lg[1, 9] = 0.5                                          # the only finite logit
    lg[2, [3, 30]] = lg[2].max() + 1                        # tie: the lower id is greedy's pick
    for temp, k in ((0.0, 8), (1.0, 1), (0.7, 5), (1.3, 64)):
        g = Graph()
        li, ci, si = g.input("l", (T, V)), g.input("c", (2,)), g.input("s", (2,), "i32")
        g.output("tok", g.op("SAMPLE", li, ci, si))
        g.output("state", si)
        seed, counter = int(rng.integers(0, 2**31)), int(rng.integers(0, 2**30))
        out = run_graph(g, l=lg, c=np.array([temp, k], np.float32), s=np.array([seed, counter], np.int32))
        ref = get_op("SAMPLE").reference(lg, [temp, k], [seed, counter])
        assert list(out["state"]) == [seed, counter + T]     # the counter advanced on the device
        assert out["tok"][0] == -1 and out["tok"][1] == 9
        if temp == 0 or k == 1:
            assert out["tok"][2] == 3
        # a draw may flip only where u lies within f32 rounding of a cumulative boundary
        near = np.zeros(T, bool)
        for r in range(2, T):
            ids, p = sample_candidates(lg[r], temp, k)
            near[r] = np.min(np.abs(np.cumsum(p) - sample_uniform(seed, counter + r))) < 1e-5
        assert near.sum() <= T // 50                            # ≥ 98% of the draws compared exactly
        assert np.array_equal(out["tok"][~near], ref[~near])


def test_sample_frequencies_follow_the_top_k_softmax():
    """8000 draws from one row: never outside the top k, frequencies within 5 sigma of softmax(v/T)."""
    V, T, k, temp = 30, 8000, 6, 0.9
    row = np.random.default_rng(3).standard_normal(V).astype(np.float32)
    g = Graph()
    li, ci, si = g.input("l", (1, V)), g.input("c", (2,)), g.input("s", (2,), "i32")
    g.output("tok", g.op("SAMPLE", li.broadcast_to((T, V)), ci, si))
    toks = run_graph(g, l=row[None], c=np.array([temp, k], np.float32), s=np.array([7, 0], np.int32))["tok"]
    ids, p = sample_candidates(row, temp, k)
    assert set(toks.tolist()) <= set(ids.tolist())
    freq = np.array([(toks == i).mean() for i in ids])
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / T))


def test_model_op_declaration_errors():
    g = Graph()
    cache, x = g.input("c", (8, 2, 2, 4)), g.input("x", (3, 2, 2, 4))
    pos, cos, sin = g.input("p", (1,), "i32"), g.input("cos", (8, 2)), g.input("sin", (8, 2))
    with pytest.raises(ValueError, match="pos .* must be i32"):
        g.op("KV_WRITE", cache, x, g.input("pf", (1,)), cos, sin, out=cache)
    with pytest.raises(ValueError, match="cos .*RoPE table.*\\[8, 2\\]"):
        g.op("KV_WRITE", cache, x, pos, g.input("c7", (7, 2)), sin, out=cache)
    with pytest.raises(ValueError, match="rotate must be an integer in \\[0, 2\\]"):
        g.op("KV_WRITE", cache, x, pos, cos, sin, rotate=3, out=cache)
    with pytest.raises(ValueError, match="ATTENTION needs scale="):
        g.op("ATTENTION", x[:, 0], cache[:, 0], cache[:, 1], pos, cos, sin)
    with pytest.raises(ValueError, match="top_k must be an integer in \\[1, 4\\]"):
        g.op("MOE_ROUTE", g.input("l", (3, 4)), top_k=5)
    with pytest.raises(ValueError, match="x has 2 rows per token, expected 1 or 3"):
        g.op("MUL_MAT_ID", g.input("xx", (2, 2, 4)), g.input("w", (5, 6, 4)), g.input("r", (2, 3, 2)), mode="swiglu")
    with pytest.raises(ValueError, match="state .* must be i32"):
        g.op("SAMPLE", g.input("lg", (1, 9)), g.input("cf", (2,)), g.input("st", (2,)))
    # KV_WRITE writes in place: a fresh output would leave the cache unwritten
    g2 = Graph()
    c2 = g2.input("c", (8, 2, 2, 4))
    g2.output("o", g2.op("KV_WRITE", c2, g2.input("x", (3, 2, 2, 4)), g2.input("p", (1,), "i32"),
                         g2.input("cos", (8, 2)), g2.input("sin", (8, 2))))
    with pytest.raises(ValueError, match="in place: pass out=<the cache"):
        Executor().compile(g2)


# --- the whole model against the numpy model ------------------------------------------------------------

def check_against_reference(fused, seed, **config):
    """Prefill PROMPT tokens (chunks of CHUNK, the last padded) then STEPS decode steps with given
    tokens; every position's logits against the float64 model. Returns the worst NMSE."""
    cfg = TINY.replace(**config)
    weights = random_weights(cfg, seed)
    ids = np.random.default_rng(seed).integers(0, cfg.vocab, PROMPT + STEPS)
    model = Model(cfg, weights, fused=fused, prefill_chunk=CHUNK)
    rows = [model.prefill(ids[:PROMPT], all_logits=True)]
    rows += [model.step(int(t), output="logits")[None] for t in ids[PROMPT:-1]]
    got = np.concatenate(rows)
    ref = ReferenceModel(cfg, weights).forward(ids[:-1])
    errs = [nmse(got[i], ref[i]) for i in range(len(ref))]
    assert max(errs) <= NMSE_MAX, f"fused={fused}: NMSE per position {errs}"
    assert max_abs(got, ref) <= 1e-3 * np.abs(ref).max()
    for kind in ("prefill", "decode"):
        assert model.compiled(kind).check_guards() == []
    paths = {path for _, path, _ in model.paths()}
    assert (paths == {"unfused"}) if not fused else ("unfused" not in paths)
    return max(errs), paths


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_logits_match_the_float64_model_after_prefill_and_16_steps(fused, rng):
    check_against_reference(fused, int(rng.integers(0, 2**31)))


@pytest.mark.parametrize("config", [
    dict(router="softmax", norm_topk=False),
    dict(router="softmax", n_experts=6, top_k=3, n_shared=0, route_scale=2.5, n_heads=4, head_dim=4),
    dict(n_shared=2, n_layers=3, dim=18, expert_dim=11, n_heads=1, head_dim=6, rope_theta=500.0),
], ids=["softmax", "6-experts-top3-no-shared", "2-shared-3-layers-dims-not-4k"])
def test_other_configs_match_too(config, rng):
    check_against_reference(True, int(rng.integers(0, 2**31)), **config)


def validation_worker():
    """Subprocess entry (DSV4_VK_VALIDATION=1): prefill, decode and sampling on both paths."""
    from dsv4_vk.vk import default_device
    dev = default_device()
    assert dev.validation
    for fused in (True, False):
        m = Model.load(TINY.replace(n_layers=1, max_ctx=12), fused=fused, prefill_chunk=4)
        print(f"fused={fused} tokens {list(m.generate([1, 2, 3, 4, 5], 4, Sampling(1.0, 5, 3)))}")
    for sev, msg in dev.validation_messages:
        print(sev, msg[:400])
    print("messages", len(dev.validation_messages))


def test_model_graphs_are_clean_under_the_validation_layer():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "test_model.py"), "validation"], cwd=ROOT,
                       env=dict(os.environ, DSV4_VK_VALIDATION="1"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    assert r.stdout.count(" tokens [") == 2 and r.stdout.strip().endswith("messages 0"), r.stdout


def worker():
    """Subprocess entry: the end-to-end check on both paths at this process's subgroup size."""
    from dsv4_vk.vk import default_device
    seed = int(os.environ["DSV4_MODEL_SEED"])
    print(f"worker: subgroup size {default_device().subgroup_size}")
    for fused in (True, False):
        err, paths = check_against_reference(fused, seed)
        print(f"worker: fused={fused} paths={sorted(paths)} worst nmse {err:.3g} ok")


@pytest.mark.parametrize("width,subgroup,comb", [(512, 16, "sg16"), (128, 4, "rows4")])
def test_model_matches_at_another_subgroup_size(width, subgroup, comb, rng):
    env = dict(os.environ, LP_NATIVE_VECTOR_WIDTH=str(width), DSV4_MODEL_SEED=str(int(rng.integers(0, 2**31))))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "test_model.py"), "worker"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert f"worker: subgroup size {subgroup}" in out, out
    assert f"fused=True paths=['fused', 'fused:{comb}'] " in out and "fused=False paths=['unfused'] " in out, out


def test_greedy_tokens_agree_on_both_paths_and_are_the_reference_argmax(rng):
    seed = int(rng.integers(0, 2**31))
    weights = random_weights(TINY, seed)
    prompt = rng.integers(0, TINY.vocab, 5)
    runs = {f: list(Model(TINY, weights, fused=f, prefill_chunk=CHUNK).generate(prompt, STEPS))
            for f in (True, False)}
    assert runs[True] == runs[False] and len(runs[True]) == STEPS
    seq = np.concatenate([prompt, runs[True]])
    ref = ReferenceModel(TINY, weights).forward(seq[:-1])[len(prompt) - 1:]
    picked = ref[np.arange(STEPS), runs[True]]
    assert np.all(picked >= ref.max(axis=1) - 1e-5), "a greedy token is not the argmax of the float64 logits"


def test_seeded_sampling_repeats_and_agrees_on_both_paths(rng):
    weights = random_weights(TINY, int(rng.integers(0, 2**31)))
    prompt = rng.integers(0, TINY.vocab, 4)
    s = Sampling(temperature=1.2, top_k=8, seed=int(rng.integers(0, 2**31)))
    fused, unfused = Model(TINY, weights, fused=True), Model(TINY, weights, fused=False)
    a, b = list(fused.generate(prompt, 12, s)), list(fused.generate(prompt, 12, s))
    assert a == b                                           # generate reseeds: reproducible
    assert list(unfused.generate(prompt, 12, s)) == a
    other = list(fused.generate(prompt, 12, Sampling(1.2, 8, s.seed + 1)))
    assert other != a                                       # 12 draws over ≤ 8 candidates each


def test_chunked_prefill_plus_decode_equals_recomputing_the_sequence(rng):
    weights = random_weights(TINY, int(rng.integers(0, 2**31)))
    ids = rng.integers(0, TINY.vocab, 23)
    whole = Model(TINY, weights, prefill_chunk=16).prefill(ids, all_logits=True)
    m = Model(TINY, weights, prefill_chunk=4)
    rows = [m.prefill(ids[:9], all_logits=True)] + [m.step(int(t), output="logits")[None] for t in ids[9:19]]
    rows.append(m.prefill(ids[19:], all_logits=True))       # prefill again after decode steps
    assert nmse(np.concatenate(rows), whole) <= 1e-9
    m.reset()                                               # a new sequence overwrites the cache rows
    assert nmse(m.prefill(ids[:7], all_logits=True), whole[:7]) <= 1e-9


def test_decode_replays_one_recording(monkeypatch, rng):
    m = Model.load(TINY, seed=int(rng.integers(0, 2**31)))
    m.prefill(rng.integers(0, TINY.vocab, 3))
    m.step()
    cg = m.compiled("decode")
    rec, n, submits = cg.recording, cg.recording.n_dispatches, cg.recording.n_submits

    def no_recording(*a, **k):
        raise AssertionError("a decode step recorded commands")
    monkeypatch.setattr(executor_module.CompiledGraph, "_record", no_recording)
    monkeypatch.setattr(executor_module.CompiledGraph, "__init__", no_recording)
    for _ in range(10):
        m.step()
    assert m.compiled("decode") is cg and cg.recording is rec
    assert rec.n_dispatches == n and rec.n_submits == submits + 10
    assert m.position == 14


def test_profile_splits_prefill_and_decode(rng):
    m = Model.load(TINY, seed=1)
    with profile.profile() as prof:
        list(m.generate(rng.integers(0, TINY.vocab, 3), 4))
    d = prof.as_dict()["phases"]
    assert d["prefill"]["runs"] == 1 and d["decode"]["runs"] == 3
    assert d["decode"]["dispatches"] == 3 * m.compiled("decode").recording.n_dispatches
    assert {"ATTENTION", "MOE_ROUTE", "MUL_MAT_ID", "SAMPLE", "HC_COMB"} <= set(d["decode"]["ops"])


def test_api_errors_name_the_argument():
    m = Model.load(TINY, seed=0)
    for bad, msg in (([], "ids must be a non-empty 1-D"), ([1.5], "integer token ids"), ([3, 48], "outside \\[0, 48\\)"),
                     (list(range(33)), "exceed max_ctx 32")):
        with pytest.raises(ValueError, match=msg):
            m.prefill(bad)
    with pytest.raises(ValueError, match="max_new_tokens: 30 prompt \\+ 4 new tokens exceed max_ctx 32"):
        m.generate(list(range(30)), 4)
    with pytest.raises(ValueError, match="token holds ids outside"):
        m.step(99)
    with pytest.raises(ValueError, match="output must be 'token' or 'logits'"):
        m.step(output="probs")
    for kw, msg in (({"temperature": -1.0}, "temperature must be a finite number ≥ 0"),
                    ({"top_k": 65}, "top_k must be an integer in \\[1, 64\\]")):
        with pytest.raises(ValueError, match=msg):
            Sampling(**kw)
    with pytest.raises(ValueError, match="Config.top_k \\(5\\) must be ≤ n_experts \\(4\\)"):
        TINY.replace(top_k=5)
    with pytest.raises(ValueError, match="fused must be None"):
        Model.load(TINY, fused="yes")
    m.reset()
    m.prefill(list(range(32)))
    with pytest.raises(ValueError, match="sequence is full"):
        m.step()


# --- checkpoints --------------------------------------------------------------------------------------------

def test_checkpoint_round_trip_and_model_load(tmp_path):
    cfg = TINY.replace(router="softmax", n_shared=0)
    w = random_weights(cfg, 5)
    path = tmp_path / "m.safetensors"
    save(path, w, cfg)
    cfg2, w2 = ckpt.load_checkpoint(path)
    assert cfg2 == cfg and w2.keys() == w.keys() and all(np.array_equal(w[k], w2[k]) for k in w)
    ids = [1, 2, 3, 4]
    assert np.array_equal(Model.load(path).prefill(ids), Model(cfg, w).prefill(ids))


def _tampered(tmp_path, edit=None, drop=None, extra=None, reshape=None):
    w = random_weights(TINY, 0)
    if drop:
        del w[drop]
    if extra:
        w.update(extra)
    if reshape:
        w[reshape] = w[reshape][..., :-1]
    path = tmp_path / "bad.safetensors"
    save(path, w, TINY)
    if edit:
        raw = bytearray(path.read_bytes())
        edit(raw)
        path.write_bytes(bytes(raw))
    return path


def _header_edit(fn):
    """An edit of the JSON header (re-serialised, same length padding)."""
    def edit(raw):
        n = struct.unpack("<Q", raw[:8])[0]
        h = json.loads(raw[8:8 + n])
        fn(h)
        new = json.dumps(h).encode()
        new += b" " * (-len(new) % 8)
        raw[:] = struct.pack("<Q", len(new)) + new + raw[8 + n:]
    return edit


@pytest.mark.parametrize("case,msg", [
    (dict(drop="layers.1.hc_ffn_fn"), "missing tensor 'layers.1.hc_ffn_fn' \\(expected shape \\[24, 128\\]\\)"),
    (dict(reshape="hc_head_base"), "tensor 'hc_head_base' has shape \\[3\\], expected \\[4\\]"),
    (dict(drop="layers.0.hc_attn_scale", extra={"layers.0.hc_attn_scales": np.ones(3)}),
     "missing tensor 'layers.0.hc_attn_scale'.*unexpected tensor 'layers.0.hc_attn_scales'"),
    (dict(edit=lambda raw: raw.__delitem__(slice(len(raw) - 100, None))), "truncated"),
    (dict(edit=lambda raw: raw.__setitem__(slice(0, 8), struct.pack("<Q", 1 << 40))), "header length .* exceeds"),
    (dict(edit=lambda raw: raw.__setitem__(slice(8, 12), b"\xff\xfe{[")), "not valid JSON"),
    (dict(edit=_header_edit(lambda h: h["norm.weight"].update(dtype="I8"))), "'norm.weight': dtype 'I8' not supported"),
    (dict(edit=_header_edit(lambda h: h["norm.weight"]["data_offsets"].__setitem__(1, h["norm.weight"]["data_offsets"][1] - 4))),
     "'norm.weight': data_offsets span"),
    (dict(edit=_header_edit(lambda h: h.pop("__metadata__"))), "no 'dsv4_vk.config' entry"),
    (dict(edit=_header_edit(lambda h: h["__metadata__"].update({"dsv4_vk.config": '{"dim": 0}'}))), "Config.dim must be"),
    (dict(edit=lambda raw: raw.__setitem__(slice(len(raw) - 4, None), np.float32(np.nan).tobytes())), "non-finite"),
])
def test_corrupt_or_mismatched_checkpoints_are_clear_errors(tmp_path, case, msg):
    path = _tampered(tmp_path, **case)
    with pytest.raises(CheckpointError, match=msg):
        Model.load(path)


def test_checkpoint_against_a_given_config_and_short_files(tmp_path):
    path = _tampered(tmp_path)
    with pytest.raises(CheckpointError, match="tensor 'embed.weight' has shape \\[48, 32\\], expected \\[50, 32\\]"):
        ckpt.load_checkpoint(path, TINY.replace(vocab=50))
    (tmp_path / "empty").write_bytes(b"abc")
    with pytest.raises(CheckpointError, match="too short"):
        ckpt.load_checkpoint(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="cannot be read"):
        ckpt.load_checkpoint(tmp_path / "missing.safetensors")


# --- demo and tools -------------------------------------------------------------------------------------------

def test_demo_generates_the_same_tokens_on_both_paths(capsys):
    from dsv4_vk.cli import demo
    assert demo.main(["--dim", "32", "--heads", "2", "--layers", "1", "--experts", "3", "--tokens", "6",
                      "--prompt", "3", "--vocab", "40"]) == 0
    out = capsys.readouterr().out
    assert "same tokens on both paths: yes" in out
    for word in ("tokens/s", "dispatches/token", "prefill", "decode", "HC_COMB"):
        assert word in out


def test_make_checkpoint_tool_and_the_gpu_bench_dry_run(tmp_path):
    path = tmp_path / "c.safetensors"
    r = subprocess.run([sys.executable, "tools/make_checkpoint.py", "--out", str(path), "--vocab", "40", "--dim", "16",
                        "--n_layers", "1", "--n_heads", "2", "--head_dim", "8", "--n_experts", "3", "--seed", "4"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cfg, w = ckpt.load_checkpoint(path)
    assert cfg.dim == 16 and cfg.n_experts == 3
    assert all(np.array_equal(w[k], v) for k, v in random_weights(cfg, 4).items())
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "tools/model_gpu_bench.py", "--quick", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["decode"]["fused"]["dispatches_per_token"] < res["decode"]["unfused"]["dispatches_per_token"]
    assert set(res["host"]) == {"2", "8"}


if __name__ == "__main__":
    {"worker": worker, "validation": validation_worker}[sys.argv[1]]()
