"""Random, seeded DeepSeek-V4 weights for tests and benches (`random_weights`, `write_random`: a
checkpoint directory in any of the read namings) and `quantize`, float weights into DeepSeek's
FP8 / FP4 layout. Large tensors repeat one random block, so presets of many GB build in seconds."""
from __future__ import annotations

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

from ..ops.quant import QUANT
from .tensor_files import BF16, QuantWeight
from .checkpoint import quantisable, save_hf, tensor_shapes
from .config import V4Config


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
