"""MUL_MAT on the matrix units (shaders/mul_mat_coopmat.comp): its tuning knobs (`COOPMAT`), the tiling
the device's shared memory picks, which weights it takes (`coopmat_weight_refusal`), its specialization
constants and its dispatches (docs/tensor_cores.md). `ops.mul_mat.pick_kernel` decides when it runs."""
import numpy as np

from ..core.tuning import knob_table
from .base import Launch, grid_1d, weight_defines
from .quant import QuantFormat


# The tensor-core kernel (shaders/mul_mat_coopmat.comp): a workgroup tile of `tokens` × `outputs`, warps
# of 32 lanes each computing warp_tokens × warp_outputs as 16 × 16 accumulators, k_step inputs staged
# a step; from min_tokens tokens it takes MUL_MAT over bf16 / f16 / FP8 / FP4 weights where the device
# can run it. The tiling knobs left at None come from COOPMAT_TILINGS by the device's shared memory.
COOPMAT = knob_table(
    "coopmat",
    tokens=(None, "tokens of a workgroup tile of the tensor-core MUL_MAT (BM, a multiple of warp_tokens; None: "
                  "the device's tiling, coopmat_tiling)"),
    outputs=(None, "outputs of a workgroup tile of the tensor-core MUL_MAT (BN, a multiple of warp_outputs; FP8 "
                   "weights: a divisor of 128)"),
    warp_tokens=(None, "tokens of a warp's (32 lanes') tile (WM, a multiple of 16)"),
    warp_outputs=(None, "outputs of a warp's tile (WN, a multiple of 16)"),
    k_step=(None, "inputs staged in shared memory a step (BK, a multiple of 16; FP8 weights: a divisor of 128)"),
    buffers=(None, "staging buffers in shared memory (1 or 2): with 2 the next k step is stored into the other "
                   "buffer while this one is multiplied, one barrier a step instead of 2"),
    group=(None, "token tiles a group of the workgroups' order, token tiles fastest within a group (1: output "
                 "tiles fastest): the workgroups of a group, in flight together, share its weight tiles in L2"),
    scales=(None, "where the rows' power-of-two scales are found: 'tile' (each workgroup scans its own x and w "
                  "rows over all of K first) or 'pass' (a first dispatch scans every row once and writes each "
                  "tile's scales into the tile's own outputs; tiles with fewer than 2 rows or outputs in range "
                  "take 'tile')"),
    x_half=(False, "with coopmat.scales='pass' and 8 inputs a load (K % 8 == 0, x and weight rows 16-byte "
                   "aligned): the first pass also writes each x row times its power-of-two scale, rounded to "
                   "fp16, once (batch × T × K × 2 bytes of scratch), and the multiplying workgroups stage x's "
                   "chunks from those halves instead of converting f32 x in every output tile (the same "
                   "values: the same outputs bit for bit); off until measured on a GPU"),
    fp8_scales=("block", "how FP8 weights' 128 × 128 block scales reach the tensor-core MUL_MAT: 'block' (each "
                         "block's products summed apart and added times its scale, in f32: exact for any scales; "
                         "needs tile outputs and k step dividing 128) or 'fold' (folded into a power-of-two shift "
                         "per row, one accumulator set, any tiling; rows whose scales span more than 12 binades "
                         "summed in f32 instead)"),
    min_tokens=(16, "from this many tokens MUL_MAT over bf16 / f16 / FP8 / FP4 weights runs on the matrix units "
                    "where the device has them and coopmat.auto is on (kernel 'coopmat')"),
    auto=(True, "the automatic choice takes the matrix units ('coopmat') where the device has them (False: the "
                "f32 lanes everywhere unless a graph asks for kernel='coopmat')"),
    emulate=(False, "where the device has no matrix units, MUL_MAT takes 'coopmat_fma' where it would take "
                    "'coopmat' if it had them and coopmat.auto were on (the same data flow and fp16 rounding, FMA "
                    "products): the tensor-core path's numerics on any device, for tests"))
COOPMAT_DTYPES = ("bf16", "f16")
COOPMAT_SCALES = ("tile", "pass")
FP8_SCALES = ("block", "fold")


X_HALF_POOL = "mul_mat.x_half"          # the fp16 x rows of coopmat.x_half (OpDef.scratch)
X_HALF_OFF = "coopmat.x_half is off"


def x_half_on() -> bool:
    """The knob coopmat.x_half (ValueError naming it where it is not a bool)."""
    on = COOPMAT["x_half"]
    if not isinstance(on, bool):
        raise ValueError(f"tuning knob 'coopmat.x_half' must be True or False, got {on!r}")
    return on


def fp8_fold() -> bool:
    """Whether FP8 weights' block scales are folded into row shifts (knob coopmat.fp8_scales)."""
    mode = COOPMAT["fp8_scales"]
    if mode not in FP8_SCALES:
        raise ValueError(f"tuning knob 'coopmat.fp8_scales' must be one of {FP8_SCALES}, got {mode!r}")
    return mode == "fold"


TILING_KNOBS = ("tokens", "outputs", "warp_tokens", "warp_outputs", "k_step", "buffers", "scales", "group")
# The tilings the device's shared memory picks (knobs left at None): the H200's fastest (128 × 128 tiles,
# 8 warps of 64 × 32, k step 64, scales by a first pass, groups of 8: 5-6x gemm_shared,
# results/h200/gemm_coopmat_h200.txt) where a workgroup may take 48 KiB, else 64 × 128 tiles of 4 warps
# (17 KiB: lavapipe's 32 KiB holds it)
COOPMAT_TILINGS = (
    (48 * 1024, dict(tokens=128, outputs=128, warp_tokens=64, warp_outputs=32, k_step=64, buffers=1, scales="pass",
                     group=8)),
    (0, dict(tokens=64, outputs=128, warp_tokens=32, warp_outputs=64, k_step=32, buffers=1, scales="tile",
             group=1)))


def coopmat_tiling(device) -> dict:
    """The tensor-core kernel's tiling on `device`: each of TILING_KNOBS as the knob says, or where it is
    None as COOPMAT_TILINGS' first entry whose shared memory the device offers (with 256 invocations)."""
    lim = device.caps.limits
    big = min(lim.max_workgroup_invocations, lim.max_workgroup_size[0]) >= 256
    base = next(t for need, t in COOPMAT_TILINGS if lim.max_shared_memory >= need and (big or not need))
    return {k: base[k] if COOPMAT[k] is None else COOPMAT[k] for k in TILING_KNOBS}


def coopmat_weight_refusal(device, w_dtype: str, fmt: QuantFormat | None = None, w=None, N: int | None = None,
                           grid_rows: int | None = None) -> str | None:
    """Why the tensor-core kernel does not take these weights (None: it does): f32 weights (fp16 products
    would round them); FP8 where the tiling's outputs or k step do not divide its 128 × 128 scale blocks,
    or (given the weight view w of N rows, grid_rows a grid) a tile's outputs would span two block rows."""
    if fmt is None:
        return None if w_dtype in COOPMAT_DTYPES else f"{w_dtype} weights stay off the matrix units (fp16 products " \
                                                      f"would round them)"
    if fmt.name != "fp8" or fp8_fold():
        return None
    t = coopmat_tiling(device)
    bn, bk = t["outputs"], t["k_step"]
    if not (isinstance(bn, int) and isinstance(bk, int)) or 128 % bn or 128 % bk:
        return (f"FP8 weights need tile outputs and k step dividing their 128 × 128 scale blocks (coopmat.outputs "
                f"{bn!r}, coopmat.k_step {bk!r}; coopmat.fp8_scales='fold' has no such need)")
    if w is None or N is None or grid_rows is None:
        return None
    kw = w.shape[-1]
    starts = {(w.offset + sum(i * st for i, st in zip(idx, w.strides[:-2]))) // kw
              for idx in np.ndindex(*w.shape[:-2])}           # each batch item's first row (w is contiguous)
    first = np.arange(0, N, bn)
    last = np.minimum(first + bn, N) - 1
    for r in starts:
        a, b = r + first, r + last
        if np.any(a // grid_rows != b // grid_rows) or np.any((a % grid_rows) // 128 != (b % grid_rows) // 128):
            return (f"FP8 weights whose tiles of {bn} outputs would span two 128-row scale blocks (rows start at "
                    f"{r}, grid of {grid_rows} rows)")
    return None


def coopmat_spec(device, kernel: str, chunk: int = 2) -> tuple[int, ...]:
    """The tensor-core kernel's spec constants (workgroup size, BM, BN, WM, WN, BK, NBUF, SCALES, GM) from
    the knobs in effect, an invocation staging `chunk` consecutive inputs (8 with VEC8, 4 with VEC4,
    else 2); ValueError naming the knob where they do not fit together or the device."""
    t = coopmat_tiling(device)
    bm, bn, wm, wn, bk = (t[k] for k in ("tokens", "outputs", "warp_tokens", "warp_outputs", "k_step"))
    for name, v in (("warp_tokens", wm), ("warp_outputs", wn), ("k_step", bk), ("tokens", bm), ("outputs", bn)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v % 16:
            raise ValueError(f"tuning knob 'coopmat.{name}' must be a positive multiple of 16, got {v!r}")
    if bm % wm or bn % wn:
        raise ValueError(f"tuning knobs 'coopmat.tokens' and 'coopmat.outputs' ({bm}, {bn}) must be multiples of "
                         f"'coopmat.warp_tokens' and 'coopmat.warp_outputs' ({wm}, {wn})")
    nbuf, scales, group = t["buffers"], t["scales"], t["group"]
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"tuning knob 'coopmat.group' must be an integer ≥ 1, got {group!r}")
    if nbuf not in (1, 2) or isinstance(nbuf, bool):
        raise ValueError(f"tuning knob 'coopmat.buffers' must be 1 or 2, got {nbuf!r}")
    if scales not in COOPMAT_SCALES:
        raise ValueError(f"tuning knob 'coopmat.scales' must be one of {COOPMAT_SCALES}, got {scales!r}")
    wg = 32 * (bm // wm) * (bn // wn)
    chunks = bk // chunk                    # an invocation's inputs of a row a step, the row's chunks
    rows = wg // chunks                     # rows staged at once
    if wg % chunks or bm % rows or bn % rows:
        raise ValueError(f"tuning knob 'coopmat.k_step' = {bk}: its {chunks} chunks of {bk // chunks} inputs must "
                         f"divide the workgroup's {wg} invocations into rows that divide the tile ({bm} × {bn})")
    lim = device.caps.limits
    # the staging buffers (later the warps' 1 KiB scratch each), the rows' maxima and shifts
    shared = max(nbuf * (bm + bn) * (bk + 8) * 2, wg // 32 * 1024) + (bm + bn) * 8
    if wg > min(lim.max_workgroup_invocations, lim.max_workgroup_size[0]) or shared > lim.max_shared_memory:
        raise ValueError(f"MUL_MAT kernel={kernel!r}: tiles {bm} × {bn} (warps {wm} × {wn}, k step {bk}, "
                         f"{nbuf} buffer(s)) need {wg} invocations and {shared} B of shared memory; {device.name} "
                         f"has {min(lim.max_workgroup_invocations, lim.max_workgroup_size[0])} and "
                         f"{lim.max_shared_memory} B")
    return (wg, bm, bn, wm, wn, bk, nbuf, int(scales == "pass"), group)


def rows_aligned(t, elems: int) -> bool:
    """True when the view has k contiguous and every row starting on a multiple of `elems` elements."""
    if t.strides[-1] != 1 or t.offset % elems:
        return False
    return not any(s % elems for n, s in zip(t.shape[:-1], t.strides[:-1]) if n > 1)


def coopmat_chunk(x, w, K: int, fmt: QuantFormat | None = None) -> int:
    """Inputs an invocation of the tensor-core kernel loads and stages at once: 8 (VEC8) where K % 8 == 0
    and x's and w's rows are 16-byte aligned, else 4 (VEC4: K % 4, x 16-byte and w 8-byte aligned), else
    2 at any strides. Quantised weights (whole contiguous rows of words): x's alignment decides, 8 or 2
    (no VEC4 variants)."""
    w_ok = (lambda e: True) if fmt else (lambda e: rows_aligned(w, e))
    if K % 8 == 0 and rows_aligned(x, 4) and w_ok(8):
        return 8
    if K % 4 == 0 and rows_aligned(x, 4) and not fmt and rows_aligned(w, 4):
        return 4
    return 2


CHUNK_DEFINES: dict[int, dict[str, int]] = {8: {"VEC8": 1}, 4: {"VEC4": 1}, 2: {}}


def pass_fits(bm: int, bn: int, T: int, N: int) -> bool:
    """Whether every bm × bn tile of T × N holds at least 2 rows and 2 outputs in range: room among its
    outputs for the R + C row shifts the first pass (ROW_SCALES) writes there."""
    return min(T - bm * ((T - 1) // bm), N - bn * ((N - 1) // bn)) >= 2


def x_half_refusal(device, kernel: str, T: int, N: int | None, chunk: int) -> str | None:
    """The one place that decides whether the tensor-core MUL_MAT of T tokens and N outputs, loading
    `chunk` inputs at once (coopmat_chunk), stages x from the fp16 rows its first pass rounded once
    (knob coopmat.x_half): None where it does, else why not (X_HALF_OFF where the knob is off). It
    needs the first pass (coopmat.scales='pass', every tile 2 × 2 in range; N None: not known, that
    check left out) and 8 inputs a load."""
    if not x_half_on():
        return X_HALF_OFF
    if chunk != 8:
        return "it needs 8 inputs a load (K % 8 == 0, x and weight rows 16-byte aligned)"
    spec = coopmat_spec(device, kernel, chunk)
    if not spec[7]:
        return "it needs the scales by a first pass (coopmat.scales='pass'), which writes the halves"
    if N is not None and not pass_fits(spec[1], spec[2], T, N):
        return "a tile with a single row or output in range takes the scales by tile, without the first pass"
    return None


def x_half_scratch(x, w, batch: int, T: int, K: int, fmt: QuantFormat | None = None) -> dict[str, tuple]:
    """The scratch a MUL_MAT that may take the tensor-core kernel asks for (OpDef.scratch, before the device
    is known): coopmat.x_half's fp16 x rows, batch × T × K halves, where the knob is on and the views
    load 8 inputs at once; whether they are used is x_half_refusal's word when the node is lowered."""
    if not x_half_on() or coopmat_chunk(x, w, K, fmt) != 8:
        return {}
    return {X_HALF_POOL: (batch * T * K // 2, "i32")}


def coopmat_launches(device, kernel: str, x, w, out, push: dict, batch: int, T: int, N: int, K: int,
                     fmt: QuantFormat | None = None, scale=None) -> list:
    """The tensor-core MUL_MAT's dispatches, loading coopmat_chunk's inputs an invocation; with coopmat.scales
    = 'pass' (and every tile at least 2 × 2 in range) first ROW_SCALES. Quantised weights (fmt; push has
    quant_fields): their scale bytes are binding 3. The last binding is the fp16 x rows of coopmat.x_half
    (the graph's X_HALF_POOL, written by ROW_SCALES) where x_half_refusal says they are used, else x
    itself (never read: the shader declares the binding in every variant)."""
    chunk = coopmat_chunk(x, w, K, fmt)
    spec = coopmat_spec(device, kernel, chunk)
    bm, bn = spec[1], spec[2]
    t_tiles, n_tiles = -(-T // bm), -(-N // bn)
    if spec[7] and not pass_fits(bm, bn, T, N):
        spec = spec[:7] + (0,) + spec[8:]   # a tile of 1 row or output has no room for its scales
    wdef = fmt.define() if fmt else weight_defines(w)
    fold = {"FP8_FOLD": 1} if fmt and fmt.name == "fp8" and fp8_fold() else {}
    args = [x, w, out] + ([scale] if fmt else [])
    half = x_half_refusal(device, kernel, T, N, chunk) is None
    xh_at = len(args)
    args.append(out.graph.scratch(X_HALF_POOL)[:batch * T * K // 2] if half else x)
    xh = {"X_HALF": 1} if half else {}  # (a specialization constant by name: no variant of its own)
    defines = {"CM_NV": 1} if kernel == "coopmat" else {}
    defines.update(wdef, **fold, **CHUNK_DEFINES[chunk], **xh)
    gemm = Launch("mul_mat_coopmat", args, (2,), push, grid_1d(batch * t_tiles * n_tiles, 1),
                  defines=defines, spec=spec, full_subgroups=kernel == "coopmat")
    if not spec[7]:
        return [gemm]
    scales = Launch("mul_mat_coopmat", args, (2, xh_at) if half else (2,), push,
                    grid_1d(-(-batch * (T + N) // 16), 1),
                    defines={"ROW_SCALES": 1, **wdef, **CHUNK_DEFINES[chunk], **xh}, spec=(256, bm, bn))
    return [scales, gemm]
