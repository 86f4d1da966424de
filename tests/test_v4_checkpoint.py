"""DeepSeek-V4 checkpoints (config.json + safetensors) and the float64 reference against the
transformers fixtures (tests/fixtures/dsv4_*, written by tools/make_dsv4_fixtures.py)."""
import contextlib
import json
import os
import re
import resource
import shutil
import struct

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from dsv4_vk.model.checkpoint import CheckpointError, canonical, load_hf, quantisable, save_hf, tensor_shapes
from dsv4_vk.model.config import (INDEXER_KEYS, LEGACY_RATIO, MAX_LAYERS, SIZE_KEYS, ConfigError, V4Config,
                                  load_config_json, preset)
from dsv4_vk.model.reference import V4Reference

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
NAMES = ("mixed", "bf16")


def nmse(a, b):
    return float(np.sum((np.asarray(a, np.float64) - b) ** 2) / np.sum(np.asarray(b, np.float64) ** 2))


def expected(name):
    e = np.load(os.path.join(FIX, f"dsv4_{name}", "expected.npz"))
    return {k: e[k] for k in e.files}


@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_transformers(name):
    cfg, w = load_hf(os.path.join(FIX, f"dsv4_{name}"))
    e = expected(name)
    n = len(e["prompt"])
    out = V4Reference(cfg, w).forward(np.concatenate([e["prompt"], e["decode"]]))
    for what, got, want in (("prefill", out[:n], e["prefill"]), ("decode", out[n:], e["steps"])):
        assert nmse(got, want) <= 1e-10, what
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), what


def test_save_pretrained_dirs_load_with_their_dtypes():
    cfg, w = load_hf(os.path.join(FIX, "dsv4_bf16"))          # 5 shards + index, BF16 linears
    assert w["layers.0.attn.wq_a.weight"].dtype == ml_dtypes.bfloat16
    assert w["layers.0.ffn.experts.w13"].dtype == ml_dtypes.bfloat16
    assert w["layers.0.ffn.experts.w13"].shape == (4, 32, 32)
    assert w["layers.0.attn.attn_sink"].dtype == np.float32
    assert w["layers.1.ffn.gate.tid2eid"].dtype == np.int32
    assert cfg.layer_types[0] == "heavily_compressed_attention" and cfg.mlp_layer_types[1] == "hash_moe"
    cfg2, w2 = load_hf(os.path.join(FIX, "dsv4_mixed"))
    assert cfg2.yarn["factor"] == 4.0 and w2["embed.weight"].dtype == np.float32


@pytest.mark.parametrize("naming,shards", [("deepseek", 1), ("save_pretrained", 3)])
def test_write_read_round_trip(tmp_path, naming, shards):
    cfg, w = load_hf(os.path.join(FIX, "dsv4_bf16"))
    save_hf(str(tmp_path), cfg, w, naming=naming, shards=shards)
    cfg2, w2 = load_hf(str(tmp_path), max_ctx=cfg.max_ctx)
    assert cfg2 == cfg and set(w2) == set(w)
    for k in w:
        assert w2[k].dtype == w[k].dtype and np.array_equal(w2[k].view(np.uint8), w[k].view(np.uint8)), k


@pytest.mark.parametrize("name", NAMES)
def test_transformers_in_memory_names_load_too(tmp_path, name):
    """state_dict_shapes.json: the names and shapes of transformers' own state_dict (stacked experts,
    self_attn.*, mlp.*), the third naming: they map one to one onto the canonical set, and a file
    written in them loads to the same weights."""
    d = os.path.join(FIX, f"dsv4_{name}")
    cfg, w = load_hf(d)
    with open(os.path.join(d, "state_dict_shapes.json")) as f:
        sd = json.load(f)
    mapped = {canonical(k): tuple(v) for k, v in sd.items()}
    assert len(mapped) == len(sd) and mapped == {k: tuple(v) for k, v in tensor_shapes(cfg).items()}
    out = tmp_path / "m"
    out.mkdir()
    shutil.copy(os.path.join(d, "config.json"), out / "config.json")
    named = {k: (w[canonical(k)].astype(np.int64) if k.endswith("tid2eid") else w[canonical(k)]) for k in sd}
    save_file(named, str(out / "model.safetensors"))
    cfg2, w2 = load_hf(str(out))
    assert cfg2 == cfg and all(w2[k].dtype == w[k].dtype and np.array_equal(w2[k], w[k]) for k in w)


def _copy(tmp_path, name="dsv4_mixed"):
    d = tmp_path / "m"
    shutil.copytree(os.path.join(FIX, name), d)
    return d


def _rewrite(d, edit):
    """Rewrite model.safetensors with edit({name: array}) applied."""
    from safetensors.numpy import load_file
    t = load_file(str(d / "model.safetensors"))
    edit(t)
    save_file(t, str(d / "model.safetensors"))


def _raw_file(path, tensors):
    """A safetensors file from {name: (dtype string, shape, raw bytes)}: dtypes numpy lacks (FP8)."""
    header, off, blobs = {}, 0, []
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_fp8_without_scale_and_scale_of_a_float_weight_refused_naming_them(tmp_path):
    from safetensors.numpy import load_file
    d = _copy(tmp_path)
    t = load_file(str(d / "model.safetensors"))
    raw = {k: ({np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[v.dtype], v.shape, v.tobytes())
           for k, v in t.items()}
    raw["model.layers.0.attn.wq_a.weight"] = ("F8_E4M3", (16, 32), bytes(16 * 32))
    _raw_file(d / "model.safetensors", raw)
    with pytest.raises(CheckpointError, match=r"quantised tensor 'model\.layers\.0\.attn\.wq_a\.weight' \(F8_E4M3\) "
                                              r"has no scale"):
        load_hf(str(d))
    raw["model.layers.0.attn.wq_a.weight"] = ("F32", (16, 32), bytes(16 * 32 * 4))
    raw["model.layers.0.attn.wq_a.scale"] = ("F32", (1, 1), bytes(4))
    _raw_file(d / "model.safetensors", raw)
    with pytest.raises(CheckpointError, match=r"scale 'model\.layers\.0\.attn\.wq_a\.scale' belongs to .*F32, not "
                                              r"quantised"):
        load_hf(str(d))


def test_missing_and_misshaped_tensors_named(tmp_path):
    d = _copy(tmp_path)
    _rewrite(d, lambda t: (t.pop("model.layers.1.attn.compressor.ape"),
                           t.update({"model.norm.weight": np.ones(31, np.float32)})))
    with pytest.raises(CheckpointError) as e:
        load_hf(str(d))
    assert "missing tensor 'layers.1.attn.compressor.ape' (expected shape [8, 32])" in str(e.value)
    assert "tensor 'norm.weight' has shape [31], expected [32]" in str(e.value)


def test_tid2eid_out_of_range_refused(tmp_path):
    d = _copy(tmp_path)
    _rewrite(d, lambda t: t["model.layers.0.ffn.gate.tid2eid"].__setitem__((3, 1), 9))
    with pytest.raises(CheckpointError, match=r"tid2eid.*outside \[0, 4\).*9"):
        load_hf(str(d))


def _craft(path, header, data_len):
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"\0" * data_len)


@pytest.mark.parametrize("header,data_len,what", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, 12, "overlapping"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8, "past the end"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8, "size mismatch"),
])
def test_bad_offsets_refused(tmp_path, header, data_len, what):
    d = _copy(tmp_path)
    _craft(d / "model.safetensors", header, data_len)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
        load_hf(str(d))


def test_truncated_file_and_bad_index_refused(tmp_path):
    d = _copy(tmp_path)
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):
        load_hf(str(d))
    d2 = _copy(tmp_path / "x", "dsv4_bf16")
    idx = json.loads((d2 / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.norm.weight"] = "model-00001-of-00005.safetensors"
    (d2 / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match=r"index names tensor\(s\) \['model.norm.weight'\]|in both"):
        load_hf(str(d2))


@pytest.mark.parametrize("key,value,match", [
    ("scoring_func", "tanh", r"scoring_func 'tanh' not supported"),
    ("hc_mult", 2, r"hc_mult must be 4"),
    ("layer_types", ["sliding_attention"], r"layer_types has 1 entries, num_hidden_layers is 3"),
    ("mlp_layer_types", ["moe", "moe", "dense"], r"mlp_layer_types entries must be one of"),
    ("rope_parameters", {"rope_type": "longrope"}, r"compress rope_type 'longrope' not supported"),
    ("n_shared_experts", 2, r"n_shared_experts 2"),
    ("frobnicate", 1, r"unsupported key\(s\) \['frobnicate'\]"),
    ("head_dim", 30, r"rope dim .* = 7 must be even"),
])
def test_config_json_errors_name_the_key(tmp_path, key, value, match):
    d = _copy(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        load_hf(str(d))


# every key config.json may hold, given a wrong value of each JSON kind: a ConfigError naming that key
_WRONG = ("x", -1, 2.5, True, [1], {"a": 1}, float("nan"), 1e-60, 10 ** 30)
_LEGACY = {"compress_ratios": [4, 128, 0], "num_hash_layers": 1, "qk_rope_head_dim": 8, "compress_rate_csa": 4,
           "compress_rate_hca": 128, "max_position_embeddings": 64}


@pytest.mark.parametrize("legacy", [False, True], ids=["layer_types", "legacy"])
def test_every_config_value_error_is_a_config_error_naming_its_key(legacy):
    base = preset("tiny").to_hf()
    if legacy:                      # the per-layer lists come from the legacy keys (and the defaults)
        base = {k: v for k, v in base.items() if k not in ("layer_types", "mlp_layer_types", "partial_rotary_factor",
                                                          "compress_rates")}
        base.update(_LEGACY)
    for key in sorted(set(base) | set(_LEGACY)):
        for value in _WRONG:
            try:
                V4Config.from_hf(dict(base, **{key: value}))
            except ConfigError as e:
                assert key in str(e), (key, value, str(e))
            except Exception as e:               # noqa: BLE001 (the test is that nothing else escapes)
                pytest.fail(f"{key}={value!r}: {type(e).__name__}: {e}")


@pytest.mark.parametrize("key, value, match", [
    ("rms_norm_eps", 1e-60, r"config rms_norm_eps must be a finite number from 1\.4e-45 that float32 holds"),
    ("hc_eps", 0.0, r"config hc_eps must be"), ("swiglu_limit", 1e300, r"config swiglu_limit must be .* float32"),
    ("hc_sinkhorn_iters", 5000, r"config hc_sinkhorn_iters must be at most 1000"),
    ("hc_sinkhorn_iters", 0, r"config hc_sinkhorn_iters must be an integer ≥ 1"),
    ("compress_rate_csa", 0, r"config compress_rate_csa must be an integer ≥ 1"),
    ("max_position_embeddings", "long", r"config max_position_embeddings must be an integer"),
])
def test_config_values_the_kernels_cannot_take_are_named_by_their_key(key, value, match):
    with pytest.raises(ConfigError, match=match):
        V4Config.from_hf(dict(preset("tiny").to_hf(), **{key: value}))


@pytest.mark.parametrize("key", SIZE_KEYS + INDEXER_KEYS)
def test_a_missing_size_key_is_named_not_defaulted(key):
    d = preset("tiny").to_hf()         # (has CSA layers: the indexer's sizes are needed)
    for value in ("missing", None):
        if value == "missing":
            del d[key]
        else:
            d[key] = None
        with pytest.raises(ConfigError, match=f"config.json has no {key} \\(or null\\)"):
            V4Config.from_hf(d)
    if key in INDEXER_KEYS:            # not needed without a CSA layer
        d["layer_types"] = ["sliding_attention", "heavily_compressed_attention", "sliding_attention"]
        assert getattr(V4Config.from_hf(d), key) == getattr(V4Config(), key)


def test_weight_count_is_the_checkpoint_tensors_values():
    for cfg in (V4Config(), preset("demo"), preset("flash-1gpu"), preset("tiny", layer_types=("sliding_attention",) * 3,
                                                                          mlp_layer_types=("moe",) * 3)):
        assert cfg.weight_count() == sum(int(np.prod(s)) for s in tensor_shapes(cfg).values())


# DeepSeek-V4-Flash's config.json as published: the sizes DSV4_MODEL gives (its config defaults), the
# quantization_config and expert_dtype DSV4_QUANT gives, in the published file's own keys (legacy
# compress_ratios with the MTP layer's entry last, num_hash_layers, qk_rope_head_dim, flat YaRN
# rope_scaling, topk_method). -Pro's: its own published sizes with the same format.
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
         "activation_scheme": "dynamic"}
V4_FLASH = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
    "rope_theta": 10000, "compress_rope_theta": 160000, "sliding_window": 128,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                     "beta_slow": 1},
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0], "num_hash_layers": 3, "index_n_heads": 64,
    "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
    "tie_word_embeddings": False, "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16", "expert_dtype": "fp4",
    "quantization_config": QUANT}
V4_PRO = dict({k: v for k, v in V4_FLASH.items() if k != "compress_ratios"}, hidden_size=7168, num_hidden_layers=61,
              num_attention_heads=128, q_lora_rank=1536, o_groups=16, n_routed_experts=384,
              moe_intermediate_size=3072, routed_scaling_factor=2.5)
F32_TENSORS = ("_fn", "_base", "_scale", "attn_sink", ".ape", "gate.bias")


def published_bytes(cfg):
    """The bytes of cfg's checkpoint in DeepSeek's published layout: FP8 linears with a scale byte per
    128 × 128 block, routed experts FP4 (two a byte) with a scale byte per 32 inputs, HC tensors,
    sinks, ape and router bias F32, tid2eid I64, the rest BF16."""
    n = 0
    for name, shape in tensor_shapes(cfg).items():
        size = int(np.prod(shape))
        if name.endswith(("experts.w13", "experts.w2")):
            n += size // 2 + size // 32
        elif quantisable(name):
            n += size + -(-shape[0] // 128) * -(-shape[1] // 128)
        else:
            n += size * (4 if name.endswith(F32_TENSORS) else 8 if name.endswith("tid2eid") else 2)
    return n


@pytest.mark.parametrize("name", ["flash", "pro"])
def test_deepseek_v4_as_published_parses_and_the_device_check_refuses_it(tmp_path, device, name):
    """Parsing weighs no weights (a checkpoint is read lazily): V4-Flash's 284B and V4-Pro's config.json
    give their V4Config on any machine, and the weights' bytes are refused by the device check, before
    anything is allocated, naming them; a directory with no weights says so."""
    from dsv4_vk.model import Model
    from dsv4_vk.model.placement import check_memory
    published = V4_FLASH if name == "flash" else V4_PRO
    (tmp_path / "config.json").write_text(json.dumps(published))
    cfg = load_config_json(str(tmp_path / "config.json"))
    for k in SIZE_KEYS + INDEXER_KEYS:
        assert getattr(cfg, k) == published[k], k
    L = published["num_hidden_layers"]
    assert cfg.rope_dim == 64 and cfg.yarn["factor"] == 16 and cfg.max_ctx == 4096
    assert cfg.mlp_layer_types == ("hash_moe",) * 3 + ("moe",) * (L - 3)
    if name == "flash":
        assert cfg.layer_types == tuple(LEGACY_RATIO[r] for r in published["compress_ratios"][:L])
        assert abs(cfg.weight_count() - 284.3e9) < 0.05e9           # 284B (the MTP layer is not built)
    weights = published_bytes(cfg)
    assert weights > 100e9
    with pytest.raises(ValueError, match=rf"max_ctx = 4096 needs \d+ bytes of device memory \(\d+ for the decode "
                                         rf"cache and RoPE tables, {weights} for the weights\); .* has \d+ bytes "
                                         r"available \(its largest device-local heap\); the weights alone do not fit"):
        check_memory(cfg, weights, 16, device)
    with pytest.raises(CheckpointError, match="holds no .safetensors file"):
        Model.load(str(tmp_path), device)


def _published_headers(cfg):
    """{DeepSeek's name: (safetensors dtype, shape)} of cfg's checkpoint in the published layout, one
    tensor per expert, scales as `<module>.scale`."""
    out = {}

    def quant(name, shape, fp4):
        n, k = shape
        out[name + ".weight"] = ("I8", (n, k // 2)) if fp4 else ("F8_E4M3", (n, k))
        out[name + ".scale"] = ("F8_E8M0", (n, -(-k // 32)) if fp4 else (-(-n // 128), -(-k // 128)))
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith(("experts.w13", "experts.w2")):
            base, F = name.rsplit(".", 1)[0], cfg.moe_intermediate_size
            for j in range(shape[0]):
                for w in (("w1", "w3") if name.endswith("w13") else ("w2",)):
                    quant(f"{base}.{j}.{w}", (F, shape[2]) if w != "w2" else shape[1:], fp4=True)
        elif quantisable(name):
            quant(name[:-len(".weight")], shape, fp4=False)
        else:
            out[name] = ("F32" if name.endswith(F32_TENSORS) else "I64" if name.endswith("tid2eid") else "BF16", shape)
    return out


@contextlib.contextmanager
def data_memory_limited(extra):
    """RLIMIT_DATA at this process's data size now plus `extra` bytes: an allocation past it is a
    MemoryError here instead of the OOM killer's (file maps do not count)."""
    with open("/proc/self/status") as f:
        data = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (data + extra if hard == resource.RLIM_INFINITY else
                                              min(data + extra, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def test_v4_flash_as_published_is_refused_by_the_device_before_its_weights_are_read(tmp_path, device):
    """Model.load of V4-Flash's directory as published (config.json and a safetensors file whose header
    holds its 156 GB of tensors, the data a sparse file of zeros): the parse and the lazy read of the
    headers pass within 2 GiB of host memory (the experts' 8.4 GB of small scale tensors are not read
    at once), and the device check refuses the weights naming their bytes and the device's: no
    MemoryError, no OOM kill."""
    from dsv4_vk.model import Model
    sizes = {"BF16": 2, "F32": 4, "I64": 8, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}
    header, off = {}, 0
    cfg = V4Config.from_hf(V4_FLASH)
    for name, (dt, shape) in _published_headers(cfg).items():
        n = int(np.prod(shape)) * sizes[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    assert abs(off - published_bytes(cfg)) < 1e-3 * off
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + off)                 # sparse: no data blocks written
    (tmp_path / "config.json").write_text(json.dumps(V4_FLASH))
    heap = max(h.size for h in device.caps.memory_heaps)
    with data_memory_limited(2 << 30):                 # the host holds headers and small tensors only
        with pytest.raises(ValueError, match=r"max_ctx = 4096 needs \d+ bytes of device memory \(\d+ for the decode "
                                             rf"cache and RoPE tables, (\d+) for the weights\); .* has {heap} bytes "
                                             r"available") as e:
            Model.load(str(tmp_path), device)
    os.remove(tmp_path / "model.safetensors")
    need = int(re.search(r"(\d+) for the weights", str(e.value))[1])
    assert abs(need - off) < 0.01 * off                # as published (norms become float32)


def test_absurd_layer_counts_are_refused_naming_the_key():
    """num_hidden_layers: 10**7 is refused at once, before any per-layer list is built; the bound is
    on the layer count, not on this machine's memory."""
    d = {k: v for k, v in preset("tiny").to_hf().items() if k not in ("layer_types", "mlp_layer_types")}
    for bad in (10 ** 7, MAX_LAYERS + 1):
        with pytest.raises(ConfigError, match=rf"config num_hidden_layers must be at most {MAX_LAYERS} .*got {bad}$"):
            V4Config.from_hf(dict(d, num_hidden_layers=bad))
    assert V4Config.from_hf(dict(d, num_hidden_layers=MAX_LAYERS)).num_hidden_layers == MAX_LAYERS
    with pytest.raises(ConfigError, match=f"at most {MAX_LAYERS}"):
        preset("tiny", num_hidden_layers=MAX_LAYERS + 1, layer_types=("sliding_attention",) * (MAX_LAYERS + 1),
               mlp_layer_types=("moe",) * (MAX_LAYERS + 1))


def test_random_weights_past_this_machines_memory_say_how_many_bytes(monkeypatch):
    """Model.load(V4Config) makes its random weights whole on the host: past this machine's memory it is
    a ConfigError with the bytes needed, before anything is made (no MemoryError minutes later)."""
    from dsv4_vk.model import Model
    cfg = preset("tiny", num_hidden_layers=3000, layer_types=("sliding_attention",) * 3000,
                 mlp_layer_types=("moe",) * 3000)
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}[name])
    need = cfg.weight_count() * 4
    with pytest.raises(ConfigError, match=f"need {need:,} bytes .* at 4 bytes\\); this machine has 0.0 GiB"):
        Model.load(cfg)


def test_legacy_config_keys_fold_like_transformers():
    sizes = {k: getattr(V4Config(), k) for k in SIZE_KEYS + INDEXER_KEYS}
    d = dict(sizes, **{"num_hidden_layers": 3, "compress_ratios": [4, 128, 0], "num_hash_layers": 1,
                       "qk_rope_head_dim": 8, "head_dim": 32, "hidden_size": 32, "q_lora_rank": 16,
                       "index_head_dim": 16, "vocab_size": 64,
                       "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 64}})
    c = V4Config.from_hf(d)
    assert c.layer_types == ("compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention")
    assert c.mlp_layer_types == ("hash_moe", "moe", "moe") and c.rope_dim == 8 and c.yarn["factor"] == 16
    with pytest.raises(ConfigError, match="compress_ratios entries"):
        V4Config.from_hf(dict(d, compress_ratios=[4, 64, 0]))


@pytest.mark.parametrize("case, what", [
    ("config_loop", "config.json: cannot be read (a symbolic link loop: too many levels of symbolic links)"),
    ("weights_loop", "model.safetensors: cannot be read (a symbolic link loop"),
    ("directory_loop", "cannot be opened (a symbolic link loop"),
    ("weights_dangling", "model.safetensors: cannot be read (a symbolic link to '/nonexistent/w', which does not exist)"),
    ("weights_directory", "model.safetensors: cannot be read (a directory, not a file)"),
    ("weights_unreadable", "model.safetensors: cannot be read (permission denied: this user may not read it)"),
])
def test_unreadable_files_and_link_loops_say_so(tmp_path, monkeypatch, case, what):
    d = _copy(tmp_path)
    target = d / ("config.json" if case.startswith("config") else "model.safetensors")
    if case == "directory_loop":
        d = tmp_path / "loop"
        d.symlink_to(d)
    elif case == "weights_unreadable":          # (the tests run as root: chmod would not stop the read)
        real_open = open

        def refusing(file, *a, **k):
            if str(file) == str(target):
                raise PermissionError(13, "Permission denied", str(file))
            return real_open(file, *a, **k)
        monkeypatch.setattr("builtins.open", refusing)
    else:
        target.unlink()
        if case == "weights_directory":
            target.mkdir()
        else:
            target.symlink_to("/nonexistent/w" if case.endswith("dangling") else target)
    with pytest.raises(CheckpointError) as e:
        load_hf(str(d))
    assert what in str(e.value) and "No such file" not in str(e.value), str(e.value)


def test_not_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match="nope.safetensors' does not exist: expected a Hugging Face model"):
        load_hf(str(tmp_path / "nope.safetensors"))
    (tmp_path / "file").write_text("{}")
    with pytest.raises(CheckpointError, match="file' is not a directory"):
        load_hf(str(tmp_path / "file"))
    assert set(tensor_shapes(V4Config())) >= {"embed.weight", "layers.0.attn.indexer.wq_b.weight"}


@pytest.mark.parametrize("dt", ["BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E8M0"])
def test_byte_checks_are_the_value_checks(dt, monkeypatch):
    """The checks on bytes as they are read (one masked max a block of CHECK_BLOCK bytes) refuse
    exactly the tensors holding a non-finite value, an E4M3 NaN code or an E8M0 NaN byte, wherever
    it is (the last element of a block, across blocks, a sign bit set)."""
    from dsv4_vk.model import tensor_files
    monkeypatch.setattr(tensor_files, "CHECK_BLOCK", 64)
    np_dt = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
             "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E8M0": ml_dtypes.float8_e8m0fnu}[dt]
    size = np.dtype(np_dt).itemsize
    rng = np.random.default_rng()
    for trial in range(60):
        raw = rng.integers(0, 256, size * int(rng.integers(1, 200)), dtype=np.uint8)
        if trial % 2:               # mostly finite values, a few specials where they fall
            vals = rng.standard_normal(raw.size // size).astype(np_dt)
            vals[rng.integers(0, vals.size, int(rng.integers(0, 3)))] = \
                rng.choice([np.inf, -np.inf, np.nan, 1.0])
            raw = vals.view(np.uint8).copy()
        with np.errstate(invalid="ignore"):
            bad = not np.isfinite(raw.view(np_dt).astype(np.float64)).all()
        try:
            tensor_files._check_bytes("f", "layers.0.attn.wq_a.scale", dt, raw)
            refused = False
        except CheckpointError as e:
            refused = True
            assert "'layers.0.attn.wq_a.scale'" in str(e)
        assert refused == bad, (dt, raw.view(np_dt)[:8])


def test_streams_put_joined_and_cut_lazy_tensors_byte_for_byte(tmp_path, monkeypatch):
    """A Stream of lazy tensors joined (experts stacked) and cut (an expert range) fills any chunking
    of its bytes into whole values as the joined array's, reading each file range straight into the chunk, and pads
    the tail with zeros."""
    from dsv4_vk.model import checkpoint, tensor_files
    monkeypatch.setattr(checkpoint, "EAGER_BYTES", 0)
    rng = np.random.default_rng()
    arrays = {f"t{i}": rng.standard_normal((3, 5)).astype(np.float32) for i in range(4)}
    save_file(arrays, str(tmp_path / "m.safetensors"))
    raw = checkpoint._read_file(str(tmp_path / "m.safetensors"), None)
    assert all(isinstance(a, tensor_files.Lazy) for a, _ in raw.values())
    eager = rng.standard_normal((3, 5)).astype(np.float32)
    rows = tensor_files.join([raw["t1"][0], raw["t2"][0]], False)          # [6, 5]
    stacked = tensor_files.join([raw["t3"][0], eager, raw["t0"][0]], True)
    for lazy, ref in ((stacked, np.stack([arrays["t3"], eager, arrays["t0"]])),
                      (stacked.rows(1, 3), np.stack([eager, arrays["t0"]])),
                      (rows.rows(2, 5), np.concatenate([arrays["t1"], arrays["t2"]])[2:5])):
        s = tensor_files.stream_of(lazy)
        assert s is not None and s.shape == ref.shape
        out = np.zeros(s.nbytes, np.uint8)
        at = 0
        while at < s.nbytes:
            n = 4 * int(rng.integers(1, 6))          # whole float32 values
            s.fill(out[at:at + n], at)
            at += n
        assert np.array_equal(out.view(np.float32).reshape(ref.shape), ref)
    padded = tensor_files.Stream((17,), np.float32, raw["t1"][0].spans)         # 15 values + 2 of padding
    out = np.full(padded.nbytes, 7, np.uint8)
    padded.fill(out, 0)
    assert np.array_equal(out[:60].view(np.float32), arrays["t1"].reshape(-1)) and not out[60:].any()
