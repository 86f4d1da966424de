"""DeepSeek's block-scaled weight formats as the kernels read them: FP8 (E4M3 codes, one E8M0 scale
per 128 × 128 block) and FP4 (E2M1 codes, two a byte, one E8M0 scale per 32 inputs of a row).
`QUANT` names them; `quant_arrays` packs the published bytes into the words and scale words the
kernels bind (shaders/weights.glsl), `dequantize` is their float64 meaning (written from the format
description, not from the kernels), `check_quant` / `quant_fields` check an op's quantised inputs
and give the push fields weights.glsl reads."""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QuantFormat:
    """A block-scaled weight format: codes of `bits` bits, one E8M0 scale byte per block of
    block_rows × block_cols (rows × inputs)."""
    name: str
    bits: int
    block_rows: int
    block_cols: int

    @property
    def per_word(self) -> int:
        return 32 // self.bits

    def words(self, K: int) -> int:
        """32-bit words of a row of K codes (rows are padded to whole words on the device)."""
        return -(-K // self.per_word)

    def grid(self, N: int, K: int) -> tuple[int, int]:
        """Scale grid of one N × K matrix (a partial last block has its own scale)."""
        return -(-N // self.block_rows), -(-K // self.block_cols)

    def define(self) -> dict:
        return {f"W_{self.name.upper()}": 1}


QUANT = {"fp8": QuantFormat("fp8", 8, 128, 128), "fp4": QuantFormat("fp4", 4, 1, 32)}
# E2M1 magnitudes by code (bit 3 is the sign)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def decode_e4m3(codes) -> np.ndarray:
    """float64 values of E4M3 (fn) bytes: sign bit 7, exponent bits 6..3 (bias 7), mantissa 2..0;
    exponent 0 is subnormal (m · 2^−9); 0x7F / 0xFF are NaN."""
    c = np.asarray(codes, np.uint8).astype(np.int64)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * np.exp2(e - 7.0))
    v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    return np.where(c & 0x80, -v, v)


def decode_e2m1(codes) -> np.ndarray:
    """float64 values of E2M1 nibbles (bit 3 the sign, bits 2..0 index E2M1)."""
    c = np.asarray(codes, np.uint8).astype(np.int64)
    v = np.asarray(E2M1)[c & 7]
    return np.where(c & 8, -v, v)


def decode_e8m0(codes) -> np.ndarray:
    """float64 scales of E8M0 bytes: 2^(b − 127), 255 is NaN."""
    b = np.asarray(codes, np.uint8).astype(np.float64)
    return np.where(b == 255, np.nan, np.exp2(b - 127))


def unpack_codes(fmt: QuantFormat, words, K: int) -> np.ndarray:
    """The codes [..., rows, K] (uint8) of packed words [..., rows, words(K)] (little-endian:
    element 0 in the lowest bits)."""
    b = np.ascontiguousarray(words).view(np.uint8)
    if fmt.bits == 8:
        return b[..., :K]
    out = np.empty(b.shape[:-1] + (2 * b.shape[-1],), np.uint8)
    out[..., 0::2], out[..., 1::2] = b & 15, b >> 4
    return out[..., :K]


def dequantize(fmt: QuantFormat | str, words, scale_words, K: int, matrices: int = 1) -> np.ndarray:
    """float64 weights [..., N, K] of packed codes [..., N, words(K)] and the flat scale bytes
    (int32 words, 4 bytes each): the rows form `matrices` equal matrices, each with its scale grid
    (fmt.grid) stored row-major, one after the other; w = code value · 2^(s − 127)."""
    fmt = QUANT[fmt] if isinstance(fmt, str) else fmt
    words = np.asarray(words)
    lead = words.shape[:-1]
    rows = int(np.prod(lead))
    codes = unpack_codes(fmt, words.reshape(rows, -1), K)
    vals = decode_e4m3(codes) if fmt.bits == 8 else decode_e2m1(codes)
    Nm = rows // matrices
    sr, sc = fmt.grid(Nm, K)
    sb = np.ascontiguousarray(scale_words).view(np.uint8)[:matrices * sr * sc].reshape(matrices, sr, sc)
    s = decode_e8m0(sb)
    s = np.repeat(np.repeat(s, fmt.block_rows, axis=1)[:, :Nm], fmt.block_cols, axis=2)[:, :, :K]
    return (vals.reshape(matrices, Nm, K) * s).reshape(lead + (K,))


def quant_arrays(codes, scale) -> tuple[np.ndarray, np.ndarray]:
    """(packed words int32 [..., rows, words], scale words int32 [n]) of published bytes: codes uint8
    [..., rows, bytes a row] (rows padded to whole words: no copy when they already are), scale
    bytes of any shape (flattened, padded to a whole word)."""
    codes = np.asarray(codes)
    pad = -codes.shape[-1] % 4
    if pad:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (pad,), np.uint8)], axis=-1)
    words = np.ascontiguousarray(codes).view(np.int32)
    s = np.ascontiguousarray(scale).reshape(-1).view(np.uint8)
    if s.size % 4:
        s = np.concatenate([s, np.zeros(-s.size % 4, np.uint8)])
    return words, s.view(np.int32)


def check_quant(op: str, params: dict, w, scale, K: int, default_grid_rows: int) -> tuple[QuantFormat, int]:
    """(format, rows per scale grid) of params wq= and grid_rows= (default default_grid_rows);
    ValueError unless w holds whole contiguous rows of packed codes for K inputs and scale the
    bytes of one grid per grid_rows rows."""
    fmt_name = params["wq"]
    fmt = QUANT.get(fmt_name)
    if fmt is None:
        raise ValueError(f"{op}: wq must be one of {sorted(QUANT)}, got {fmt_name!r}")
    if w.dtype != "i32" or scale.dtype != "i32" or scale.ndim != 1:
        raise ValueError(f"{op}: wq={fmt_name!r} takes w as i32 words of packed codes and the scale bytes as a 1-D "
                         f"i32 tensor (the last input); got w {w.dtype} {list(w.shape)}, scale {scale.dtype} "
                         f"{list(scale.shape)}")
    if w.shape[-1] != fmt.words(K):
        raise ValueError(f"{op}: w {list(w.shape)} holds {w.shape[-1]} words a row; {K} {fmt_name} codes take "
                         f"{fmt.words(K)}")
    if w.offset != 0 or not w.is_contiguous:
        raise ValueError(f"{op}: quantised weights must be a whole contiguous tensor (their scale grid is by row "
                         "number), got a view")
    rows = int(np.prod(w.shape[:-1]))
    gr = params.get("grid_rows", default_grid_rows)
    if isinstance(gr, bool) or not isinstance(gr, int) or gr < 1 or rows % gr:
        raise ValueError(f"{op}: grid_rows must be an integer ≥ 1 dividing the weight's {rows} rows, got {gr!r}")
    sr, sc = fmt.grid(gr, K)
    need = rows // gr * sr * sc
    if scale.numel * 4 < need:
        raise ValueError(f"{op}: scale holds {scale.numel * 4} bytes; w {list(w.shape)} ({fmt_name}, K={K}) needs "
                         f"{rows // gr} grid(s) of {sr} × {sc} = {need}")
    return fmt, gr


def quant_fields(fmt: QuantFormat, K: int, grid_rows: int) -> dict[str, int]:
    """The push fields q_kw, q_rows, q_srows, q_sc of weights.glsl."""
    sr, sc = fmt.grid(grid_rows, K)
    return {"q_kw": fmt.words(K), "q_rows": grid_rows, "q_srows": sr, "q_sc": sc}
