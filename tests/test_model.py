"""DeepSeek-V4 on the device against transformers itself: the fixtures under tests/fixtures/dsv4_*
(written by tools/make_dsv4_fixtures.py from transformers' DeepseekV4ForCausalLM, saved with
save_pretrained) hold float32 logits after a 37-token prefill (9 CSA windows, 4 HCA windows, past
the 8-token sliding window) and after each of 17 cached decode steps; dsv4_long after a 128-token
prompt (more than 10 × index_topk × rate tokens: the indexer's top-k keeps 3 of up to 36 entries)
and 17 decode steps. Every one must match to NMSE
≤ 1e-6, fused and unfused HC, at lavapipe subgroup sizes 8 (here), 4 and 16 (subprocesses), with
the decode attention's key lists split or whole. Also: against the float64 reference on a longer
random config (index top-k above 64), chunked prefill + decode = recomputing, one replayed
recording per step, BF16 weights on the device, the profile, API errors, validation layers.

Run as a script, the file is the subprocess worker: `worker` runs the fixture checks at another
subgroup size (LP_NATIVE_VECTOR_WIDTH is read when the process creates its Vulkan instance),
`validation` runs the model under the Khronos validation layer.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from logits_check import logits_errors

import dsv4_vk.core.executor as executor_module
from dsv4_vk.core import profile
from dsv4_vk.core.tuning import Tuning
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.model import Model, Sampling, V4Config, V4Reference, load_hf, random_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
NMSE_MAX = 1e-6
FIXTURE_CTX = {"long": 160}     # the decode cache of each fixture's checks (else 64)
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
TINY = V4Config(vocab_size=48, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, head_dim=16,
                q_lora_rank=8, o_groups=2, o_lora_rank=8, partial_rotary_factor=0.5, n_routed_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=16, swiglu_limit=2.0, layer_types=(CSA, HCA, SWA),
                mlp_layer_types=("hash_moe", "moe", "moe"), compress_rates={CSA: 4, HCA: 8}, sliding_window=6,
                index_n_heads=16, index_head_dim=8, index_topk=3, max_ctx=40)


def fixture(name, max_ctx=None):
    cfg, w = load_hf(os.path.join(FIX, f"dsv4_{name}"), max_ctx=max_ctx or FIXTURE_CTX.get(name, 64))
    e = np.load(os.path.join(FIX, f"dsv4_{name}", "expected.npz"))
    return cfg, w, {k: e[k] for k in e.files}


def check_fixture(name, fused, splits=None, chunk=16, max_ctx=None):
    """Prefill the fixture's prompt, then its forced decode tokens one step each; every logits row
    against transformers'. Returns (worst NMSE, HC paths)."""
    cfg, w, e = fixture(name, max_ctx)
    m = Model(cfg, w, fused=fused, prefill_chunk=chunk, splits=splits)
    errs = logits_errors(m, e)
    assert max(errs) <= NMSE_MAX, f"{name} fused={fused}: NMSE per position {errs}"
    for kind in ("prefill", "decode"):
        assert m.compiled(kind).check_guards() == []
    paths = {p.path for p in m.paths()}
    assert (paths == {"unfused"}) if fused is False else ("unfused" not in paths)
    return max(errs), paths


@pytest.mark.parametrize("chunk,fused,max_ctx", [(1, True, 160), (7, True, 1024), (7, False, 160), (32, True, 160),
                                                  (32, False, 1024)])
def test_long_context_past_the_indexer_top_k_matches_transformers(chunk, fused, max_ctx):
    """tests/fixtures/dsv4_long: two CSA layers keeping 3 of up to 36 entries through a 128-token
    prompt (more than 10 × index_topk × rate = 120 tokens) and 17 decode steps, in prefill chunks of
    1, 7 and 32 tokens, fused and unfused, with the cache the sequence needs or a larger one (the
    top-k reads only the entries that exist)."""
    cfg, _, e = fixture("long", max_ctx)
    assert len(e["prompt"]) >= 10 * cfg.index_topk * cfg.compress_rates[CSA] and len(e["decode"]) >= 16
    check_fixture("long", fused, chunk=chunk, max_ctx=max_ctx)


@pytest.mark.parametrize("name", ["mixed", "bf16"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_logits_match_transformers_after_prefill_and_every_decode_step(name, fused):
    check_fixture(name, fused)


def test_split_decode_attention_and_small_prefill_chunks_match_too():
    check_fixture("mixed", True, splits=[3, 2, 4], chunk=5)


def test_decode_merges_split_attention_in_the_attention_dispatch(tune):
    """mqa_merge.on (the default): a layer whose decode attention splits its key lists merges the
    parts and removes V's RoPE in MQA_ATTENTION itself (merge=True, inverse_rope=True), so its decode
    step records one dispatch fewer than with the knob off (MQA_COMBINE after it); both match
    transformers."""
    def decode(on):
        tune({"mqa_merge.on": on})
        check_fixture("mixed", True, splits=[3, 2, 4], chunk=5)
        cfg, w, _ = fixture("mixed")
        m = Model(cfg, w, fused=True, splits=[3, 2, 4])
        cg = m.compiled("decode")
        merged = [n.params.get("merge", False) for n in cg.graph.nodes if n.op.name == "MQA_ATTENTION"]
        return cg.recording.n_dispatches, merged, sum(n.op.name == "MQA_COMBINE" for n in cg.graph.nodes)
    on, off = decode(True), decode(False)
    layers = len(on[1])
    assert layers == 3 and on[1] == [True] * layers and off[1] == [False] * layers
    assert (on[2], off[2]) == (0, layers)
    assert off[0] - on[0] == layers


@pytest.mark.parametrize("splits,chunk", [(None, 16), ([3, 2, 4], 3)])
def test_the_attention_gpus_run_matches_too(monkeypatch, tune, splits, chunk):
    """Attention lowered as on a GPU: the tiled kernel at decode (and for prefill chunks of ≤ 4
    tokens), the decode splits one tile each, merged and de-rotated in the attention's dispatch
    (mqa_merge.on; off by default, when MQA_COMBINE merges them, as the other model tests run)."""
    from dsv4_vk.ops import v4_attention
    monkeypatch.setattr(v4_attention, "is_cpu", lambda device: False)
    tune({"mqa_merge.on": True})
    lowered, lower = [], v4_attention.MqaAttention.lower

    def spy(self, node, device):
        launches = lower(self, node, device)
        lowered.extend((node.inputs[0].shape[0], "TILED" in ln.defines, "MERGE_ROPE" in ln.defines)
                       for ln in launches)
        return launches
    monkeypatch.setattr(v4_attention.MqaAttention, "lower", spy)
    check_fixture("mixed", True, splits=splits, chunk=chunk)
    assert lowered and all(tiled == (T <= v4_attention.TILED_MAX_TOKENS) for T, tiled, _ in lowered)
    assert any(T == 1 for T, _, _ in lowered)
    merged = [m for T, _, m in lowered if T == 1]    # decode: merged where a layer splits (all, with splits=)
    assert not any(m for T, _, m in lowered if T > 1) and (all(merged) if splits else any(merged))


def test_prefill_with_the_posts_carrying_the_mixes_matches_too(tune, monkeypatch):
    """PREFILL_CARRY: prefill chunks of 16 tokens (past CARRY_MAX_T) chain their sites through
    HC_POST_MIX in KSPLIT's layout and HC_MIX_REDUCE of the carried partials."""
    tune({"carry.prefill": True})
    cfg, w, e = fixture("mixed")
    m = Model(cfg, w, fused=True, prefill_chunk=16)
    m.prefill(e["prompt"])
    ops = [n.op.name for n in m.compiled("prefill").graph.nodes]
    n_sites = 2 * cfg.num_hidden_layers        # the head then starts from the last post's partials too
    assert ops.count("HC_POST_MIX") == n_sites and ops.count("HC_MIX_REDUCE") == n_sites, ops
    assert ops.count("HC_MIX") + ops.count("HC_MIX_PART") == 1, ops      # the first site's mixes only
    check_fixture("mixed", True, chunk=16)


@pytest.mark.parametrize("max_bytes", [0, 16384])
def test_decode_with_fewer_norms_folded_matches_too(tune, monkeypatch, max_bytes):
    """Norms left as RMS_NORM dispatches for mat-muls reading more than max_bytes of weights (0:
    every one; 16384: the small ones fold, the larger ones share one RMS_NORM per norm)."""
    cfg, w, e = fixture("mixed")

    def decode_nodes():
        m = Model(cfg, w, fused=True)
        m.prefill(e["prompt"])
        nodes = m.compiled("decode").graph.nodes
        return sum("rms_eps" in n.params for n in nodes), sum(n.op.name == "RMS_NORM" for n in nodes)
    all_folded, all_norms = decode_nodes()
    tune({"norm_fold.max_bytes": max_bytes})
    folded, norms = decode_nodes()
    assert (folded == 0) == (max_bytes == 0) and folded < all_folded and norms > all_norms
    check_fixture("mixed", True)


@pytest.mark.parametrize("name", ["mixed", "bf16"])
def test_decode_routes_each_layer_in_one_dispatch_and_matches_the_two_dispatch_router(tune, name):
    """V4_GATE at decode (the gate's logits, its norm folded in, and the selection in one dispatch):
    every MoE layer's router, hash and bias layers, over f32 and bf16 gates; one dispatch fewer per
    layer than MUL_MAT then V4_ROUTE (v4_gate.on off), and both match transformers."""
    cfg, w, e = fixture(name)
    gate = w["layers.0.ffn.gate.weight"]
    assert str(gate.dtype) == ("bfloat16" if name == "bf16" else "float32"), gate.dtype

    def decode():
        m = Model(cfg, w, fused=True)
        m.prefill(e["prompt"])
        cg = m.compiled("decode")
        return cg.recording.n_dispatches, [n.op.name for n in cg.graph.nodes]
    n_one, ops = decode()
    L = cfg.num_hidden_layers
    assert ops.count("V4_GATE") == L and "V4_ROUTE" not in ops
    tune({"v4_gate.on": False})
    n_two, ops = decode()
    assert ops.count("V4_ROUTE") == L and "V4_GATE" not in ops and n_two == n_one + L
    check_fixture(name, True)


def worker():
    """Subprocess entry: the fixture checks on both paths at this process's subgroup size."""
    from dsv4_vk.vk import default_device
    print(f"worker: subgroup size {default_device().subgroup_size}")
    for name in ("mixed", "bf16"):
        for fused in (True, False):
            err, paths = check_fixture(name, fused, splits=[2, 2, 2] if name == "mixed" else None)
            print(f"worker: {name} fused={fused} paths={sorted(paths)} worst nmse {err:.3g} ok")
    for fused, chunk in ((True, 7), (False, 32)):         # past the indexer's top-k
        err, paths = check_fixture("long", fused, chunk=chunk, max_ctx=1024)
        print(f"worker: long fused={fused} paths={sorted(paths)} worst nmse {err:.3g} ok")


@pytest.mark.parametrize("width,subgroup,site,paths", [
    (512, 16, "1", "['fused', 'fused:sg16', 'three-op']"),     # the three-op path (sg16 comb)
    (128, 4, "0", "['fused:site']")])                         # the whole-site kernels (posts carry the mixes)
def test_transformers_match_at_another_subgroup_size(width, subgroup, site, paths):
    env = dict(os.environ, LP_NATIVE_VECTOR_WIDTH=str(width), DSV4_VK_DISABLE_HC_SITE=site)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "test_model.py"), "worker"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert f"worker: subgroup size {subgroup}" in out, out
    for name in ("mixed", "bf16", "long"):
        assert f"{name} fused=True paths={paths} " in out, out
        assert f"{name} fused=False paths=['unfused'] " in out, out


def test_bf16_checkpoint_keeps_bf16_weights_on_the_device():
    cfg, w, _ = fixture("bf16")
    m = Model(cfg, w)
    assert m.ex.params["layers.0.attn.wx"].dtype_name == "bf16" and m.ex.params["layers.1.ffn.w13"].dtype_name == "bf16"
    assert m.ex.params["embed.weight"].dtype_name == "bf16" and m.ex.params["head.weight"].dtype_name == "bf16"
    assert m.ex.params["layers.0.hc_attn_fn"].dtype_name == "f32"          # F32 where the format is F32
    mem = m.memory()
    f32 = Model(cfg, {k: (v.astype(np.float32) if v.dtype.itemsize == 2 else v) for k, v in w.items()}).memory()
    assert mem["weights"]["bf16"] > 0 and mem["weights"]["bf16"] * 2 == f32["weights"]["f32"] - mem["weights"]["f32"]
    assert mem["total"] == sum(mem["weights"].values()) + mem["cache"]


# --- against the float64 reference ----------------------------------------------------------------------

def test_index_topk_above_64_over_a_long_prompt_matches_the_reference(rng):
    """CSA at rate 2 over 150 tokens: 75 entries, the indexer keeps 70 (more than the old 64 cap)."""
    cfg = TINY.replace(max_ctx=160, compress_rates={CSA: 2, HCA: 16}, index_topk=70, sliding_window=16)
    w = random_weights(cfg, int(rng.integers(0, 2 ** 31)))
    ids = rng.integers(0, cfg.vocab_size, 152)
    m = Model(cfg, w, prefill_chunk=32)
    got = np.concatenate([m.prefill(ids[:150], all_logits=True), m.step(int(ids[150]), output="logits")[None]])
    ref = V4Reference(cfg, w).forward(ids[:151])
    assert nmse(got, ref) <= NMSE_MAX and max_abs(got, ref) <= 1e-3 * np.abs(ref).max()


def test_csa_attends_over_every_entry_without_its_indexer_where_top_k_keeps_them_all(tune, rng, monkeypatch):
    """index_topk ≥ max_ctx // rate: the top-k keeps every entry that can close, so the CSA layer
    runs no indexer (no INDEX_SCORE or TOPK, its weights and cache not uploaded) and attends over
    every closed entry — against the float64 reference, which runs the indexer, and against the same
    model built with its indexer."""
    cfg = TINY.replace(index_topk=10)                       # CSA at rate 4, max_ctx 40: ≤ 10 entries
    w = random_weights(cfg, int(rng.integers(0, 2 ** 31)))
    ids = rng.integers(0, cfg.vocab_size, 36)

    def logits(m):
        rows = [m.prefill(ids[:21], all_logits=True)] + [m.step(int(t), output="logits")[None] for t in ids[21:]]
        return np.concatenate(rows)

    def ops(m):
        return {n.op.name for kind in ("prefill", "decode") for n in m.compiled(kind).graph.nodes}

    dense = Model(cfg, w, prefill_chunk=8)
    got = logits(dense)
    ref = V4Reference(cfg, w).forward(ids)
    assert nmse(got, ref) <= NMSE_MAX and max_abs(got, ref) <= 1e-3 * np.abs(ref).max()
    assert not {"INDEX_SCORE", "TOPK"} & ops(dense)
    assert not [n for n in dense.ex.params if ".indexer." in n or ".idx." in n]
    tune({"indexer.always": True})
    sparse = Model(cfg, w, prefill_chunk=8)
    assert {"INDEX_SCORE", "TOPK"} <= ops(sparse)
    assert nmse(logits(sparse), got) <= 1e-9
    assert sparse.memory()["weights"]["f32"] > dense.memory()["weights"]["f32"]


def test_the_indexer_scores_only_from_the_position_where_its_top_k_drops_entries(tune, rng, monkeypatch):
    """TINY's CSA layer (rate 4, top-3 of up to 10 entries): up to position 14 every closed entry is
    kept, so those chunks and steps run graphs without the indexer's scores and top-k (its keys are
    still compressed); from 15 on it scores. Against the float64 reference and against the model
    that scores everywhere; the profile counts one TOPK a step from position 15."""
    w = random_weights(TINY, int(rng.integers(0, 2 ** 31)))
    ids = rng.integers(0, TINY.vocab_size, 30)

    def logits(m):
        with profile.profile() as prof:
            rows = [m.prefill(ids[:9], all_logits=True)]
            with profile.phase("decode"):
                rows += [m.step(int(t), output="logits")[None] for t in ids[9:]]
        return np.concatenate(rows), prof.as_dict()["phases"]["decode"]["ops"]

    got, ops = logits(Model(TINY, w, prefill_chunk=8))
    ref = V4Reference(TINY, w).forward(ids)
    assert nmse(got, ref) <= NMSE_MAX and max_abs(got, ref) <= 1e-3 * np.abs(ref).max()
    assert ops["TOPK"]["dispatches"] == 29 - 15 + 1                   # the steps at positions 15..29
    tune({"indexer.always": True})
    everywhere, ops = logits(Model(TINY, w, prefill_chunk=8))
    assert ops["TOPK"]["dispatches"] == 29 - 9 + 1 and nmse(everywhere, got) <= 1e-9


def test_chunked_prefill_plus_decode_equals_recomputing_the_sequence(rng):
    weights = random_weights(TINY, int(rng.integers(0, 2 ** 31)))
    ids = rng.integers(0, TINY.vocab_size, 23)
    whole = Model(TINY, weights, prefill_chunk=16).prefill(ids, all_logits=True)
    m = Model(TINY, weights, prefill_chunk=4)
    rows = [m.prefill(ids[:9], all_logits=True)] + [m.step(int(t), output="logits")[None] for t in ids[9:19]]
    rows.append(m.prefill(ids[19:], all_logits=True))       # prefill again after decode steps
    assert nmse(np.concatenate(rows), whole) <= 1e-9
    m.reset()                                               # a new sequence overwrites the cache rows
    assert nmse(m.prefill(ids[:7], all_logits=True), whole[:7]) <= 1e-9


def test_prefill_runs_the_head_on_the_last_token_unless_all_logits_are_asked_for(rng):
    """The prefill graph runs the head (vocab × D, a chunk's largest mat-mul) on the chunk's last
    token only; prefill(all_logits=True) records the one over every token; the last rows agree."""
    cfg = TINY.replace(max_ctx=48)
    weights = random_weights(cfg, int(rng.integers(0, 2 ** 31)))
    ids = rng.integers(0, cfg.vocab_size, 19)
    m = Model(cfg, weights, prefill_chunk=8)
    last = m.prefill(ids)
    m.reset()
    every = m.prefill(ids, all_logits=True)
    assert last.shape == (cfg.vocab_size,) and every.shape == (19, cfg.vocab_size)
    assert np.isfinite(last).all() and np.abs(last).max() > 0
    assert nmse(last, every[-1]) <= (1e-12 if m.device.caps.is_cpu else 1e-6)
    heads = {all_logits: [n.output.shape for n in m.compiled("prefill", all_logits=all_logits).graph.nodes
                          if n.op.name == "MUL_MAT" and n.output.shape[-1] == cfg.vocab_size]
             for all_logits in (False, True)}
    assert heads == {False: [(1, cfg.vocab_size)], True: [(8, cfg.vocab_size)]}, heads


def test_any_prefill_chunk_and_the_devices_default_give_the_same_logits_with_progress(rng):
    """prefill_chunk=None takes the device type's knob (prefill_chunk.cpu / .gpu); chunks of 1,
    7, 128 and 512 (past max_ctx: clamped) and the default agree; progress sees every chunk end."""
    cfg = TINY.replace(max_ctx=48)
    weights = random_weights(cfg, int(rng.integers(0, 2 ** 31)))
    ids = rng.integers(0, cfg.vocab_size, 30)
    default = Model(cfg, weights)
    chunk = min(48, 16 if default.device.caps.is_cpu else 512)          # the knobs' defaults, within max_ctx
    # chunks of T ≥ coopmat.min_tokens take the matrix units' fp16 products where the device has them
    bound = 1e-9 if default.device.caps.is_cpu else 1e-6
    assert default.prefill_chunk == chunk
    seen = []
    ref = default.prefill(ids, all_logits=True, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(min(s + chunk, 30), 30) for s in range(0, 30, chunk)]
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for chunk in (1, 7, 128, 512):
        m = Model(cfg, weights, prefill_chunk=chunk)
        assert m.prefill_chunk == min(chunk, 48)
        assert nmse(m.prefill(ids, all_logits=True), ref) <= bound
    m = Model(cfg, weights, tuning=Tuning({"prefill_chunk.cpu": 7, "prefill_chunk.gpu": 7}))
    assert m.prefill_chunk == 7
    assert nmse(m.prefill(ids, all_logits=True), ref) <= bound
    for bad in (0, -3, 2.5, True, "16"):
        with pytest.raises(ValueError, match="prefill_chunk must be an integer"):
            Model(cfg, weights, prefill_chunk=bad)
    with pytest.raises(ValueError, match=r"tuning knob 'prefill_chunk\.(cpu|gpu)' must be an integer"):
        Model(cfg, weights, tuning=Tuning({"prefill_chunk.cpu": 0, "prefill_chunk.gpu": 0}))
    with pytest.raises(ValueError, match="progress must be a callable"):
        default.prefill(ids, progress=5)


def test_greedy_tokens_agree_on_both_paths_and_are_the_reference_argmax(rng):
    weights = random_weights(TINY, int(rng.integers(0, 2 ** 31)))
    prompt = rng.integers(0, TINY.vocab_size, 9)
    runs = {f: list(Model(TINY, weights, fused=f, prefill_chunk=8).generate(prompt, 16)) for f in (True, False)}
    assert runs[True] == runs[False] and len(runs[True]) == 16
    seq = np.concatenate([prompt, runs[True]])
    ref = V4Reference(TINY, weights).forward(seq[:-1])[len(prompt) - 1:]
    picked = ref[np.arange(16), runs[True]]
    assert np.all(picked >= ref.max(axis=1) - 1e-5), "a greedy token is not the argmax of the float64 logits"


def test_seeded_sampling_repeats_and_agrees_on_both_paths(rng):
    weights = random_weights(TINY, int(rng.integers(0, 2 ** 31)))
    prompt = rng.integers(0, TINY.vocab_size, 4)
    s = Sampling(temperature=1.2, top_k=8, seed=int(rng.integers(0, 2 ** 31)))
    fused, unfused = Model(TINY, weights, fused=True), Model(TINY, weights, fused=False)
    a, b = list(fused.generate(prompt, 12, s)), list(fused.generate(prompt, 12, s))
    assert a == b                                           # generate reseeds: reproducible
    assert list(unfused.generate(prompt, 12, s)) == a


# --- runtime ----------------------------------------------------------------------------------------------

def test_decode_replays_one_recording_and_updates_the_cache_on_the_device(monkeypatch, rng):
    m = Model.load(TINY, seed=int(rng.integers(0, 2 ** 31)))
    # the decode cache's rings: raw rows for the window plus a chunk, projection rows for a window pair
    assert m.ex.params["layers.0.kv"].shape == (TINY.sliding_window + 16 - 1, TINY.head_dim)
    assert m.ex.params["layers.0.cmp.state"].shape == (2 * 4 + 16 - 1, 4 * TINY.head_dim)
    assert m.ex.params["layers.1.cmp.state"].shape == (8 + 16 - 1, 2 * TINY.head_dim)
    m.prefill(rng.integers(0, TINY.vocab_size, 3))
    m.step()
    # positions 3..13: every CSA top-k keeps all closed entries, the decode graph without scoring
    from dsv4_vk.model.params import all_entries_fit
    assert all_entries_fit(TINY, 13) and not all_entries_fit(TINY, 15)
    cg = m.compiled("decode", dense=True)
    rec, n, submits = cg.recording, cg.recording.n_dispatches, cg.recording.n_submits
    # windows 1, 2 already hold the entries the prefill's padded chunk made for positions past the prompt
    # (pad token 0): the steps would write the same values again where they sample token 0, so mark them
    ent = m.ex.params["layers.0.cmp.ent"]
    sentinel = np.full((2, ent.shape[1]), 1e30, np.float32)
    ent.write(sentinel, start=ent.shape[1])
    before = ent.read()

    def no_recording(*a, **k):
        raise AssertionError("a decode step recorded commands")
    monkeypatch.setattr(executor_module, "record_graph", no_recording)
    monkeypatch.setattr(executor_module.CompiledGraph, "__init__", no_recording)
    for _ in range(10):
        m.step()
    assert m.compiled("decode", dense=True) is cg and cg.recording is rec
    assert rec.n_dispatches == n and rec.n_submits == submits + 10
    assert m.position == 14
    after = ent.read()
    # positions 4..13 closed CSA windows 1, 2 (rate 4): written by the replayed steps, 0 untouched
    assert np.array_equal(after[0], before[0]) and np.isfinite(after[1:3]).all() and (np.abs(after[1:3]) < 1e29).all()


# --- multi-step decode -----------------------------------------------------------------------------------------

def one_step_run(sampling, prompt, n, stop=(), k=1, take=None):
    """(tokens, position, the next step's token, sampler counter) after generate(..., steps_per_submit=k);
    `take`: stop iterating after that many tokens (the generator is closed)."""
    m = Model.load(TINY, seed=3, prefill_chunk=8)
    gen = m.generate(prompt, n, sampling, stop=set(stop), steps_per_submit=k)
    toks = []
    for t in gen:
        toks.append(t)
        if take is not None and len(toks) == take:
            gen.close()
            break
    counter = int(m.ex.params["sampler.state"].read_at(1)[0])
    return toks, m.position, m.step(), counter


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, top_k=8, seed=11)], ids=["greedy", "seeded"])
def test_multi_step_generate_equals_one_step(sampling, rng):
    """K steps per submit give the tokens of one step per submit, and leave the model where one-step
    decoding would (position, fed-back token, sampler counter: the next step agrees), after running
    out, after a stop token in the middle of a batch and after the caller stops taking tokens."""
    prompt = [int(t) for t in rng.integers(0, TINY.vocab_size, 5)]
    ref = one_step_run(sampling, prompt, 14)
    assert len(ref[0]) == 14 and ref[1] == 5 + 13
    for k in (3, 8):
        assert one_step_run(sampling, prompt, 14, k=k) == ref, k
    stop = ref[0][6]
    first = ref[0].index(stop)
    ref_stop = one_step_run(sampling, prompt, 14, stop=[stop])
    assert ref_stop[0] == ref[0][:first + 1]
    for k in (4, 8):
        assert one_step_run(sampling, prompt, 14, stop=[stop], k=k) == ref_stop, k
        assert one_step_run(sampling, prompt, 14, k=k, take=5) == one_step_run(sampling, prompt, 14, take=5), k


def test_steps_submits_once_per_k_steps_and_stops_at_the_context(rng):
    m = Model.load(TINY, seed=2, prefill_chunk=8)
    prompt = rng.integers(0, TINY.vocab_size, 4)
    m.prefill(prompt)
    one = Model.load(TINY, seed=2, prefill_chunk=8)
    one.prefill(prompt)
    expected = [one.step() for _ in range(TINY.max_ctx - 4)]
    toks = m.steps(5)                       # positions 4..8: no layer's top-k drops an entry yet
    cg = m._graphs[("decode", 5, True, False)]
    per_step = m.compiled("decode", dense=True).recording.n_dispatches
    assert cg.recording.n_submits == 1 and cg.recording.n_dispatches == 5 * (per_step + 1)    # + STORE_AT
    toks += m.steps(5)
    assert cg.recording.n_submits == 2 and m.position == 14
    while m.position < TINY.max_ctx:
        toks += m.steps(100)                  # at most prefill_chunk (8) per submit, clamped at the end
    assert toks == expected and m.position == TINY.max_ctx
    with pytest.raises(ValueError, match="sequence is full"):
        m.steps(1)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="k must be an integer ≥ 1"):
            m.steps(bad)
    with pytest.raises(ValueError, match="steps_per_submit must be an integer ≥ 1"):
        m.generate([1], 3, steps_per_submit=0)


def test_profile_splits_prefill_and_decode(rng):
    m = Model.load(TINY, seed=1)
    with profile.profile() as prof:         # past position 15 the CSA indexer scores (TOPK below)
        list(m.generate(rng.integers(0, TINY.vocab_size, 16), 4, steps_per_submit=1))
    d = prof.as_dict()["phases"]
    assert d["prefill"]["runs"] == 1 and d["decode"]["runs"] == 3    # one 16-token chunk
    assert d["decode"]["dispatches"] == 3 * (m.compiled("decode").recording.n_dispatches + 1)    # + STORE_AT
    ops = " ".join(d["decode"]["ops"])
    for op in ("MQA_ATTENTION", "COMPRESS", "TOPK", "V4_GATE", "MUL_MAT_ID", "SAMPLE", "HC_SITE"):
        assert op in ops, (op, ops)
    assert "V4_ROUTE" not in ops and "V4_ROUTE" in " ".join(d["prefill"]["ops"])    # decode routes in one dispatch


def test_max_ctx_sets_the_cache_and_its_bytes_are_known_before_allocating(rng):
    """Model(..., max_ctx=) and Model.load(config, max_ctx=) size the cache; check_memory's bytes
    (computed before anything is allocated) are the bytes the cache params take on the device."""
    from dsv4_vk.model.placement import check_memory
    w = random_weights(TINY, 0)
    m = Model(TINY, w, max_ctx=96)
    assert m.cfg.max_ctx == 96 and m.ex.params["layers.0.cmp.ent"].shape == (24, TINY.head_dim)
    need = check_memory(m.cfg, 0, m.prefill_chunk, m.device)
    assert need["cache"] == m.memory()["cache"] and need["available"] > 0
    assert Model.load(TINY, max_ctx=72).cfg.max_ctx == 72
    ids = rng.integers(0, TINY.vocab_size, 60)                   # positions past 40, within 96
    assert nmse(m.prefill(ids, all_logits=True), V4Reference(m.cfg, w).forward(ids)) <= NMSE_MAX
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match=f"max_ctx must be an integer ≥ 1, got {bad!r}"):
            Model(TINY, w, max_ctx=bad)


def test_a_step_far_into_a_million_position_cache_reads_only_what_exists(rng):
    """The same cache rows up to position 5000 in a cache of 5040 positions and in one of 2^20: a
    prefill chunk and decode steps there give the same logits (the rows past the position, zeros
    in the large cache, would win the indexer's top-k if they were scored, and HCA would attend
    them if they were read)."""
    w = random_weights(TINY, int(rng.integers(0, 2 ** 31)))
    P = 5000
    small, big = Model(TINY, w, max_ctx=P + 40, prefill_chunk=4), Model(TINY, w, max_ctx=1 << 20, prefill_chunk=4)
    for name in small.ex.params:
        if name.startswith("layers.") and name.endswith((".kv", ".state", ".ent")):
            rows = rng.standard_normal(small.params[name].shape).astype(np.float32)
            small.ex.set_param(name, rows)
            full = np.zeros(big.params[name].shape, np.float32)
            full[:len(rows)] = rows
            big.ex.set_param(name, full)
    ids = rng.integers(0, TINY.vocab_size, 7)
    out = []
    for m in (small, big):
        m.position = P
        out.append(np.concatenate([m.prefill(ids[:4], all_logits=True)] +
                                  [m.step(int(t), output="logits")[None] for t in ids[4:]]))
    assert np.isfinite(out[0]).all() and nmse(out[1], out[0]) <= 1e-10


def test_a_cache_too_large_for_the_device_is_refused_naming_the_bytes():
    """max_ctx = 10⁹ (or any cache past the device's heap) is refused before anything is allocated,
    naming max_ctx, the bytes needed and the bytes available; a tensor past the device's binding
    range is refused naming it (a stand-in device with a small heap and range shows both)."""
    from types import SimpleNamespace
    from dsv4_vk.model.placement import check_memory
    from dsv4_vk.vk.caps import MemoryHeap
    heap = Model.load(TINY, max_ctx=40).device.caps.memory_heaps
    have = max(h.size for h in heap if h.device_local)
    for make in (lambda: Model.load(TINY, max_ctx=10 ** 9), lambda: Model(TINY, random_weights(TINY, 0), max_ctx=10 ** 9)):
        with pytest.raises(ValueError, match=rf"max_ctx = 1000000000 needs \d+ bytes of device memory \(\d+ for the "
                                             rf"decode cache and RoPE tables, \d+ for the weights\); .* has {have} "
                                             rf"bytes available .*max_ctx at most about \d+ fits"):
            make()

    def stub(heap_bytes, range_bytes):
        return SimpleNamespace(name="stub", caps=SimpleNamespace(memory_heaps=(MemoryHeap(heap_bytes, True),),
                                                                  limits=SimpleNamespace(max_storage_buffer_range=range_bytes)))
    cfg = TINY.replace(max_ctx=4096)
    need = check_memory(cfg, 1000, 16, stub(1 << 30, 1 << 30))
    assert need["total"] == need["cache"] + 1000
    with pytest.raises(ValueError, match=rf"max_ctx = 4096 needs {need['total']} bytes .* stub has {need['total'] - 1} "
                                         r"bytes available \(its largest device-local heap\); max_ctx at most about 40\d\d fits"):
        check_memory(cfg, 1000, 16, stub(need["total"] - 1, 1 << 30))
    with pytest.raises(ValueError, match=r"max_ctx = 4096: \S+ would take 65536 bytes, past stub's maxStorageBufferRange "
                                         r"of 65535 bytes \(each tensor is bound whole\); max_ctx at most about 409\d fits"):
        check_memory(cfg, 1000, 16, stub(1 << 30, 65535))


def test_api_errors_name_the_argument():
    m = Model.load(TINY, seed=0)
    for bad, msg in (([], "ids must be a non-empty 1-D"), ([1.5], "integer token ids"), ([3, 48], "outside \\[0, 48\\)"),
                     (list(range(41)), "exceed max_ctx 40")):
        with pytest.raises(ValueError, match=msg):
            m.prefill(bad)
    with pytest.raises(ValueError, match="max_new_tokens: 38 prompt \\+ 4 new tokens exceed max_ctx 40"):
        m.generate(list(range(38)), 4)
    with pytest.raises(ValueError, match="token holds ids outside"):
        m.step(99)
    with pytest.raises(ValueError, match="output must be 'token' or 'logits'"):
        m.step(output="probs")
    with pytest.raises(ValueError, match="num_experts_per_tok \\(5\\) exceeds n_routed_experts \\(4\\)"):
        TINY.replace(num_experts_per_tok=5)
    with pytest.raises(ValueError, match="fused must be None"):
        Model.load(TINY, fused="yes")
    with pytest.raises(ValueError, match="cfg must be a V4Config"):
        Model({"hidden_size": 4}, {})
    m.reset()
    m.prefill(list(range(40)))
    with pytest.raises(ValueError, match="sequence is full"):
        m.step()


def test_a_stale_generator_raises_and_leaves_the_new_sequence_alone(rng):
    """A generator made before reset() or another generate() raises on its next token (its tokens would
    come from the new sequence's state), and closing it does not rewind the new sequence."""
    m = Model.load(TINY, seed=5, prefill_chunk=8)
    prompt = [int(t) for t in rng.integers(0, TINY.vocab_size, 4)]
    ref = list(Model.load(TINY, seed=5, prefill_chunk=8).generate(prompt, 10, steps_per_submit=3))
    for change in ("reset", "generate", "prefill", "step"):
        old = m.generate(prompt, 10, steps_per_submit=3)
        assert next(old) == ref[0]
        new = m.generate(prompt, 10, steps_per_submit=3) if change == "generate" else None
        if change == "reset":
            m.reset()
        elif change in ("prefill", "step"):
            m.step(1) if change == "step" else m.prefill([1])
        with pytest.raises(RuntimeError, match="stale"):
            next(old)
        if new is not None:
            got = [next(new) for _ in range(3)]
            position = m.position
            old.close()                                      # closing the stale one rewinds nothing
            del old
            assert m.position == position
            assert got + list(new) == ref, change
    # a generator made and not started yet is stale too once another one begins
    first = m.generate(prompt, 3)
    assert list(m.generate(prompt, 10, steps_per_submit=3)) == ref
    with pytest.raises(RuntimeError, match="stale"):
        next(first)


def test_generate_can_continue_the_sequence(rng):
    """continue_sequence=True: the prompt runs after what the sequence holds (a conversation's next
    turn), as if both had been one prompt; the context check counts the tokens held."""
    a, b = ([int(t) for t in rng.integers(0, TINY.vocab_size, n)] for n in (5, 4))
    ref = list(Model.load(TINY, seed=5, prefill_chunk=8).generate(a + b, 6))
    m = Model.load(TINY, seed=5, prefill_chunk=8)
    m.prefill(a)
    assert list(m.generate(b, 6, continue_sequence=True)) == ref and m.position == 9 + 5
    with pytest.raises(ValueError, match=f"max_new_tokens: 14 tokens held \\+ 4 prompt \\+ {TINY.max_ctx - 16} new"):
        m.generate(b, TINY.max_ctx - 16, continue_sequence=True)
    with pytest.raises(ValueError, match="continue_sequence must be True or False"):
        m.generate(b, 1, continue_sequence=1)


def test_generate_without_sampling_is_greedy_every_time(rng):
    prompt = [int(t) for t in rng.integers(0, TINY.vocab_size, 4)]
    greedy = list(Model.load(TINY, seed=6).generate(prompt, 8))
    m = Model.load(TINY, seed=6)
    hot = Sampling(temperature=5.0, top_k=40, seed=9)
    sampled = list(m.generate(prompt, 8, hot))
    assert sampled != greedy                   # (else the next asserts could not tell the two apart)
    assert list(m.generate(prompt, 8)) == greedy
    m.set_sampling(hot)
    m.reset()
    assert list(m.generate(prompt, 8, None)) == greedy
    assert m.sampling == Sampling()


def test_step_before_any_prompt_is_refused():
    m = Model.load(TINY, seed=0)
    for call in (m.step, lambda: m.steps(2)):
        with pytest.raises(ValueError, match="no prompt yet"):
            call()
    assert m.position == 0
    m.step(3)                                 # a token given is a prompt of one
    m.step()
    m.reset()
    with pytest.raises(ValueError, match="no prompt yet"):
        m.step()
    m.prefill([1, 2])
    m.steps(2)


@pytest.mark.parametrize("splits, message", [
    ([1, 1], "splits has 2 entries: expected one per layer, num_hidden_layers = 3"),
    ([1, 1, 1, 1], "splits has 4 entries"),
    ([1, 1000, 1], "integers from 1 to 64"), ([0, 1, 1], "integers from 1 to 64"), ([1, 2.0, 1], "from 1 to 64"),
    (4, "sequence of 3 integers"), ("111", "sequence of 3 integers")])
def test_splits_are_bounded_and_one_per_layer(splits, message):
    with pytest.raises(ValueError, match=message):
        Model.load(TINY, seed=0, splits=splits)


@pytest.mark.parametrize("device", ["cpu", 0, "llvmpipe"])
def test_device_that_is_not_a_device_is_explained(device):
    with pytest.raises(ValueError, match="device must be a dsv4_vk.Device .*got " + repr(device)):
        Model.load(TINY, device=device)


def validation_worker():
    """Subprocess entry (DSV4_VK_VALIDATION=1): prefill, decode and sampling on both paths."""
    from dsv4_vk.vk import default_device
    dev = default_device()
    assert dev.validation
    for fused in (True, False):
        m = Model.load(TINY.replace(max_ctx=16), fused=fused, prefill_chunk=4, splits=[2, 1, 2])
        print(f"fused={fused} tokens {list(m.generate([1, 2, 3, 4, 5], 6, Sampling(1.0, 5, 3)))}")
    for sev, msg in dev.validation_messages:
        print(sev, msg[:400])
    print("messages", len(dev.validation_messages))


def test_model_graphs_are_clean_under_the_validation_layer():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "test_model.py"), "validation"], cwd=ROOT,
                       env=dict(os.environ, DSV4_VK_VALIDATION="1"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    assert r.stdout.count(" tokens [") == 2 and r.stdout.strip().endswith("messages 0"), r.stdout


# --- demo and tools -------------------------------------------------------------------------------------------

def test_demo_writes_and_loads_a_checkpoint_and_generates_the_same_tokens_on_both_paths(capsys, tmp_path):
    from dsv4_vk.cli import demo
    assert demo.main(["--tokens", "6", "--prompt", "3", "--out", str(tmp_path / "ck"), "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "same tokens on both paths: yes" in out and "MiB bf16" in out
    for word in ("tokens/s", "dispatches/token", "prefill", "decode", "HC_COMB", "MQA_ATTENTION"):
        assert word in out
    assert (tmp_path / "ck" / "config.json").exists()


def test_make_checkpoint_tool_and_the_gpu_bench_dry_run(tmp_path):
    from dsv4_vk.model.checkpoint import BF16
    from dsv4_vk.model.config import preset
    path = tmp_path / "c"
    r = subprocess.run([sys.executable, "tools/make_checkpoint.py", "--out", str(path), "--preset", "demo", "--set",
                        "index_topk=70", "--set", "scoring_func=sigmoid", "--dtype", "bf16", "--naming", "deepseek",
                        "--shards", "2", "--seed", "4"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(path)) == ["config.json", "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    cfg, w = load_hf(str(path), max_ctx=128)
    assert cfg == preset("demo", index_topk=70, scoring_func="sigmoid")
    want = random_weights(cfg, 4, BF16)
    assert w.keys() == want.keys() and all(np.array_equal(w[k], want[k]) for k in w)
    r = subprocess.run([sys.executable, "tools/make_checkpoint.py", "--out", str(tmp_path / "d"), "--set",
                        "hc_mult=2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "hc_mult must be 4" in r.stderr
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "tools/model_gpu_bench.py", "--quick", "--out", str(out),
                        "--variants", "fold_mb=0;gate=0", "--offload-layers", "1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    moved = res["decode_offload"]["1"]                   # layer 0's routed experts in host memory: same graph
    assert moved["same_tokens_as_fused"] and moved["offloaded_layers"] == [0]
    assert moved["dispatches_per_token"] == res["decode"]["fused"]["dispatches_per_token"]
    assert 0 < moved["bus_bytes_per_token"] < moved["host_weight_bytes"] == sum(moved["device_memory_bytes"]["host"].values())
    assert res["decode"]["fused"]["dispatches_per_token"] < res["decode"]["unfused"]["dispatches_per_token"]
    unfolded = res["decode_variants"]["fold_mb=0"]       # every norm its own dispatch: more of them, same tokens
    assert unfolded["same_tokens_as_fused"]
    assert unfolded["dispatches_per_token"] > res["decode"]["fused"]["dispatches_per_token"]
    two = res["decode_variants"]["gate=0"]               # MUL_MAT then V4_ROUTE: one dispatch more a layer
    assert two["same_tokens_as_fused"] and two["dispatches_per_token"] > res["decode"]["fused"]["dispatches_per_token"]
    r = subprocess.run([sys.executable, "tools/model_gpu_bench.py", "--quick", "--out", str(out),
                        "--variants", "fold=1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown knob 'fold'" in r.stderr
    r = subprocess.run([sys.executable, "tools/model_gpu_bench.py", "--quick", "--out", str(out),
                        "--offload-layers", "2,x"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--offload-layers must be comma-separated layer counts, got '2,x'" in r.stderr
    pre = tmp_path / "prefill.json"
    r = subprocess.run([sys.executable, "tools/model_gpu_bench.py", "--quick", "--out", str(pre), "--prefill-variants",
                        "chunk=32,coopmat=1,cm_pass=1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    prefill = json.loads(pre.read_text())["prefill"]
    assert set(prefill) == {"default", "chunk=32,coopmat=1,cm_pass=1"}
    assert all(v["tokens_per_s"] > 0 and v["mul_mat_kernels"] for v in prefill.values())
    assert prefill["chunk=32,coopmat=1,cm_pass=1"]["knobs"] == {"prefill_chunk.gpu": 32, "coopmat.auto": True,
                                                                "coopmat.scales": "pass"}
    assert res["same_greedy_tokens"] and set(res["host"]) == {"2", "8"} and res["dtype"] == "bf16"
    assert res["decode"]["fused"]["device_memory_bytes"]["weights"]["bf16"] > 0


if __name__ == "__main__":
    {"worker": worker, "validation": validation_worker}[sys.argv[1]]()
