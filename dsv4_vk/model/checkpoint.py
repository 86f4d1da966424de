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
`tid2eid` (integer, or a float holding whole numbers) becomes int32 after a range check.
DeepSeek's published low-precision linears stay as published (`QuantWeight`, docs/quantized_weights.md):
F8_E4M3 weights with an E8M0 scale per 128 × 128 block, FP4 E2M1 experts (I8 or U8, two inputs a
byte) with an E8M0 scale per 32 inputs, each scale beside its weight as `<module>.scale` or
`<module>.weight_scale_inv` (stored F8_E8M0, U8, or F32 powers of two). Refused, naming the tensor:
a malformed file (the library rejects overlapping or out-of-file data offsets), a missing,
unexpected or mis-shaped tensor, a scale grid that does not fit its weight, a missing scale, a NaN
scale (byte 255) or code, a quantised tensor where the format keeps BF16, an integer-typed linear
weight, and a config.json value the backend cannot run (model.config).
"""
from __future__ import annotations

import errno
import json
import math
import os
import re

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, which safetensors' numpy reader needs)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..ops.quant import QUANT
from ..vk.errors import path_problem
from .config import CSA, SWA, ConfigError, V4Config, load_config_json
from .tensor_files import (BF16, FILES, FLOAT_DTYPES, NP_DTYPES, SCALE_SUFFIXES, CheckpointError, Lazy, QuantWeight,
                           Span, all_finite, checked, is_quant, join, stack_quant)
INT_DTYPES = ("I64", "I32", "I16", "U32", "U16")
CODE_DTYPES = ("F8_E4M3", "I8", "U8")           # FP8 codes; FP4 codes two a byte (int8 as published)
SCALE_DTYPES = ("F8_E8M0", "U8", "F32")
INDEX = "model.safetensors.index.json"
# safetensors' numpy reader looks these dtypes up as numpy attributes; ml_dtypes defines them
for _name in ("float8_e4m3fn", "float8_e8m0fnu"):
    if not hasattr(np, _name):
        setattr(np, _name, getattr(ml_dtypes, _name))


def _shape(a) -> tuple:
    return tuple(a.shape) if hasattr(a, "shape") else tuple(np.shape(a))


def quantisable(name: str) -> bool:
    """The linears DeepSeek publishes in FP8 / FP4 (everything else stays BF16 or F32)."""
    return bool(re.search(r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)\.weight$", name) or
                re.search(r"\.ffn\.shared_experts\.w[123]\.weight$", name) or
                re.search(r"\.ffn\.experts(\.\d+\.w[123]\.weight|\.w13|\.w2)$", name))


class LoadProgress:
    """Upload progress on stderr, for loads of at least `min_bytes`: GB done, %, GB/s, every
    `every` seconds (on one line on a terminal)."""

    def __init__(self, min_bytes: int = 2 << 30, every: float = 2.0, stream=None):
        import sys
        import time
        self.min_bytes, self.every, self.stream, self.clock = min_bytes, every, stream or sys.stderr, time.perf_counter
        self.t0 = self.last = self.clock()

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if total < self.min_bytes or (now - self.last < self.every and done < total):
            return
        self.last = now
        tty = getattr(self.stream, "isatty", lambda: False)()
        rate = done / max(now - self.t0, 1e-9) / 1e9
        self.stream.write(f"{chr(13) if tty else ''}loading weights: {done / 1e9:.1f} / {total / 1e9:.1f} GB "
                          f"({100 * done / total:.0f}%), {rate:.2f} GB/s{'' if tty and done < total else chr(10)}")
        self.stream.flush()


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


EAGER_BYTES = 1 << 20          # tensors up to this size are read at once; larger ones when uploaded
# A per-expert tensor (or its scale) is read at once only where its layer's stack of them in the file is
# that small too: V4-Flash's FP4 experts have 43 · 256 · 3 scale tensors of 256 KiB, 8.4 GB otherwise.
_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


def _read_file(fn, names):
    """{name: (array or Lazy, safetensors dtype)} of one file, refusing unsupported dtypes before
    reading any data. FP8 codes and E8M0 scales come as their bytes (uint8); tensors over
    EAGER_BYTES, and per-expert ones whose layer's stack in the file is, stay Lazy (read and checked
    when their param is uploaded)."""
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
            header = {}
            stacks: dict = {}       # per-expert tensors' bytes by name with the expert number left out
            for k in sorted(keys if names is None else names):
                sl = f.get_slice(k)
                dt = sl.get_dtype()
                if dt not in NP_DTYPES:
                    raise CheckpointError(f"{fn}: tensor {k!r} has dtype {dt}; supported: F32, F16, BF16 weights, "
                                          "F8_E4M3 or I8/U8 (FP4) quantised linears with F8_E8M0/U8/F32 scales, "
                                          "integer tid2eid")
                shape = tuple(sl.get_shape())
                header[k] = dt, shape, math.prod(shape) * np.dtype(NP_DTYPES[dt]).itemsize
                stack = _PER_EXPERT.sub(".experts.*.", k)
                stacks[stack] = stacks.get(stack, 0) + header[k][2]
            for k, (dt, shape, _) in header.items():
                if stacks[_PER_EXPERT.sub(".experts.*.", k)] <= EAGER_BYTES or k.endswith("tid2eid"):
                    a = f.get_tensor(k)
                    out[k] = (checked(fn, k, dt, a.view(np.uint8) if dt.startswith("F8") or dt == "I8" else a), dt)
                else:
                    nbytes = math.prod(shape) * np.dtype(NP_DTYPES[dt]).itemsize
                    out[k] = (Lazy(shape, NP_DTYPES[dt], lambda fn=fn, k=k, dt=dt, shape=shape: FILES.get(fn, k, dt, shape),
                                   [Span(fn, k, dt, 0, nbytes)]), dt)
    except SafetensorError as e:
        raise CheckpointError(f"{fn}: not a valid safetensors file ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{fn}: cannot be read ({e.strerror or e})") from None
    return out


def read_tensors(path: str, with_dtypes: bool = False) -> dict:
    """{file name as stored: array} of every tensor in a model directory (no renaming); with_dtypes:
    {name: (array, safetensors dtype)}."""
    out: dict = {}
    where: dict[str, str] = {}
    for fn, names in _files(path):
        for k, a in _read_file(fn, names).items():
            if k in out:
                raise CheckpointError(f"tensor {k!r} is in both {where[k]} and {fn}")
            out[k], where[k] = a, fn
    return out if with_dtypes else {k: a for k, (a, _) in out.items()}


def _scale_bytes(name, a, dt):
    """E8M0 bytes of a scale tensor stored as F8_E8M0, U8, or F32 powers of two."""
    if isinstance(a, Lazy):
        return a if dt != "F32" else Lazy(a.shape, np.uint8, lambda: _scale_bytes(name, a.load(), dt))
    if dt == "F32":
        a = np.asarray(a, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.log2(a)
        ok = np.isfinite(e) & (e == np.round(e)) & (e >= -127) & (e <= 127)
        if not ok.all():
            raise CheckpointError(f"scale {name!r} (F32) holds {a[~ok][:3].tolist()}: E8M0 scales are powers of "
                                  "two 2^-127 .. 2^127")
        return (e + 127).astype(np.uint8)
    return np.asarray(a).view(np.uint8)


def _quant(name, codes, dt, scale):
    """The QuantWeight of a linear's codes and its scale (name, array, dtype), grid checked."""
    sname, sa, sdt = scale
    if sdt not in SCALE_DTYPES:
        raise CheckpointError(f"scale {sname!r} of {name!r} has dtype {sdt}; expected F8_E8M0, U8 or F32")
    fmt = QUANT["fp8" if dt == "F8_E4M3" else "fp4"]
    if codes.ndim != 2:
        raise CheckpointError(f"quantised tensor {name!r} has shape {list(codes.shape)}; expected [out, in"
                              f"{'/2' if fmt.bits == 4 else ''}]")
    N, K = codes.shape[0], codes.shape[1] * (8 // fmt.bits)
    grid = fmt.grid(N, K)
    sb = _scale_bytes(sname, sa, sdt)
    if tuple(sb.shape) != grid:
        what = "128 × 128 block" if fmt.bits == 8 else "32 inputs of a row"
        raise CheckpointError(f"scale {sname!r} has shape {list(sb.shape)}; {fmt.name} weight {name!r} "
                              f"[{N}, {K}] needs {list(grid)} (one per {what}, a partial last block included)")
    if not isinstance(sb, Lazy) and (sb == 255).any():
        raise CheckpointError(f"scale {sname!r} holds the E8M0 NaN byte 255")
    return QuantWeight(fmt.name, codes, sb)


def _to_canonical(raw, path):
    """Canonical names of raw {name: (array, dtype)}: quantised linears paired with their scales
    (QuantWeight), per-expert tensors stacked."""
    scales, out, experts = {}, {}, {}
    for name, (a, dt) in raw.items():
        if name.startswith(("mtp.", "model.mtp.")):
            continue                                        # next-token-prediction layers: not built
        for suffix in SCALE_SUFFIXES:                       # (X.scale beside X.weight; HC's *_hc.scale is not)
            if name.endswith(suffix) and (suffix != ".scale" or name[:-len(suffix)] + ".weight" in raw):
                scales[canonical(name[:-len(suffix)] + ".weight")] = (name, a, dt)
                break
    taken = {v[0] for v in scales.values()}
    for name, (a, dt) in raw.items():
        if name.startswith(("mtp.", "model.mtp.")) or name in taken:
            continue
        c = canonical(name)
        if dt in CODE_DTYPES:
            if not quantisable(c):
                raise CheckpointError(f"{path}: tensor {name!r} is quantised ({dt}), but the format keeps it in "
                                      "BF16/F32 (only the attention projections and the experts are FP8/FP4)")
            if c not in scales:
                raise CheckpointError(f"{path}: quantised tensor {name!r} ({dt}) has no scale (expected "
                                      f"{name[:-len('.weight')]}.scale or .weight_scale_inv)")
            a = _quant(name, a, dt, scales.pop(c))
        elif c in scales:
            raise CheckpointError(f"{path}: scale {scales[c][0]!r} belongs to {name!r}, which is {dt}, not quantised")
        elif is_linear(c) and dt not in FLOAT_DTYPES:
            raise CheckpointError(f"{path}: linear weight {name!r} has integer dtype {dt}; expected F32/F16/BF16 "
                                  "or F8_E4M3 / FP4 with a scale")
        m = _EXPERT.match(c)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = (name, a)
            continue
        if c in out:
            raise CheckpointError(f"{path}: two tensors map to {c!r} (one is {name!r}): mixed namings?")
        out[c] = a
    if scales:
        orphans = sorted(v[0] for v in scales.values())
        raise CheckpointError(f"{path}: scale tensor(s) {orphans[:5]} have no weight beside them")
    for prefix, per in experts.items():
        n = max(per) + 1
        missing = [f"{prefix}.{j}.{w}.weight" for j in range(n) for w in ("w1", "w2", "w3") if w not in per.get(j, {})]
        if missing:
            raise CheckpointError(f"{path}: per-expert tensors incomplete, missing {missing[:5]}")
        kinds = {_kind(per[j][w][1]) for j in range(n) for w in ("w1", "w2", "w3")}
        if len(kinds) > 1:
            raise CheckpointError(f"{path}: the experts of {prefix} mix dtypes {sorted(kinds)}")
        for key, parts in (("w13", ("w1", "w3")), ("w2", ("w2",))):
            if f"{prefix}.{key}" in out:
                raise CheckpointError(f"{path}: {prefix} has both stacked and per-expert tensors")
            mats = [[per[j][w][1] for w in parts] for j in range(n)]
            if is_quant(mats[0][0]):
                shapes = {tuple(m.codes.shape) for row in mats for m in row}
                if len(shapes) > 1:
                    raise CheckpointError(f"{path}: the experts of {prefix} have shapes {sorted(shapes)}")
                out[f"{prefix}.{key}"] = stack_quant([stack_quant(row, False) for row in mats], True)
            else:
                out[f"{prefix}.{key}"] = join([join(row, False) for row in mats], True)
    return out


def _kind(a):
    return a.fmt if is_quant(a) else str(np.dtype(a.dtype))


def check_tensors(cfg: V4Config, tensors: dict, where: str = "weights") -> None:
    """CheckpointError naming the first problems: missing, unexpected, mis-shaped, non-finite, bad ids."""
    want = tensor_shapes(cfg)
    problems = []
    for name, shape in want.items():
        if name not in tensors:
            problems.append(f"missing tensor {name!r} (expected shape {list(shape)})")
        elif _shape(tensors[name]) != tuple(shape):
            a = tensors[name]
            hint = ""
            if is_quant(a) and a.fmt == "fp4" and shape[-1] % 2:
                hint = f": an FP4 tensor packs two inputs a byte, and its width {shape[-1]} is odd"
            problems.append(f"tensor {name!r} has shape {list(_shape(a))}, expected {list(shape)}{hint}")
    for name in sorted(set(tensors) - set(want)):
        hint = " (an FP8/FP4 block scale?)" if name.endswith(".scale") else ": misnamed, or a config mismatch"
        problems.append(f"unexpected tensor {name!r} (shape {list(_shape(tensors[name]))}){hint}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError(f"{where} do not match the config: " + "; ".join(problems[:5]) + more)
    for name, a in tensors.items():
        if is_quant(a):
            if not quantisable(name):
                raise CheckpointError(f"{where}: tensor {name!r} is quantised ({a.fmt}), but the format keeps it "
                                      "in BF16/F32")
            if not isinstance(a.scale, Lazy) and (np.asarray(a.scale) == 255).any():
                raise CheckpointError(f"{where}: tensor {name!r} has an E8M0 NaN scale (byte 255)")
            if a.fmt == "fp8" and not isinstance(a.codes, Lazy) and ((a.codes & 0x7F) == 0x7F).any():
                raise CheckpointError(f"{where}: tensor {name!r} holds E4M3 NaN codes (0x7F / 0xFF)")
        elif isinstance(a, Lazy):           # read and checked when uploaded
            if is_linear(name) and a.dtype not in (np.float32, np.float16, BF16, np.float64):
                raise CheckpointError(f"{where}: linear weight {name!r} has dtype {a.dtype}; expected float32, "
                                      "float16 or bfloat16 (or a QuantWeight)")
        elif name.endswith("tid2eid"):
            a = np.asarray(a)
            if not np.issubdtype(a.dtype, np.integer) and not (np.isfinite(a).all() and (a == np.round(a)).all()):
                bad = a[~(np.isfinite(a) & (a == np.round(a)))]
                raise CheckpointError(f"{where}: tensor {name!r} ({a.dtype}) holds non-integer expert ids "
                                      f"{bad[:5].tolist()}; expected integers")
            bad = (a < 0) | (a >= cfg.n_routed_experts)
            if bad.any():
                raise CheckpointError(f"{where}: tensor {name!r} holds expert ids outside [0, {cfg.n_routed_experts}): "
                                      f"{np.asarray(a)[bad][:5].tolist()}")
        elif is_linear(name) and np.asarray(a).dtype not in (np.float32, np.float16, BF16, np.float64):
            raise CheckpointError(f"{where}: linear weight {name!r} has dtype {np.asarray(a).dtype}; expected "
                                  "float32, float16 or bfloat16 (or a QuantWeight)")
        elif not all_finite(np.asarray(a)):
            raise CheckpointError(f"{where}: tensor {name!r} holds non-finite values")




def normalise(cfg: V4Config, tensors: dict, where: str = "weights") -> dict:
    """Checked, with the dtypes the model uploads: linear weights F32/F16/BF16 as given or quantised
    (QuantWeight, as published), other floats float32, tid2eid int32."""
    check_tensors(cfg, tensors, where)
    out = {}
    for name, a in tensors.items():
        if is_quant(a) or (isinstance(a, Lazy) and is_linear(name) and a.dtype in (np.float32, np.float16, BF16)):
            out[name] = a
            continue
        a = np.asarray(a)
        if name.endswith("tid2eid"):
            out[name] = a.astype(np.int32)
        elif is_linear(name) and a.dtype in (np.float32, np.float16, BF16):
            out[name] = np.ascontiguousarray(a)
        else:
            out[name] = a.astype(np.float32)
    return out


def dequantized(weights: dict, dtype=np.float32) -> dict:
    """The weights with every QuantWeight as float values (exact in float32)."""
    return {k: np.asarray(v, dtype) if is_quant(v) else v for k, v in weights.items()}


def load_hf(path: str, max_ctx: int | None = None) -> tuple:
    """(V4Config, {canonical name: array}) of a Hugging Face model directory."""
    try:
        cfg = load_config_json(os.path.join(path, "config.json"), max_ctx)
    except ConfigError as e:
        check_directory(path)
        raise CheckpointError(str(e)) from None
    tensors = _to_canonical(read_tensors(path, with_dtypes=True), path)
    return cfg, normalise(cfg, tensors, f"checkpoint {path!r}")


# --- writing --------------------------------------------------------------------------------------------

def _save_pretrained_name(c):
    if c == "head.weight":
        return c
    n = {"embed.weight": "embed_tokens.weight"}.get(c, c)
    n = re.sub(r"^hc_head_(fn|base|scale)$", r"hc_head.hc_\1", n)
    n = re.sub(r"^(layers\.\d+\.attn)\.kv_norm\.weight$", r"\1.norm.weight", n)
    return "model." + n


def save_hf(path: str, cfg: V4Config, weights: dict, naming: str = "save_pretrained", shards: int = 1,
            scale_dtype: str = "e8m0") -> None:
    """Write a model directory: config.json + `shards` safetensors files (+ the index when > 1).
    naming: "save_pretrained" (transformers' on-disk names) or "deepseek" (the original hub names);
    experts are written one tensor per expert, as both do. Quantised weights (QuantWeight) are
    written as published: codes F8_E4M3 (FP8) or I8 (FP4), scales `<module>.scale` ("deepseek")
    or `<module>.weight_scale_inv` ("save_pretrained") stored as scale_dtype "e8m0" (F8_E8M0),
    "u8" or "f32"; config.json then carries quantization_config. Shards take the sorted names in turn,
    so a scale sits in another shard than its weight."""
    if naming not in ("save_pretrained", "deepseek"):
        raise ValueError(f"naming must be 'save_pretrained' or 'deepseek', got {naming!r}")
    if scale_dtype not in ("e8m0", "u8", "f32"):
        raise ValueError(f"scale_dtype must be 'e8m0', 'u8' or 'f32', got {scale_dtype!r}")
    check_tensors(cfg, weights)
    out = {}
    quantised = {}
    for c, a in weights.items():
        m = re.match(r"^(layers\.\d+\.ffn\.experts)\.(w13|w2)$", c)
        items = []
        if m:
            F = cfg.moe_intermediate_size
            for j in range(a.shape[0]):
                if is_quant(a):
                    parts = ({"w1": a.matrix(2 * j), "w3": a.matrix(2 * j + 1)} if m.group(2) == "w13"
                             else {"w2": a.matrix(j)})
                else:
                    parts = {"w1": a[j, :F], "w3": a[j, F:]} if m.group(2) == "w13" else {"w2": a[j]}
                items += [(f"{m.group(1)}.{j}.{w}.weight", v) for w, v in parts.items()]
        else:
            items = [(c, a)]
        for name, v in items:
            key = _save_pretrained_name(name) if naming == "save_pretrained" else name
            if is_quant(v):
                quantised[v.fmt] = True
                out[key] = v.codes.view(ml_dtypes.float8_e4m3fn if v.fmt == "fp8" else np.int8)
                sk = key[:-len(".weight")] + (".scale" if naming == "deepseek" else ".weight_scale_inv")
                sb = np.ascontiguousarray(v.scale)
                out[sk] = {"e8m0": lambda b: b.view(ml_dtypes.float8_e8m0fnu), "u8": lambda b: b,
                           "f32": lambda b: np.exp2(b.astype(np.float32) - 127)}[scale_dtype](sb)
                continue
            v = np.ascontiguousarray(v)
            out[key] = v.astype(np.int64) if name.endswith("tid2eid") else v
    os.makedirs(path, exist_ok=True)
    hf = cfg.to_hf()
    if quantised:
        hf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                     "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
        if "fp4" in quantised:
            hf["expert_dtype"] = "fp4"
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    names = sorted(out)
    if shards == 1:
        save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    groups = [names[i::shards] for i in range(shards)]
    wm = {}
    for s, group in enumerate(groups):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: out[k] for k in group}, os.path.join(path, fn), metadata={"format": "pt"})
        wm.update({k: fn for k in group})
    with open(os.path.join(path, INDEX), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f, indent=2, sort_keys=True)
