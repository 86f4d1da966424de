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
import threading
from bisect import bisect_right
from typing import NamedTuple

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, which safetensors' numpy reader needs)
import numpy as np
from numpy.typing import DTypeLike
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..ops.quant import QUANT, QuantFormat, dequantize, quant_arrays
from ..vk.errors import path_problem
from .config import CSA, SWA, ConfigError, V4Config, load_config_json

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": BF16, "F64": np.float64}
INT_DTYPES = ("I64", "I32", "I16", "U32", "U16")
CODE_DTYPES = ("F8_E4M3", "I8", "U8")           # FP8 codes; FP4 codes two a byte (int8 as published)
SCALE_DTYPES = ("F8_E8M0", "U8", "F32")
SCALE_SUFFIXES = (".weight_scale_inv", ".scale")
INDEX = "model.safetensors.index.json"
# safetensors' numpy reader looks these dtypes up as numpy attributes; ml_dtypes defines them
for _name in ("float8_e4m3fn", "float8_e8m0fnu"):
    if not hasattr(np, _name):
        setattr(np, _name, getattr(ml_dtypes, _name))


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not match its config."""


class Lazy:
    """An array not read yet: its shape and dtype, and how to get it (read from the checkpoint's
    files, or joined from other lazy arrays) when np.asarray(lazy) or .load() asks, and, where
    known, its bytes as file ranges (spans). Model.load keeps large tensors lazy and streams each
    param's bytes from the files into the device (Stream), checked as they are read (non-finite
    values, NaN codes or scales: CheckpointError naming the file's tensor), so the host never holds
    a param, let alone the checkpoint."""

    __slots__ = ("shape", "dtype", "_get", "spans")

    def __init__(self, shape, dtype, get, spans=None):
        self.shape, self.dtype, self._get = tuple(shape), np.dtype(dtype), get
        # its bytes in order, where known without reading them: file ranges (Span), arrays' bytes
        # and opaque Lazy parts (read when streamed: Stream); None: only load() knows them
        self.spans = spans

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def load(self) -> np.ndarray:
        a = self._get()
        if tuple(a.shape) != self.shape or a.dtype != self.dtype:
            raise CheckpointError(f"a tensor read as {a.dtype} {list(a.shape)}, expected {self.dtype} "
                                  f"{list(self.shape)} (the file changed since it was opened?)")
        return a

    def __array__(self, dtype=None, copy=None):
        a = self.load()
        return a if dtype is None else a.astype(dtype)

    def rows(self, lo: int, hi: int) -> "Lazy":
        """Entries lo..hi-1 of the first axis, still lazy (their bytes a range of this one's)."""
        per = self.nbytes // self.shape[0]
        spans = None if self.spans is None else _cut(self.spans, lo * per, hi * per)
        return Lazy((hi - lo,) + self.shape[1:], self.dtype, lambda: np.asarray(self)[lo:hi], spans)

    def __repr__(self):
        return f"Lazy({self.dtype} {list(self.shape)})"


class Span(NamedTuple):
    """Bytes [lo, lo + n) of tensor `key` (safetensors dtype `dt`) of file `fn`."""
    fn: str
    key: str
    dt: str
    lo: int
    n: int


def _part_bytes(p) -> int:
    return p.n if isinstance(p, Span) else int(p.nbytes)


def _spans_of(a) -> list:
    """The byte parts of an array (its bytes), a Lazy with spans (those) or without (itself)."""
    if isinstance(a, Lazy):
        return [a] if a.spans is None else a.spans
    return [np.ascontiguousarray(a).view(np.uint8).reshape(-1)]


def _cut(spans: list, lo: int, hi: int) -> list:
    """The parts covering bytes [lo, hi) of `spans` (an opaque Lazy cut along its first axis)."""
    out, at = [], 0
    for p in spans:
        n = _part_bytes(p)
        a, b = max(lo, at), min(hi, at + n)
        if a < b:
            if a == at and b == at + n:
                out.append(p)
            elif isinstance(p, Span):
                out.append(p._replace(lo=p.lo + a - at, n=b - a))
            elif isinstance(p, Lazy):
                per = n // p.shape[0]
                if (a - at) % per or (b - at) % per:
                    raise AssertionError("a cut through a tensor's entries")
                out.append(p.rows((a - at) // per, (b - at) // per))
            else:
                out.append(p[a - at:b - at])
        at += n
    return out


def join(parts: list, new_axis: bool):
    """np.stack (new_axis) or np.concatenate of arrays, lazily where any part is Lazy."""
    op = np.stack if new_axis else np.concatenate
    if not any(isinstance(p, Lazy) for p in parts):
        return op(parts)
    first = parts[0].shape
    shape = (len(parts),) + first if new_axis else (sum(p.shape[0] for p in parts),) + first[1:]
    dts = {np.dtype(p.dtype) for p in parts}
    if len(dts) > 1:
        raise CheckpointError(f"cannot join tensors of dtypes {sorted(map(str, dts))}")
    dtype = dts.pop()

    def joined():
        """Each part read into its place in one array (a part at a time beside it, not two copies)."""
        out = np.empty(shape, dtype)
        at = 0
        for p in parts:
            n = 1 if new_axis else p.shape[0]
            out[at:at + n] = np.asarray(p)[None] if new_axis else np.asarray(p)
            at += n
        return out
    return Lazy(shape, dtype, joined, [q for p in parts for q in _spans_of(p)])


class Stream:
    """A device array's bytes as parts (file ranges: Span; arrays' bytes; zeros padding it to `shape`)
    for a streamed upload (core.Executor.stream_param): fill(view, start) puts bytes [start, start +
    view.size) into view, each file range read straight into it and checked there (_Files.read), so
    an expert stack is never joined on the host. An opaque Lazy part is read when the Stream is made."""

    def __init__(self, shape, dtype, parts: list):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        parts = [np.ascontiguousarray(p.load()).view(np.uint8).reshape(-1) if isinstance(p, Lazy) else p
                 for p in parts]
        have, want = sum(_part_bytes(p) for p in parts), self.nbytes
        if have > want:
            raise AssertionError(f"{have} bytes streamed into an array of {want}")
        if have < want:
            parts.append(np.zeros(want - have, np.uint8))
        self.parts = [p for p in parts if _part_bytes(p)]
        self.starts = np.cumsum([0] + [_part_bytes(p) for p in self.parts])[:-1].tolist()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def array(self) -> np.ndarray:
        """The whole array, filled in one go (on the host)."""
        out = np.empty(self.nbytes, np.uint8)
        self.fill(out, 0)
        return out.view(self.dtype).reshape(self.shape)

    def fill(self, view: np.ndarray, start: int) -> None:
        """Bytes [start, start + view.size) into view; a file range read must hold whole values of its
        tensor (Upload's chunks do: their sizes are multiples of 4096, and every part holds whole ones)."""
        end, first = start + view.size, start
        i = bisect_right(self.starts, start) - 1
        while start < end:
            p, at = self.parts[i], self.starts[i]
            b = min(end, at + _part_bytes(p))
            dst = view[start - first:b - first]
            if isinstance(p, Span):
                FILES.read(p.fn, p.key, p.dt, p.lo + start - at, dst)
            else:
                dst[:] = p[start - at:b - at]
            start, i = b, i + 1


STREAM_BYTES = 16 << 20     # arrays in memory from this size are streamed too (copied by the upload's threads)
_STREAMED = (np.dtype(np.float32), np.dtype(np.float16), BF16, np.dtype(np.int32))


def _streams(a) -> bool:
    return (isinstance(a, Lazy) and a.spans is not None) or (isinstance(a, np.ndarray) and a.nbytes >= STREAM_BYTES)


def stream_of(a) -> Stream | None:
    """The Stream of a Lazy array whose bytes are known without reading them, or of a large array
    in memory (of a dtype the device keeps), else None."""
    if not _streams(a) or np.dtype(a.dtype) not in _STREAMED:
        return None
    return Stream(a.shape, a.dtype, _spans_of(a))


class QuantWeight:
    """A linear weight in DeepSeek's published low-precision format, bytes as published.
    fmt "fp8": codes uint8 [..., N, K] (E4M3), one E8M0 scale byte per 128 × 128 block;
    fmt "fp4": codes uint8 [..., N, K / 2] (E2M1, element 2j in the low nibble), one per 32 inputs.
    scale: uint8 [..., grids, rows, cols], the scale grid of every `grid_rows` rows (one matrix as
    published; stacked experts, or gate and up rows, keep one grid each). np.asarray(w) gives the
    float64 weights (exact: w = code value · 2^(s − 127))."""

    __slots__ = ("fmt", "codes", "scale", "grid_rows")

    def __init__(self, fmt: str, codes: np.ndarray, scale: np.ndarray, grid_rows: int | None = None):
        self.fmt, self.codes, self.scale = fmt, codes, scale
        self.grid_rows = codes.shape[-2] if grid_rows is None else grid_rows

    @property
    def format(self) -> QuantFormat:
        return QUANT[self.fmt]

    @property
    def shape(self) -> tuple:
        return self.codes.shape[:-1] + (self.codes.shape[-1] * (8 // self.format.bits),)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1]))

    def device_arrays(self) -> tuple:
        """(codes as int32 words [..., N, words a row], scale bytes as int32 words [n]): what the
        kernels bind (ops.quant.quant_arrays)."""
        return quant_arrays(np.asarray(self.codes), np.asarray(self.scale))

    def streams(self) -> tuple[Stream, Stream] | None:
        """What device_arrays gives, as Streams (codes, scale) where a part is Lazy (or large) and the
        rows are whole words (no padding between them), else None."""
        if not (_streams(self.codes) or isinstance(self.scale, Lazy)) or self.codes.shape[-1] % 4:
            return None
        codes = Stream(self.codes.shape[:-1] + (self.codes.shape[-1] // 4,), np.int32, _spans_of(self.codes))
        n = math.prod(self.scale.shape)
        return codes, Stream((-(-n // 4),), np.int32, _spans_of(self.scale))

    def __array__(self, dtype=None, copy=None):
        words, scale = self.device_arrays()
        w = dequantize(self.fmt, words, scale, self.shape[-1], self.rows // self.grid_rows)
        return w if dtype is None else w.astype(dtype)

    def matrix(self, m: int) -> "QuantWeight":
        """The m-th grid's rows (grid_rows of them) with their scale grid, as published."""
        gr, K = self.grid_rows, self.shape[-1]
        sr, sc = self.format.grid(gr, K)
        codes = np.asarray(self.codes).reshape(-1, self.codes.shape[-1])[m * gr:(m + 1) * gr]
        scale = np.asarray(self.scale).reshape(-1)[m * sr * sc:(m + 1) * sr * sc].reshape(sr, sc)
        return QuantWeight(self.fmt, codes, scale)

    def __repr__(self):
        return f"QuantWeight({self.fmt}, shape={list(self.shape)}, grid_rows={self.grid_rows})"


def stack_quant(parts: list, axis_new: bool) -> "QuantWeight":
    """QuantWeights of one format and grid_rows stacked: along a new first axis (experts) or
    along rows (gate then up): the grids follow one another, as the rows do."""
    fmt, gr = parts[0].fmt, parts[0].grid_rows
    if any(p.fmt != fmt or p.grid_rows != gr for p in parts):
        raise CheckpointError(f"cannot stack quantised weights of formats/grids "
                              f"{sorted({(p.fmt, p.grid_rows) for p in parts})}")
    return QuantWeight(fmt, join([p.codes for p in parts], axis_new), join([p.scale for p in parts], axis_new), gr)


def is_quant(a) -> bool:
    return isinstance(a, QuantWeight)


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
NP_DTYPES = dict(FLOAT_DTYPES, I64=np.int64, I32=np.int32, I16=np.int16, U32=np.uint32, U16=np.uint16,
                 F8_E4M3=np.uint8, F8_E8M0=np.uint8, I8=np.uint8, U8=np.uint8)


class _Files:
    """Reads byte ranges of a safetensors file's tensors into given arrays with plain reads (pread),
    not a memory map: the pages of a mapped file count in the process's resident memory while it
    stays mapped, so a mapped checkpoint would end up resident whole. Thread-safe; each range is
    checked as it is read (_check_bytes). Up to `keep` files stay open with their parsed headers (a
    file rewritten since is opened again); close() closes them."""

    def __init__(self, keep: int = 64):
        self.keep = keep
        self.open: dict = {}        # file -> [fd, (inode, size, mtime), data start, header, readers]
        self.lock = threading.Lock()

    def _acquire(self, fn):
        st = os.stat(fn)
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self.lock:
            f = self.open.get(fn)
            if f is not None and f[1] == ident:
                f[4] += 1
                return f
        fd = os.open(fn, os.O_RDONLY)
        try:
            head = os.pread(fd, 8, 0)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n <= 0 or n > st.st_size - 8:
                raise SafetensorError(f"header length {n} does not fit the file of {st.st_size} bytes")
            try:
                header = json.loads(os.pread(fd, n, 8))
            except ValueError as e:
                raise SafetensorError(f"unreadable header ({e})") from None
        except BaseException:
            os.close(fd)
            raise
        f = [fd, ident, 8 + n, header, 1]
        with self.lock:
            old = self.open.pop(fn, None)
            self.open[fn] = f
            if old is not None:
                self._drop(old)
            for k in [k for k, g in self.open.items() if g[4] == 0][:max(0, len(self.open) - self.keep)]:
                self._drop(self.open.pop(k))
        return f

    @staticmethod
    def _drop(f):
        """Close an entry's file once no reader uses it (the last reader closes it otherwise)."""
        f[1] = None                 # (not found again)
        if f[4] == 0 and f[0] is not None:
            os.close(f[0])
            f[0] = None

    def _release(self, f):
        with self.lock:
            f[4] -= 1
            if f[1] is None:
                self._drop(f)

    def read(self, fn: str, key: str, dt: str, lo: int, out: np.ndarray) -> np.ndarray:
        """Bytes [lo, lo + out.size) of tensor `key` (dtype dt) of file fn into `out` (uint8), checked."""
        try:
            f = self._acquire(fn)
            try:
                fd, _, start, header, _ = f
                info = header.get(key)
                if not isinstance(info, dict) or info.get("dtype") != dt:
                    raise SafetensorError(f"tensor {key!r} of dtype {dt} is not in the file (it changed since it "
                                          "was opened?)")
                t0, t1 = info["data_offsets"]
                size = np.dtype(NP_DTYPES[dt]).itemsize
                if t1 - t0 != math.prod(info["shape"]) * size or lo < 0 or lo + out.size > t1 - t0:
                    raise SafetensorError(f"tensor {key!r} is truncated")
                if lo % size or out.size % size:        # (the checks look at whole values)
                    raise ValueError(f"{key}: bytes [{lo}, {lo + out.size}) are not whole {dt} values")
                view, at = out.data.cast("B"), start + t0 + lo
                while view.nbytes:
                    n = os.preadv(fd, [view], at)
                    if n <= 0:
                        raise SafetensorError(f"tensor {key!r} is truncated")
                    view, at = view[n:], at + n
            finally:
                self._release(f)
        except SafetensorError as e:
            raise CheckpointError(f"{fn}: not a valid safetensors file ({e})") from None
        except OSError as e:
            raise CheckpointError(f"{fn}: cannot be read ({e.strerror or e})") from None
        _check_bytes(fn, key, dt, out)
        return out

    def get(self, fn, key, dt, shape):
        """The whole tensor (shape), read and checked."""
        dtype = np.dtype(NP_DTYPES[dt])
        a = np.empty(math.prod(shape) * dtype.itemsize, np.uint8)
        return self.read(fn, key, dt, 0, a).view(dtype).reshape(shape)

    def close(self) -> None:
        with self.lock:
            for f in self.open.values():
                self._drop(f)
            self.open.clear()


FILES = _Files()
CHECK_BLOCK = 1 << 20           # bytes checked at a time (in cache, one scratch array a thread)
_scratch = threading.local()
# non-finite: |bits| (sign masked off) at least the all-ones exponent's; as unsigned words
_NONFINITE = {"F32": (np.uint32, 0x7FFFFFFF, 0x7F800000), "F16": (np.uint16, 0x7FFF, 0x7C00),
              "BF16": (np.uint16, 0x7FFF, 0x7F80), "F64": (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)}


def _masked_max(a: np.ndarray, mask: int) -> int:
    """max(a & mask) over an unsigned array, a block at a time (no temporary of a's size)."""
    per = CHECK_BLOCK // a.itemsize
    tmp = getattr(_scratch, "buf", None)
    if tmp is None:
        tmp = _scratch.buf = np.empty(CHECK_BLOCK, np.uint8)
    tmp = tmp.view(a.dtype)
    top = 0
    for i in range(0, a.size, per):
        x = a[i:i + per]
        t = tmp[:x.size]
        np.bitwise_and(x, a.dtype.type(mask), out=t)
        top = max(top, int(t.max()))
    return top


def _check_bytes(fn, key, dt, raw: np.ndarray) -> None:
    """Refuse (naming the file's tensor) the bytes of a tensor, or of whole elements of it, holding a
    non-finite value, an E4M3 NaN code or an E8M0 NaN scale: one masked max a block, no widening."""
    if raw.size == 0:
        return
    if dt in _NONFINITE:
        word, mask, inf = _NONFINITE[dt]
        if _masked_max(raw.view(word), mask) >= inf:
            raise CheckpointError(f"{fn}: tensor {key!r} holds non-finite values")
    elif dt == "F8_E4M3" and _masked_max(raw, 0x7F) == 0x7F:
        raise CheckpointError(f"{fn}: tensor {key!r} holds E4M3 NaN codes (0x7F / 0xFF)")
    elif (dt == "F8_E8M0" or (dt == "U8" and key.endswith(SCALE_SUFFIXES))) and int(raw.max()) == 255:
        raise CheckpointError(f"{fn}: scale {key!r} holds the E8M0 NaN byte 255")


def _checked(fn, key, dt, a):
    """The values of a tensor just read (eagerly), refused as _check_bytes does."""
    _check_bytes(fn, key, dt, np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return a


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
                    out[k] = (_checked(fn, k, dt, a.view(np.uint8) if dt.startswith("F8") or dt == "I8" else a), dt)
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
        elif not _finite(np.asarray(a)):
            raise CheckpointError(f"{where}: tensor {name!r} holds non-finite values")


def _finite(a):
    """All values finite, without widening (checkpoints of many GB)."""
    dt = {BF16: "BF16", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
          np.dtype(np.float64): "F64"}.get(np.dtype(a.dtype))
    if dt is None:
        return bool(np.isfinite(a).all())
    word, mask, inf = _NONFINITE[dt]
    return _masked_max(np.ascontiguousarray(a).reshape(-1).view(word), mask) < inf


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


# --- random weights -------------------------------------------------------------------------------------

BLOCK = 1 << 22            # values drawn once per kind of weight, then tiled (_tiled)
EXACT_MAX = 1 << 20        # tensors up to this many values are drawn (and quantised) value by value


def _normal(rng, shape):
    """Standard normal float32 values (up to EXACT_MAX of them; _tiled past that)."""
    return rng.standard_normal(shape, dtype=np.float32)


def _tiled(rng, shape, block):
    """An array of `shape` filled with randomly rotated copies of the 1-D `block` (its dtype): for
    tensors past EXACT_MAX values, where drawing billions of normals (a one-GPU benchmark model) would
    take minutes; a matrix of rotated blocks is as good a random weight for timing and for O(1)
    activations, and filling it is a copy at memory speed."""
    n, B = int(np.prod(shape)), block.size
    out = np.empty(n, block.dtype)
    raw = np.dtype(f"u{block.dtype.itemsize}")          # plain copies (ml_dtypes' own copy is per element)
    dst, src = out.view(raw), block.view(raw)
    for i in range(0, n, B):
        m, r = min(B, n - i), int(rng.integers(B))
        head = min(m, B - r)
        dst[i:i + head] = src[r:r + head]
        dst[i + head:i + m] = src[:m - head]
    return out.reshape(shape)


MAX_CODE = {"fp8": 448.0, "fp4": 6.0}          # largest E4M3 / E2M1 magnitude


def quantize(w, fmt: str, grid_rows: int | None = None) -> QuantWeight:
    """DeepSeek's quantisation of float weights [..., N, K] (as its conversion scripts do): per block
    the scale 2^ceil(log2(amax / largest code)) (E8M0), codes rounded to nearest (ml_dtypes);
    grid_rows: rows per scale grid (default N: one grid per matrix)."""
    q = QUANT[fmt]
    w = np.asarray(w, np.float32)
    lead, (N, K) = w.shape[:-2], w.shape[-2:]
    gr = N if grid_rows is None else grid_rows
    mats = w.reshape(-1, gr, K)
    sr, sc = q.grid(gr, K)
    pad = np.zeros((mats.shape[0], sr * q.block_rows, sc * q.block_cols), np.float32)
    pad[:, :gr, :K] = mats
    blocks = np.abs(pad.reshape(-1, sr, q.block_rows, sc, q.block_cols)).max(axis=(2, 4))
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(np.maximum(blocks, 1e-30) / MAX_CODE[fmt]))
    e = np.clip(e, -127, 127)
    full = np.repeat(np.repeat(np.exp2(-e), q.block_rows, axis=1), q.block_cols, axis=2)[:, :gr, :K]
    scaled = (mats * full).reshape(lead + (N, K))
    codes = scaled.astype(ml_dtypes.float8_e4m3fn if fmt == "fp8" else ml_dtypes.float4_e2m1fn).view(np.uint8)
    if fmt == "fp4":
        if K % 2:
            raise ValueError(f"FP4 packs two inputs a byte: K={K} is odd")
        codes = (codes[..., 0::2] & 15) | (codes[..., 1::2] << 4)
    scale = (e + 127).astype(np.uint8).reshape(lead + (N // gr * sr, sc))
    return QuantWeight(fmt, np.ascontiguousarray(codes), scale, gr)


_CODE_BLOCKS: dict[str, np.ndarray] = {}


def _random_quant(rng, shape, fmt, fan_in, grid_rows):
    """Random quantised weights at about 1/sqrt(fan_in): exact quantisation of normals up to
    EXACT_MAX values; past that, randomly rotated copies of one block of codes with random scales around
    that level (as _normal does for floats: minutes saved on big models)."""
    n = int(np.prod(shape))
    if n <= EXACT_MAX:
        return quantize(_normal(rng, shape) / np.sqrt(fan_in), fmt, grid_rows)
    q = QUANT[fmt]
    per_byte = 8 // q.bits
    if fmt not in _CODE_BLOCKS:     # codes of N(0, 1) · (largest code / 4): the top of the range used
        base = quantize(rng.standard_normal((1, BLOCK), dtype=np.float32) * (MAX_CODE[fmt] / 4), fmt)
        _CODE_BLOCKS[fmt] = base.codes.reshape(-1)
    lead, (N, K) = shape[:-2], shape[-2:]
    codes = _tiled(rng, (n // per_byte,), _CODE_BLOCKS[fmt])
    sr, sc = q.grid(grid_rows, K)
    level = int(np.round(np.log2(4 / MAX_CODE[fmt] / np.sqrt(fan_in)))) + 127
    scale = (level - rng.integers(0, 2, tuple(lead) + (N // grid_rows * sr, sc))).astype(np.uint8)
    return QuantWeight(fmt, codes.reshape(tuple(lead) + (N, K // per_byte)), scale, grid_rows)


def random_weights(cfg: V4Config, seed: int = 0, dtype: DTypeLike | str = np.float32, experts: str | None = None) -> dict:
    """A random, seeded set of canonical weights whose activations stay O(1) through the layers:
    linear maps at 1/sqrt(fan-in), norms around 1, and every bias, sink and HC base random (zeros
    would hide a missing term). dtype: of the linear weights (float32, float16 or BF16), or "fp8":
    DeepSeek's published layout (the FP8 linears quantised, routed experts in `experts`, default
    "fp4", the rest BF16)."""
    rng = np.random.default_rng(seed)
    quant = isinstance(dtype, str) and dtype == "fp8"
    if quant and experts not in (None, "fp4", "fp8"):
        raise ValueError(f"experts must be 'fp4' or 'fp8', got {experts!r}")
    out, blocks = {}, {}
    F = cfg.moe_intermediate_size
    for name, shape in tensor_shapes(cfg).items():
        if name.endswith("tid2eid"):        # distinct experts per token
            E = cfg.n_routed_experts
            if shape[0] * E <= EXACT_MAX:
                out[name] = np.stack([rng.permutation(E)[:shape[1]] for _ in range(shape[0])]).astype(np.int32)
            else:
                out[name] = np.argsort(rng.random((shape[0], E), dtype=np.float32), axis=1)[:, :shape[1]].astype(np.int32)
        elif name.endswith("norm.weight") or name.endswith("_scale"):
            out[name] = (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(("attn_sink", "ape", "gate.bias")):
            out[name] = rng.standard_normal(shape).astype(np.float32)
        elif name.endswith("_base"):
            out[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("_fn"):
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        elif quant and quantisable(name):
            routed = name.endswith(("experts.w13", "experts.w2"))
            fmt = (experts or "fp4") if routed else "fp8"
            grid_rows = F if name.endswith("w13") else shape[-2]
            out[name] = _random_quant(rng, shape, fmt, shape[-1], grid_rows)
        else:                               # embed at 1, linear maps at 1/sqrt(fan-in)
            dt = np.dtype(BF16 if quant else dtype)
            scale = np.float32(1.0 if name == "embed.weight" else 1.0 / np.sqrt(shape[-1]))
            if int(np.prod(shape)) <= EXACT_MAX:
                out[name] = (_normal(rng, shape) * scale).astype(dt, copy=False)
            else:                           # one block drawn per (dtype, scale), tiled
                key = (dt, float(scale))
                if key not in blocks:
                    blocks[key] = (rng.standard_normal(BLOCK, dtype=np.float32) * scale).astype(dt)
                out[name] = _tiled(rng, shape, blocks[key])
    return out


def write_random(path: str, cfg: V4Config, seed: int = 0, dtype: str = "f32", naming: str = "save_pretrained",
                 shards: int = 1, experts: str | None = None, scale_dtype: str = "e8m0") -> dict:
    """A random, seeded checkpoint directory for `cfg` (linear weights in dtype "f32", "bf16" or
    "f16", or "fp8": the published FP8 / FP4 layout, routed experts in `experts`); returns the
    weights written."""
    dt = {"f32": np.float32, "bf16": BF16, "f16": np.float16, "fp8": "fp8"}.get(dtype)
    if dt is None:
        raise ValueError(f"dtype must be 'f32', 'bf16', 'f16' or 'fp8', got {dtype!r}")
    w = random_weights(cfg, seed, dt, experts)
    save_hf(path, cfg, w, naming=naming, shards=shards, scale_dtype=scale_dtype)
    return w
