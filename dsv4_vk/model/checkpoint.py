"""DeepSeek-V4 checkpoints as Hugging Face model directories, read and written with the
`safetensors` library (BF16 through `ml_dtypes`).

A directory holds `config.json` and one `.safetensors` file, or several with
`model.safetensors.index.json` (its `weight_map` names each tensor's file). Three namings are
read, all mapped onto one canonical set (`tensor_shapes`):
- DeepSeek's original hub names: `embed.weight`, `layers.{i}.attn.wq_a.weight`,
  `layers.{i}.attn.kv_norm.weight`, `layers.{i}.ffn.experts.{j}.w1.weight`, `hc_head_fn`, ...;
- what transformers' `save_pretrained` writes: the same per-layer names under `model.`, the main
  KV norm as `attn.norm.weight`, and HF names at the root (`model.embed_tokens.weight`,
  `model.norm.weight`, `model.hc_head.hc_fn`, `head.weight`);
- transformers' in-memory names (`model.layers.{i}.self_attn.q_a_proj.weight`,
  `mlp.experts.gate_up_proj` stacked [E, 2F, D], ...).
Per-expert tensors are stacked into `ffn.experts.w13` [E, 2F, D] (gate rows, then up rows) and
`ffn.experts.w2` [E, D, F]. Linear weights keep their dtype (F32, F16 or BF16: the device reads
them as they are); norms, HC tensors, sinks, position biases and the router bias become float32;
`tid2eid` (I64 or I32) becomes int32 after a range check. FP8 / FP4 tensors and their block
scales are refused naming the tensor and dtype; so is a malformed file (the library rejects
overlapping or out-of-file data offsets), a missing, unexpected or mis-shaped tensor, and a
config.json value the backend cannot run (model.config).
"""
from __future__ import annotations

import errno
import json
import os
import re

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, which safetensors' numpy reader needs)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..vk.errors import path_problem
from .config import CSA, SWA, ConfigError, V4Config, load_config_json

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": BF16, "F64": np.float64}
INT_DTYPES = ("I64", "I32")
INDEX = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not match its config."""


# --- canonical names and shapes ---------------------------------------------------------------------

def tensor_shapes(cfg: V4Config) -> dict:
    """{canonical name: shape} of every tensor a checkpoint of `cfg` holds."""
    D, V, H, hd, qr = cfg.hidden_size, cfg.vocab_size, cfg.num_attention_heads, cfg.head_dim, cfg.q_lora_rank
    E, F, k, M, g, r = (cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.num_experts_per_tok, cfg.n_mix,
                        cfg.o_groups, cfg.o_lora_rank)
    nI, hI = cfg.index_n_heads, cfg.index_head_dim
    s = {"embed.weight": (V, D), "norm.weight": (D,), "head.weight": (V, D),
         "hc_head_fn": (cfg.hc_mult, cfg.hc_mult * D), "hc_head_base": (cfg.hc_mult,), "hc_head_scale": (1,)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        for site in ("attn", "ffn"):
            s[p + f"hc_{site}_fn"] = (M, cfg.hc_mult * D)
            s[p + f"hc_{site}_base"], s[p + f"hc_{site}_scale"] = (M,), (3,)
        s[p + "attn_norm.weight"] = s[p + "ffn_norm.weight"] = (D,)
        a = p + "attn."
        s.update({a + "wq_a.weight": (qr, D), a + "q_norm.weight": (qr,), a + "wq_b.weight": (H * hd, qr),
                  a + "wkv.weight": (hd, D), a + "kv_norm.weight": (hd,), a + "wo_a.weight": (g * r, H * hd // g),
                  a + "wo_b.weight": (D, g * r), a + "attn_sink": (H,)})
        kind = cfg.layer_types[i]
        if kind != SWA:
            m, c = cfg.rate(i), 2 if kind == CSA else 1
            s.update({a + "compressor.wkv.weight": (c * hd, D), a + "compressor.wgate.weight": (c * hd, D),
                      a + "compressor.ape": (m, c * hd), a + "compressor.norm.weight": (hd,)})
        if kind == CSA:
            x = a + "indexer."
            s.update({x + "wq_b.weight": (nI * hI, qr), x + "weights_proj.weight": (nI, D),
                      x + "compressor.wkv.weight": (2 * hI, D), x + "compressor.wgate.weight": (2 * hI, D),
                      x + "compressor.ape": (m, 2 * hI), x + "compressor.norm.weight": (hI,)})
        f = p + "ffn."
        s[f + "gate.weight"] = (E, D)
        if cfg.mlp_layer_types[i] == "hash_moe":
            s[f + "gate.tid2eid"] = (V, k)
        else:
            s[f + "gate.bias"] = (E,)
        s.update({f + "experts.w13": (E, 2 * F, D), f + "experts.w2": (E, D, F),
                  f + "shared_experts.w1.weight": (F, D), f + "shared_experts.w3.weight": (F, D),
                  f + "shared_experts.w2.weight": (D, F)})
    return s


def is_linear(name: str) -> bool:
    """Tensors kept in the file's precision (mat-vec / expert weights); the rest become float32."""
    return (name.endswith(".weight") and not name.endswith("norm.weight")) or name.endswith(("experts.w13", "experts.w2"))


# HF in-memory name → canonical, after the `model.` prefix is gone (applied in order, first match)
_HF = [(r"^embed_tokens\.weight$", "embed.weight"), (r"^lm_head\.weight$", "head.weight"),
       (r"^hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
       (r"^(layers\.\d+)\.(attn|ffn)_hc\.(fn|base|scale)$", r"\1.hc_\2_\3"),
       (r"^(layers\.\d+)\.input_layernorm\.", r"\1.attn_norm."),
       (r"^(layers\.\d+)\.post_attention_layernorm\.", r"\1.ffn_norm."),
       (r"^(layers\.\d+)\.self_attn\.compressor\.indexer\.q_b_proj\.", r"\1.attn.indexer.wq_b."),
       (r"^(layers\.\d+)\.self_attn\.compressor\.indexer\.scorer\.weights_proj\.", r"\1.attn.indexer.weights_proj."),
       (r"^(layers\.\d+)\.self_attn\.compressor\.indexer\.", r"\1.attn.indexer.compressor."),
       (r"^(layers\.\d+)\.self_attn\.sinks$", r"\1.attn.attn_sink"),
       (r"^(layers\.\d+)\.self_attn\.", r"\1.attn."),
       (r"^(layers\.\d+)\.mlp\.gate\.e_score_correction_bias$", r"\1.ffn.gate.bias"),
       (r"^(layers\.\d+)\.mlp\.experts\.gate_up_proj$", r"\1.ffn.experts.w13"),
       (r"^(layers\.\d+)\.mlp\.experts\.down_proj$", r"\1.ffn.experts.w2"),
       (r"^(layers\.\d+)\.mlp\.shared_experts\.gate_proj\.", r"\1.ffn.shared_experts.w1."),
       (r"^(layers\.\d+)\.mlp\.shared_experts\.up_proj\.", r"\1.ffn.shared_experts.w3."),
       (r"^(layers\.\d+)\.mlp\.shared_experts\.down_proj\.", r"\1.ffn.shared_experts.w2."),
       (r"^(layers\.\d+)\.mlp\.", r"\1.ffn.")]
_ATTN_HF = {"q_a_proj": "wq_a", "q_a_norm": "q_norm", "q_b_proj": "wq_b", "kv_proj": "wkv", "o_a_proj": "wo_a",
            "o_b_proj": "wo_b", "gate_proj": "wgate", "position_bias": "ape", "kv_norm": "norm"}


def canonical(name: str) -> str:
    """The canonical name of a tensor named in any of the three namings."""
    n = name[len("model."):] if name.startswith("model.") else name
    hf = ".self_attn." in n or ".mlp." in n or "_hc." in n or "layernorm" in n or n.startswith(
        ("embed_tokens", "lm_head", "hc_head."))
    if hf:
        for pat, rep in _HF:
            n2 = re.sub(pat, rep, n)
            if n2 != n:
                n = n2
                break
        m = re.match(r"^(layers\.\d+\.attn\.(?:indexer\.)?(?:compressor\.)?)(\w+)(.*)$", n)
        if m and ".self_attn." in name:
            base = m.group(2)
            if m.group(1).endswith("compressor."):
                base = _ATTN_HF.get(base, base)
            else:
                base = {"kv_norm": "kv_norm"}.get(base, _ATTN_HF.get(base, base))
            n = m.group(1) + base + m.group(3)
        return n
    n = re.sub(r"^embed_tokens\.weight$", "embed.weight", n)
    n = re.sub(r"^hc_head\.hc_(fn|base|scale)$", r"hc_head_\1", n)
    n = re.sub(r"^(layers\.\d+\.attn)\.norm\.weight$", r"\1.kv_norm.weight", n)  # save_pretrained's KV norm
    return n


_EXPERT = re.compile(r"^(layers\.\d+\.ffn\.experts)\.(\d+)\.(w[123])\.weight$")


# --- reading --------------------------------------------------------------------------------------------

def check_directory(path):
    """CheckpointError unless `path` is a directory (saying why not: a link loop, no permission...)."""
    try:
        os.stat(path)
    except OSError as e:
        why = "does not exist" if e.errno == errno.ENOENT and not os.path.islink(path) else \
            f"cannot be opened ({path_problem(path, e)})"
        raise CheckpointError(f"{path!r} {why}: expected a Hugging Face model directory with config.json and "
                              ".safetensors files") from None
    if not os.path.isdir(path):
        raise CheckpointError(f"{path!r} is not a directory: expected a Hugging Face model directory with "
                              "config.json and .safetensors files")


def _files(path):
    """[(file, [tensor names or None: all])] of a model directory."""
    check_directory(path)
    index = os.path.join(path, INDEX)
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                wm = json.load(f)["weight_map"]
            if not isinstance(wm, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid index ({type(e).__name__}: {e}); expected "
                                  '{"weight_map": {tensor: file}}') from None
        by_file = {}
        for name, fn in wm.items():
            if not isinstance(fn, str) or os.path.basename(fn) != fn:
                raise CheckpointError(f"{index}: tensor {name!r} maps to {fn!r}, not a file name in the directory")
            by_file.setdefault(fn, []).append(name)
        return [(os.path.join(path, fn), names) for fn, names in sorted(by_file.items())]
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{path!r} holds no .safetensors file")
    return [(os.path.join(path, f), None) for f in files]


def _read_file(fn, names):
    """{name: array} of one file, refusing unsupported dtypes before reading any data."""
    out = {}
    try:                    # opened here first: the library words a link loop or no permission as no file
        open(fn, "rb").close()
    except OSError as e:
        raise CheckpointError(f"{fn}: cannot be read ({path_problem(fn, e)})") from None
    try:
        with safe_open(fn, framework="numpy") as f:
            keys = set(f.keys())
            if names is not None:
                missing = sorted(set(names) - keys)
                if missing:
                    raise CheckpointError(f"{fn}: the index names tensor(s) {missing[:5]} that the file does not hold")
            for k in sorted(keys if names is None else names):
                dt = f.get_slice(k).get_dtype()
                if dt not in FLOAT_DTYPES and dt not in INT_DTYPES:
                    quantised = dt.startswith(("F8", "F4", "U8", "I8"))
                    what = " (FP8/FP4 quantised weights or their block scales)" if quantised else ""
                    raise CheckpointError(f"{fn}: tensor {k!r} has dtype {dt}{what}; supported: F32, F16, BF16 "
                                          "weights and I64/I32 tid2eid (dequantise the checkpoint to BF16 first)")
                out[k] = f.get_tensor(k)
    except SafetensorError as e:
        raise CheckpointError(f"{fn}: not a valid safetensors file ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{fn}: cannot be read ({e.strerror or e})") from None
    return out


def read_tensors(path: str) -> dict:
    """{file name as stored: array} of every tensor in a model directory (no renaming)."""
    out, where = {}, {}
    for fn, names in _files(path):
        for k, a in _read_file(fn, names).items():
            if k in out:
                raise CheckpointError(f"tensor {k!r} is in both {where[k]} and {fn}")
            out[k], where[k] = a, fn
    return out


def _to_canonical(raw, path):
    out, experts = {}, {}
    for name, a in raw.items():
        if name.startswith(("mtp.", "model.mtp.")):
            continue                                        # next-token-prediction layers: not built
        c = canonical(name)
        m = _EXPERT.match(c)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = (name, a)
            continue
        if c in out:
            raise CheckpointError(f"{path}: two tensors map to {c!r} (one is {name!r}): mixed namings?")
        out[c] = a
    for prefix, per in experts.items():
        n = max(per) + 1
        missing = [f"{prefix}.{j}.{w}.weight" for j in range(n) for w in ("w1", "w2", "w3") if w not in per.get(j, {})]
        if missing:
            raise CheckpointError(f"{path}: per-expert tensors incomplete, missing {missing[:5]}")
        dts = {per[j][w][1].dtype for j in range(n) for w in ("w1", "w2", "w3")}
        if len(dts) > 1:
            raise CheckpointError(f"{path}: the experts of {prefix} mix dtypes {sorted(map(str, dts))}")
        for key, parts in (("w13", ("w1", "w3")), ("w2", ("w2",))):
            if f"{prefix}.{key}" in out:
                raise CheckpointError(f"{path}: {prefix} has both stacked and per-expert tensors")
            out[f"{prefix}.{key}"] = np.stack([np.concatenate([per[j][w][1] for w in parts]) for j in range(n)])
    return out


def check_tensors(cfg: V4Config, tensors: dict, where: str = "weights") -> None:
    """CheckpointError naming the first problems: missing, unexpected, mis-shaped, non-finite, bad ids."""
    want = tensor_shapes(cfg)
    problems = []
    for name, shape in want.items():
        if name not in tensors:
            problems.append(f"missing tensor {name!r} (expected shape {list(shape)})")
        elif tuple(np.shape(tensors[name])) != tuple(shape):
            problems.append(f"tensor {name!r} has shape {list(np.shape(tensors[name]))}, expected {list(shape)}")
    for name in sorted(set(tensors) - set(want)):
        hint = " (an FP8/FP4 block scale?)" if name.endswith(".scale") else ": misnamed, or a config mismatch"
        problems.append(f"unexpected tensor {name!r} (shape {list(np.shape(tensors[name]))}){hint}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError(f"{where} do not match the config: " + "; ".join(problems[:5]) + more)
    for name, a in tensors.items():
        if name.endswith("tid2eid"):
            bad = (a < 0) | (a >= cfg.n_routed_experts)
            if bad.any():
                raise CheckpointError(f"{where}: tensor {name!r} holds expert ids outside [0, {cfg.n_routed_experts}): "
                                      f"{np.asarray(a)[bad][:5].tolist()}")
        elif not _finite(np.asarray(a)):
            raise CheckpointError(f"{where}: tensor {name!r} holds non-finite values")


def _finite(a):
    """All values finite, without widening 16-bit arrays (checkpoints of many GB)."""
    if a.dtype in (BF16, np.float16):
        exp = 0x7F80 if a.dtype == BF16 else 0x7C00
        return not ((a.view(np.uint16) & exp) == exp).any()
    return bool(np.isfinite(a).all())


def normalise(cfg: V4Config, tensors: dict, where: str = "weights") -> dict:
    """Checked, with the dtypes the model uploads: linear weights F32/F16/BF16 as given, other floats
    float32, tid2eid int32."""
    check_tensors(cfg, tensors, where)
    out = {}
    for name, a in tensors.items():
        a = np.asarray(a)
        if name.endswith("tid2eid"):
            out[name] = a.astype(np.int32)
        elif is_linear(name) and a.dtype in (np.float32, np.float16, BF16):
            out[name] = np.ascontiguousarray(a)
        else:
            out[name] = a.astype(np.float32)
    return out


def load_hf(path: str, max_ctx: int | None = None) -> tuple:
    """(V4Config, {canonical name: array}) of a Hugging Face model directory."""
    try:
        cfg = load_config_json(os.path.join(path, "config.json"), max_ctx)
    except ConfigError as e:
        check_directory(path)
        raise CheckpointError(str(e)) from None
    cfg.check_memory(2, "the weights (at least 2 bytes each)")
    tensors = _to_canonical(read_tensors(path), path)
    return cfg, normalise(cfg, tensors, f"checkpoint {path!r}")


# --- writing --------------------------------------------------------------------------------------------

def _save_pretrained_name(c):
    if c == "head.weight":
        return c
    n = {"embed.weight": "embed_tokens.weight"}.get(c, c)
    n = re.sub(r"^hc_head_(fn|base|scale)$", r"hc_head.hc_\1", n)
    n = re.sub(r"^(layers\.\d+\.attn)\.kv_norm\.weight$", r"\1.norm.weight", n)
    return "model." + n


def save_hf(path: str, cfg: V4Config, weights: dict, naming: str = "save_pretrained", shards: int = 1) -> None:
    """Write a model directory: config.json + `shards` safetensors files (+ the index when > 1).
    naming: "save_pretrained" (transformers' on-disk names) or "deepseek" (the original hub names);
    experts are written one tensor per expert, as both do."""
    if naming not in ("save_pretrained", "deepseek"):
        raise ValueError(f"naming must be 'save_pretrained' or 'deepseek', got {naming!r}")
    check_tensors(cfg, weights)
    out = {}
    for c, a in weights.items():
        m = re.match(r"^(layers\.\d+\.ffn\.experts)\.(w13|w2)$", c)
        items = []
        if m:
            F = cfg.moe_intermediate_size
            for j in range(a.shape[0]):
                parts = {"w1": a[j, :F], "w3": a[j, F:]} if m.group(2) == "w13" else {"w2": a[j]}
                items += [(f"{m.group(1)}.{j}.{w}.weight", v) for w, v in parts.items()]
        else:
            items = [(c, a)]
        for name, v in items:
            key = _save_pretrained_name(name) if naming == "save_pretrained" else name
            v = np.ascontiguousarray(v)
            out[key] = v.astype(np.int64) if name.endswith("tid2eid") else v
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg.to_hf(), f, indent=2, sort_keys=True)
    names = sorted(out)
    groups = [names[i::shards] for i in range(shards)]
    if shards == 1:
        save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    wm = {}
    for s, group in enumerate(groups):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: out[k] for k in group}, os.path.join(path, fn), metadata={"format": "pt"})
        wm.update({k: fn for k in group})
    with open(os.path.join(path, INDEX), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f, indent=2, sort_keys=True)


# --- random weights -------------------------------------------------------------------------------------

BLOCK = 1 << 24


def _normal(rng, shape):
    """Standard normal float32 values. Past BLOCK elements, randomly rotated copies of one drawn
    block of BLOCK values: drawing billions of normals (a one-GPU benchmark model) would take
    minutes, and a matrix of rotated blocks is as good a random weight for timing and for O(1)
    activations."""
    n = int(np.prod(shape))
    if n <= BLOCK:
        return rng.standard_normal(shape, dtype=np.float32)
    block = rng.standard_normal(BLOCK, dtype=np.float32)
    out = np.empty(n, np.float32)
    for i in range(0, n, BLOCK):
        m = min(BLOCK, n - i)
        r = int(rng.integers(BLOCK))
        out[i:i + m] = np.roll(block, r)[:m]
    return out.reshape(shape)


def random_weights(cfg: V4Config, seed: int = 0, dtype=np.float32) -> dict:
    """A random, seeded set of canonical weights whose activations stay O(1) through the layers:
    linear maps at 1/sqrt(fan-in), norms around 1, and every bias, sink and HC base random (zeros
    would hide a missing term). dtype: of the linear weights (float32, float16 or BF16)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("tid2eid"):
            out[name] = np.stack([rng.permutation(cfg.n_routed_experts)[:shape[1]] for _ in range(shape[0])]
                                 ).astype(np.int32)
        elif name.endswith("norm.weight") or name.endswith("_scale"):
            out[name] = (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(("attn_sink", "ape", "gate.bias")):
            out[name] = rng.standard_normal(shape).astype(np.float32)
        elif name.endswith("_base"):
            out[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("_fn"):
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        else:                               # embed at 1, linear maps at 1/sqrt(fan-in)
            a = _normal(rng, shape)
            if name != "embed.weight":
                a *= np.float32(1.0 / np.sqrt(shape[-1]))
            out[name] = a.astype(dtype, copy=False)
    return out


def write_random(path: str, cfg: V4Config, seed: int = 0, dtype: str = "f32", naming: str = "save_pretrained",
                 shards: int = 1) -> dict:
    """A random, seeded checkpoint directory for `cfg` (linear weights in dtype "f32", "bf16" or
    "f16"); returns the weights written."""
    dt = {"f32": np.float32, "bf16": BF16, "f16": np.float16}.get(dtype)
    if dt is None:
        raise ValueError(f"dtype must be 'f32', 'bf16' or 'f16', got {dtype!r}")
    w = random_weights(cfg, seed, dt)
    save_hf(path, cfg, w, naming=naming, shards=shards)
    return w
