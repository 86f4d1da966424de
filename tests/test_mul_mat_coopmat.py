"""MUL_MAT on 16-bit matrix units (shaders/mul_mat_coopmat.comp) against float64.

"coopmat_fma" is the kernel's data flow on any device: the same per-row power-of-two scales, the same
fp16 staging, FMA products in place of the cooperative matrices. It runs here at lavapipe's subgroup
sizes 4, 8 and 16 (LP_NATIVE_VECTOR_WIDTH in a child process). Each result is checked twice: against
the exact float64 product (NMSE ≤ 1e-5, the issue's bound for the tensor-core path, and a max-abs
bound) and against the float64 product of the fp16-rounded scaled rows (`fp16_reference`), which it
must match to f32 summation error: so the rounding and the scales are the ones the header states.
"coopmat" (the cooperative matrices) runs where the device has them (the H200), and is skipped where
it has none (lavapipe), as TCR's are.
"""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from dsv4_vk.core.executor import Executor
from dsv4_vk.core.graph import Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.model.checkpoint import BF16
from dsv4_vk.ops import mul_mat, mul_mat_coopmat, quant
from dsv4_vk.ops.base import coopmat_unavailable
from dsv4_vk.vk.caps import CoopMatShape
from dsv4_vk.vk import default_device

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL_TILES = {"coopmat.tokens": 32, "coopmat.outputs": 32, "coopmat.warp_tokens": 16, "coopmat.warp_outputs": 16}
# the tiling a device with 32 KiB of shared memory takes (coopmat_tiling: lavapipe's), set explicitly where a test
# checks its launches on any device
CPU_TILING = {"coopmat.tokens": 64, "coopmat.outputs": 128, "coopmat.warp_tokens": 32, "coopmat.warp_outputs": 64,
              "coopmat.k_step": 32, "coopmat.buffers": 1, "coopmat.scales": "tile", "coopmat.group": 1}
SMALL_TILE_SCALES = {**SMALL_TILES, "coopmat.scales": "tile"}
NMSE_MAX = 1e-5                 # against the exact product (fp16's rounding of x: about 1e-7 on normal values)
# against the fp16-rounded rows: f32 sums in another order (FMA), or as the matrix units sum their
# products (not necessarily rounded to nearest at every step: looser, still well below fp16's own
# rounding, NMSE about 4e-8 on these inputs)
NMSE_FP16_MAX = {"coopmat_fma": 1e-11, "coopmat": 1e-8}


def f32_sum_rel(K):
    """The worst relative error (to Σ|terms|) of an f32 kernel's sum of K products, each rounded once
    (fused multiply-adds in order), plus per 128-input scale block its scaled add (three roundings) and
    the unscale's three multiplies: recursive summation's bound n·u, n the roundings, u = 2⁻²⁴. The
    typical error is about √n·u, but an x row one value dominates rounds every later step at the size of
    its terms, so a fixed bound below n·u fails on some fresh inputs."""
    return (K + 3 * -(-K // 128) + 3) * 1.001 * 2.0 ** -24


def np_dtype(dtype):
    return BF16 if dtype == "bf16" else np.dtype(np.float16)


def row_shifts(a):
    """The kernel's shift of each row of a (float64 values): min(15 − e, 126) with 2^(e−1) ≤ m < 2^e,
    m the row's largest finite |value| read as f32 (its exponent field)."""
    a = np.abs(np.asarray(a, np.float32))
    m = np.where(np.isfinite(a), a, 0).max(axis=-1)
    e = (m.view(np.uint32) >> 23).astype(np.int64) - 126
    return np.minimum(15 - e, 126)


def fp16_reference(x, w):
    """float64 x @ wᵀ of the rows as the kernel stages them: scaled by 2^shift, rounded to fp16 (round to
    nearest even), the scales undone after the product."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    sx, sw = row_shifts(x), row_shifts(w)
    with np.errstate(over="ignore", invalid="ignore"):
        xh = (x * np.exp2(sx)[..., None]).astype(np.float32).astype(np.float16).astype(np.float64)
        wh = (w * np.exp2(sw)[..., None]).astype(np.float32).astype(np.float16).astype(np.float64)
        return (xh @ np.swapaxes(wh, -1, -2)) * np.exp2(-(sx[..., :, None] + sw[..., None, :]))


def run_mul_mat(x, w, kernel, w_view=None, x_view=None):
    """MUL_MAT(x, w) through a graph (x an input, w a constant), optionally of views made by
    w_view(tensor) / x_view(tensor); the result and the check of the guard regions."""
    g = Graph()
    xt, wt = g.input("x", x.shape), g.const(w)
    xt = x_view(xt) if x_view else xt
    wt = w_view(wt) if w_view else wt
    g.output("y", g.op("MUL_MAT", xt, wt, kernel=kernel))
    ex = Executor()
    out = ex.run(g, x=x)
    assert ex.last.check_guards() == []
    return out["y"]


def check_against_both(got, x, w, what, kernel="coopmat_fma"):
    exact = np.matmul(np.asarray(x, np.float64), np.swapaxes(np.asarray(w, np.float64), -1, -2))
    # (nmse and max_abs skip non-finite positions: inf / NaN where float64 has none fail here)
    assert np.array_equal(np.isfinite(got), np.isfinite(exact)), f"{what}: {np.sum(~np.isfinite(got))} non-finite"
    e, e16 = nmse(got, exact), nmse(got, fp16_reference(x, w))
    assert e <= NMSE_MAX, f"{what}: NMSE {e:.2e} against float64"
    assert e16 <= NMSE_FP16_MAX[kernel], f"{what}: NMSE {e16:.2e} against the fp16-rounded rows"
    assert max_abs(got, exact) <= 3e-3 * np.abs(exact).max(), what
    return e, e16


# (T, K, N): partial token and output tiles, K past a whole k step, one token tile, the model's widths
CASES = [(37, 70, 50), (16, 64, 32), (130, 300, 200), (1, 33, 17), (64, 1024, 96)]


def check_coopmat(kernel, rng, cases=CASES, tiles=SMALL_TILES):
    """kernel (coopmat or coopmat_fma) on fresh normal inputs at `cases`, bf16 and f16 weights."""
    with tuned(tiles):
        for T, K, N in cases:
            for dtype in ("bf16", "f16"):
                x = rng.standard_normal((T, K)).astype(np.float32) * 3
                w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np_dtype(dtype))
                check_against_both(run_mul_mat(x, w, kernel), x, w, (T, K, N, dtype), kernel)


# the kernel's variants: scales found by each workgroup or by a first pass, one or two staging buffers
PASS_2BUF = {"coopmat.scales": "pass", "coopmat.buffers": 2, "coopmat.group": 3}
VARIANTS = [SMALL_TILES, {**SMALL_TILES, **PASS_2BUF}, {**SMALL_TILES, "coopmat.scales": "pass"}]
# 8 warps of 64 × 32 (more shared memory than lavapipe has: on the matrix units only)
BIG_TILES = {"coopmat.tokens": 128, "coopmat.outputs": 128, "coopmat.warp_tokens": 64, "coopmat.warp_outputs": 32}
# ... with two staging buffers: steps of 32 inputs (two of 64 would take 75 KiB; the H200 offers 48)
BIG_PASS_2BUF = {**BIG_TILES, **PASS_2BUF, "coopmat.k_step": 32}


@pytest.mark.parametrize("tiles", [SMALL_TILES, {}, {"coopmat.tokens": 64, "coopmat.outputs": 64,
                                                     "coopmat.warp_tokens": 32, "coopmat.warp_outputs": 32,
                                                     "coopmat.k_step": 64},
                                   {**SMALL_TILES, **PASS_2BUF}, {**SMALL_TILES, "coopmat.buffers": 2},
                                   {"coopmat.tokens": 64, "coopmat.outputs": 32, "coopmat.warp_tokens": 32,
                                    "coopmat.warp_outputs": 16, "coopmat.k_step": 64, **PASS_2BUF}],
                         ids=["32x32", "default", "64x64_k64", "32x32_pass_2buf", "32x32_2buf", "64x32_k64_pass_2buf"])
def test_coopmat_fma_matches_float64(rng, tiles):
    check_coopmat("coopmat_fma", rng, CASES[:3] if tiles else CASES, tiles)


@pytest.mark.parametrize("width, subgroup", [(128, 4), (512, 16)])
def test_coopmat_fma_at_lavapipe_subgroup_size(device, width, subgroup):
    """bf16 / f16 and FP8 / FP4 weights, and coopmat.x_half (at 8 lanes, lavapipe's default, the tests above).
    (LP_NATIVE_VECTOR_WIDTH sets lavapipe's subgroup size; another device keeps its own: nothing to run.)"""
    if "llvmpipe" not in device.name:
        pytest.skip(f"LP_NATIVE_VECTOR_WIDTH sets only lavapipe's subgroup size; the device is {device.name}")
    code = ("import sys, numpy as np; sys.path.insert(0, %r); import test_mul_mat_coopmat as t; "
            "from dsv4_vk.vk import default_device; assert default_device().subgroup_size == %d; "
            "[t.check_coopmat('coopmat_fma', np.random.default_rng(), t.CASES[:3], v) for v in t.VARIANTS[:2]]; "
            "[t.check_quant_coopmat(np.random.default_rng(), knobs=v) for v in t.VARIANTS[:2]]; "
            "t.check_x_half(np.random.default_rng())"
            % (HERE, subgroup))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LP_NATIVE_VECTOR_WIDTH": str(width)})
    assert r.returncode == 0, r.stdout + r.stderr


def range_inputs(rng, T=20, K=96, N=24):
    """x rows and bf16 w rows far past fp16's range both ways (|x| to 4e20, |w| to 4e15; 1e-12 and
    1e-20, 1e-7 and 1e-15: every product still a normal f32), rows of ordinary values beside them,
    and one huge outlier in an ordinary row."""
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[0] *= 1e20
    x[1] *= 1e6
    x[2] *= 1e-12
    x[3] *= 1e-20
    x[4, 7] = 2e9                       # one outlier: the row's other values stay normal fp16
    w = rng.standard_normal((N, K))
    w[0] *= 1e15
    w[1] *= 1e5
    w[2] *= 1e-15
    w[3] *= 1e-7
    return x, w.astype(BF16)


@pytest.mark.parametrize("scales", ["tile", "pass"])
@pytest.mark.parametrize("kernel", ["coopmat_fma", "coopmat"])
def test_coopmat_range_past_fp16(device, rng, kernel, scales):
    """Rows far past fp16's range both ways: each output matches float64 relative to its own row and
    column's magnitude (the scales are per row), where fp16 without them would hold inf or 0."""
    if kernel == "coopmat" and coopmat_unavailable(device):
        kernel = "coopmat_fma"                  # no matrix units here: the same data flow with FMA products
    x, w = range_inputs(rng)
    with np.errstate(over="ignore"):
        assert np.isinf(x[:2].astype(np.float16)).any() and np.isinf(w[:2].astype(np.float16)).any()
    assert not x[2:4].astype(np.float16).any() and not w[2].astype(np.float16).any()
    with tuned({**SMALL_TILES, "coopmat.scales": scales}):
        got = run_mul_mat(x, w, kernel)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.isfinite(got).all() and not (got == 0).any()
    # each output against Σ|x_tk·w_nk|: the scale of its own sum
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    rel = np.abs(got - exact) / scale
    assert rel.max() <= 2e-3, f"worst relative error {rel.max():.2e} at {np.unravel_index(rel.argmax(), rel.shape)}"
    assert nmse(got / scale, exact / scale) <= NMSE_MAX
    rel16 = np.abs(got - fp16_reference(x, w)) / scale      # the fp16-rounded rows, to f32 summation error
    bound = f32_sum_rel(x.shape[1]) if kernel == "coopmat_fma" else 1e-4
    assert rel16.max() <= bound, f"{rel16.max():.2e} from the fp16-rounded rows"


@pytest.mark.parametrize("scales", ["tile", "pass"])
def test_coopmat_fma_inf_and_nan_placement(rng, scales):
    """inf and NaN inputs give the f32 path's inf / NaN outputs (they are left out of the row scales)."""
    T, K, N = 18, 40, 20
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(BF16)
    x[3, 5], x[7, 0], x[9, 39] = np.inf, np.nan, -np.inf
    x[9, 1] = 1e6                           # a large finite value beside an inf in its row
    w[4, 5] = 0                             # inf · 0: NaN in output (3, 4)
    with tuned({**SMALL_TILES, "coopmat.scales": scales}):
        got = run_mul_mat(x, w, "coopmat_fma")
    with np.errstate(invalid="ignore"):
        ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref))
    assert np.array_equal(np.sign(got[np.isinf(ref)]), np.sign(ref[np.isinf(ref)]))
    assert np.isnan(got[3, 4]) and np.isnan(got[7]).all()
    fin = np.isfinite(ref).all(axis=1)
    assert nmse(got[fin], ref[fin]) <= NMSE_MAX


@pytest.mark.parametrize("knobs", [SMALL_TILES, {**SMALL_TILES, **PASS_2BUF}], ids=["tile", "pass_2buf"])
def test_coopmat_fma_strided_and_batched_views(rng, knobs):
    """Batch dims (w broadcast over one of them), a transposed x and a weight view inside a larger
    tensor: the strides reach the kernel as they do the f32 ones (and the first pass's tile slots)."""
    B, T, K, N = 2, 21, 40, 19
    xs = rng.standard_normal((B, 3, K, T)).astype(np.float32)          # viewed as [B, 3, T, K]
    w = (rng.standard_normal((1, 3, N + 2, K)) / np.sqrt(K)).astype(BF16)
    with tuned(knobs):
        got = run_mul_mat(xs, w, "coopmat_fma", w_view=lambda t: t[:, :, 1:N + 1],
                          x_view=lambda t: t.transpose(-1, -2))
    x = np.swapaxes(xs, -1, -2)
    wv = np.broadcast_to(w[:, :, 1:N + 1], (B, 3, N, K))
    check_against_both(got, x, wv, "batched")


def test_coopmat_on_the_matrix_units_or_their_fma_twin(device, rng):
    """The cooperative-matrix kernel itself at the model's widths (K = 4096, 1024; N = 1024, 512), partial
    tiles, default, small and 128 × 128 tiles, each variant (scales by pass, two buffers), and the
    automatic choice at T ≥ coopmat.min_tokens (coopmat.auto on); where the device
    has no matrix units (lavapipe) the same checks run on coopmat_fma at the small cases and tiles that
    fit it, and the automatic choice keeps the f32 lanes."""
    units = not coopmat_unavailable(device)
    kernel = "coopmat" if units else "coopmat_fma"
    wide = [(512, 4096, 1024), (100, 1024, 512)] if units else []       # (the FMA twin: too slow on a CPU)
    check_coopmat(kernel, rng, CASES + wide if units else CASES[:3], {})
    check_coopmat(kernel, rng, CASES[:3])
    for variant in VARIANTS[1:] + ([BIG_PASS_2BUF, BIG_TILES] if units else []):
        check_coopmat(kernel, rng, CASES[:3] + ([(512, 4096, 1024), (100, 1024, 520)] if units else []), variant)
    x = rng.standard_normal((300 if units else 40, 4096)).astype(np.float32)
    w = (rng.standard_normal((520 if units else 24, 4096)) / 64).astype(BF16)
    with tuned({"coopmat.auto": True}):
        g = Graph()
        g.op("MUL_MAT", g.input("x", x.shape), g.const(w))
        launch = g.nodes[0].op.lower(g.nodes[0], device)[-1]     # (after the scales' first pass, where it runs)
        assert (launch.shader == "mul_mat_coopmat" and "CM_NV" in launch.defines) == units
        if units:
            check_against_both(run_mul_mat(x, w, "auto"), x, w, "auto", "coopmat")
        else:
            ref = x.astype(np.float64) @ w.astype(np.float64).T
            assert nmse(run_mul_mat(x, w, "auto"), ref) <= 1e-10        # the f32 lanes' bound


def with_matrix_units(device, monkeypatch):
    """The device's caps as if it had VK_NV_cooperative_matrix's 16 × 16 × 16 shape and 32-lane subgroups."""
    cm = (CoopMatShape(16, 16, 16, "f16", "f16", "f32", "f32"), CoopMatShape(16, 8, 16, "f16", "f16", "f32", "f32"))
    sgc = dataclasses.replace(device.caps.subgroup, min_size=32, max_size=32, size=32, full_subgroups=True)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, coopmat=cm, subgroup=sgc,
                                                            type="discrete-gpu"))


def test_kernel_choice_and_its_reason(device, monkeypatch):
    """pick_kernel: the matrix units from coopmat.min_tokens over bf16 / f16 weights where the device
    has the shape and coopmat.auto is on (the default), the f32 kernels otherwise, each with its reason;
    DSV4_VK_DISABLE_COOPMAT named."""
    f32 = "gemm_regs" if device.caps.is_cpu else "gemm_shared"
    limits = dataclasses.replace(device.caps.limits, max_workgroup_invocations=512, max_shared_memory=48 * 1024,
                                 max_workgroup_size=(512,) + device.caps.limits.max_workgroup_size[1:])
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, coopmat=(), limits=limits))  # no matrix units
    assert mul_mat.pick_kernel(device, 512, 4096, w_dtype="bf16").kernel == f32
    assert "no VK_NV_cooperative_matrix 16 × 16 × 16" in mul_mat.pick_kernel(device, 512, 4096, w_dtype="bf16").reason
    with tuned({"coopmat.emulate": True}):          # the tensor-core path's data flow where it cannot run
        c = mul_mat.pick_kernel(device, 512, 4096, w_dtype="bf16")
        assert c.kernel == "coopmat_fma" and "coopmat.emulate" in c.reason
        assert mul_mat.pick_kernel(device, 512, 4096, w_dtype="f32").kernel == f32
    with_matrix_units(device, monkeypatch)
    pick = mul_mat.pick_kernel
    with tuned({"coopmat.auto": False}):            # the f32 lanes, saying so
        c = pick(device, 512, 4096, w_dtype="bf16")
        assert c.kernel == "gemm_shared" and "coopmat.auto is off" in c.reason, c
        assert pick(device, 512, 4096, "coopmat", w_dtype="bf16").kernel == "coopmat"
        with tuned({"coopmat.emulate": True}):      # (emulate only where there are no matrix units)
            assert pick(device, 512, 4096, w_dtype="bf16").kernel == "gemm_shared"
        assert mul_mat.describe(device)["kernel"] == "gemm_shared"
    with tuned({"coopmat.auto": True}):             # (the default)
        assert pick(device, 16, 4096, w_dtype="bf16") == mul_mat.KernelChoice(
            "coopmat", "matrix units: T ≥ 16 over bf16 weights, tiles 128 × 128 (49152 B of shared memory)")
        assert pick(device, 512, 64, w_dtype="f16").kernel == "coopmat"
        assert pick(device, 15, 4096, w_dtype="bf16") == mul_mat.KernelChoice(
            "gemv", "f32 lanes: T < 16 (coopmat.min_tokens)")
        c = pick(device, 512, 4096, w_dtype="f32")
        assert c.kernel == "gemm_shared" and c.reason == ("f32 lanes: f32 weights stay off the matrix units (fp16 "
                                                          "products would round them)"), c
        assert pick(device, 512, 4096, w_dtype="i32", quant="fp8").kernel == "coopmat"
        assert pick(device, 512, 4096, w_dtype="bf16", norm=True).kernel == "gemv"
        with tuned({"coopmat.min_tokens": 128}):
            assert pick(device, 64, 4096, w_dtype="bf16").kernel == "gemv"
            d = mul_mat.describe(device)
            assert (d["kernel"], d["from_tokens"], d["tile"]) == ("coopmat", 128, [128, 128])
            assert d["reason"].startswith("matrix units: T ≥ 128 over bf16 weights, tiles 128 × 128")
            assert {f: q["kernel"] for f, q in d["quant"].items()} == {"fp8": "coopmat", "fp4": "coopmat"}
        monkeypatch.setattr(device, "coopmat_disabled", True, raising=False)
        c = pick(device, 512, 4096, w_dtype="bf16")
        assert c.kernel == "gemm_shared" and "DSV4_VK_DISABLE_COOPMAT=1" in c.reason
        with pytest.raises(ValueError, match="kernel='coopmat' cannot run on .*DSV4_VK_DISABLE_COOPMAT=1"):
            pick(device, 512, 4096, "coopmat", w_dtype="bf16")


def test_info_names_the_mul_mat_kernel(device):
    """`info` says which kernel MUL_MAT over many tokens takes and why: where the device has matrix units
    the matrix units (coopmat.auto on, the default) and their tiles, else the f32 lanes naming what is missing,
    for bf16 / f16 and for FP8 and FP4 weights;
    with DSV4_VK_DISABLE_COOPMAT=1 the f32 lanes naming the switch (where it changed something); a junk
    value of the switch is refused."""
    def info_line(prefix="MUL_MAT", **env):
        r = subprocess.run([sys.executable, "-m", "dsv4_vk", "info"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, **env})
        assert r.returncode == 0, r.stderr
        return next(ln for ln in r.stdout.splitlines() if ln.startswith(prefix))
    units = coopmat_unavailable(device) is None
    line = info_line()
    assert line.startswith("MUL_MAT       512 tokens over bf16/f16 weights: "), line
    assert ("coopmat — matrix units: T ≥ 16 over bf16 weights, tiles" in line if units else
            "— f32 lanes, since the device has no VK_NV_cooperative_matrix 16 × 16 × 16" in line), line
    for fmt in ("FP8", "FP4"):
        line = info_line(prefix=f"MUL_MAT       512 tokens over {fmt} ")
        assert (f"coopmat — matrix units: T ≥ 16 over {fmt} weights" in line if units else
                "— f32 lanes, since the device has no VK_NV_cooperative_matrix 16 × 16 × 16" in line), line
    line = info_line(prefix="MUL_MAT       512 tokens over f32 ")
    assert "— f32 lanes: f32 weights stay off the matrix units (fp16 products would round them)" in line, line
    line = info_line(DSV4_VK_DISABLE_COOPMAT="1")
    assert "— f32 lanes, since" in line and ("DSV4_VK_DISABLE_COOPMAT=1" in line) == units, line
    r = subprocess.run([sys.executable, "-m", "dsv4_vk", "info"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DSV4_VK_DISABLE_COOPMAT": "maybe"})
    assert r.returncode != 0 and "DSV4_VK_DISABLE_COOPMAT='maybe' is not understood" in r.stderr


def test_coopmat_refusals(device, monkeypatch):
    """kernel='coopmat*' over f32 or quantised weights is refused when the graph is built; 'coopmat' on a
    device without matrix units when it is lowered, naming what is missing; tiles, buffers and scales
    that do not fit a device of 512 invocations and 48 KiB of shared memory (the H200's, with 1,024
    invocations: 128 × 256 tiles double-buffered pass 48 KiB)."""
    limits = dataclasses.replace(device.caps.limits, max_workgroup_invocations=512, max_shared_memory=48 * 1024,
                                 max_workgroup_size=(512,) + device.caps.limits.max_workgroup_size[1:])
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, coopmat=(), limits=limits))  # no matrix units
    g = Graph()
    x = g.input("x", (32, 64))
    with pytest.raises(ValueError, match="kernel='coopmat_fma' takes bf16, f16, FP8 or FP4 weights, got f32"):
        g.op("MUL_MAT", x, g.input("w", (16, 64)), kernel="coopmat_fma")
    g.op("MUL_MAT", x, g.input("wb", (16, 64), "bf16"), kernel="coopmat")
    node = g.nodes[-1]
    with pytest.raises(ValueError, match="kernel='coopmat' cannot run on .*no VK_NV_cooperative_matrix"):
        node.op.lower(node, device)
    for knobs, msg in (({"coopmat.warp_tokens": 24}, "'coopmat.warp_tokens' must be a positive multiple of 16"),
                       ({"coopmat.tokens": 48}, "must be multiples of"),
                       ({"coopmat.k_step": 48}, "'coopmat.k_step' = 48: its 24 chunks"),
                       ({"coopmat.tokens": 256, "coopmat.warp_tokens": 16}, "invocations and .* B of shared memory"),
                       ({"coopmat.buffers": 3}, "'coopmat.buffers' must be 1 or 2, got 3"),
                       ({"coopmat.scales": "rows"}, "'coopmat.scales' must be one of"),
                       ({"coopmat.group": 0}, "'coopmat.group' must be an integer ≥ 1, got 0"),
                       ({"coopmat.tokens": 128, "coopmat.outputs": 256, "coopmat.warp_tokens": 64,
                         "coopmat.warp_outputs": 64, "coopmat.buffers": 2}, "2 buffer.* B of shared memory")):
        with tuned(knobs), pytest.raises(ValueError, match=msg):
            mul_mat_coopmat.coopmat_spec(device, "coopmat_fma")


def test_the_cooperative_matrix_variant_compiles():
    """glslangValidator compiles the CM_NV variants (declared, so the wheel prebuilds them) into SPIR-V
    with cooperative-matrix products, here where no device runs them."""
    from dsv4_vk.vk.shader import compile_shader, declared_variants
    variants = {tuple(sorted(dict(v))) for v in declared_variants("mul_mat_coopmat")}
    assert {("CM_NV", "W_BF16"), ("CM_NV", "W_F16"), ("W_BF16",), ("W_F16",)} <= variants
    assert {("CM_NV", "VEC4", "W_BF16"), ("CM_NV", "VEC8", "W_F16"), ("CM_NV", "VEC8", "W_BF16")} <= variants
    assert {("ROW_SCALES", "VEC8", "W_BF16"), ("ROW_SCALES", "W_F16")} <= variants
    assert {(*cm, *vec, f) for cm in ((), ("CM_NV",)) for vec in ((), ("VEC8",))
            for f in ("W_FP4", "W_FP8")} <= variants
    assert {("ROW_SCALES", "VEC8", "W_FP8"), ("ROW_SCALES", "W_FP4"), ("CM_NV", "FP8_FOLD", "VEC8", "W_FP8"),
            ("FP8_FOLD", "W_FP8")} <= variants
    for defines in ({"W_BF16": 1, "CM_NV": 1}, {"W_F16": 1, "CM_NV": 1}, {"W_BF16": 1, "CM_NV": 1, "VEC4": 1},
                    {"W_BF16": 1, "CM_NV": 1, "VEC8": 1}, {"W_FP8": 1, "CM_NV": 1, "VEC8": 1},
                    {"W_FP4": 1, "CM_NV": 1}):
        spv = compile_shader("mul_mat_coopmat", defines)
        words = np.frombuffer(spv, np.uint32)
        ops = set()
        i = 5
        while i < len(words):               # SPIR-V: (word count << 16) | opcode
            ops.add(int(words[i] & 0xFFFF))
            i += int(words[i] >> 16) or 1
        assert {5359, 5360, 5361} <= ops    # OpCooperativeMatrixLoadNV, StoreNV, MulAddNV


def test_coopmat_launch_takes_wide_loads_where_aligned(device, tune):
    """The launch: 8 inputs an invocation (VEC8) where K % 8 == 0 and the rows are 16-byte aligned, 4
    (VEC4) where K % 4 == 0 and x's rows are, scalar pairs otherwise; the grid one workgroup a tile
    (batch × token tiles × output tiles), the spec constants the knobs'; coopmat.scales='pass' a
    ROW_SCALES dispatch first (16 rows a workgroup), except where a tile would hold 1 row or output."""
    def launches(K, w_start=0, T=100, N=300):
        g = Graph()
        w = g.input("w", (N * K + 8,), "bf16")[w_start:w_start + N * K].reshape(N, K)
        g.op("MUL_MAT", g.input("x", (2, T, K)), w, kernel="coopmat_fma")
        return g.nodes[-1].op.lower(g.nodes[-1], device)
    tune(CPU_TILING)                                        # lavapipe's own tiling, on any device
    (ln,) = launches(64)
    assert ln.shader == "mul_mat_coopmat" and ln.defines == {"W_BF16": 1, "VEC8": 1}
    assert ln.spec == (128, 64, 128, 32, 64, 32, 1, 0, 1) and ln.grid == (2 * 2 * 3, 1, 1) and not ln.full_subgroups
    assert launches(68)[0].defines == {"W_BF16": 1, "VEC4": 1} and launches(64, w_start=4)[0].defines == {
        "W_BF16": 1, "VEC4": 1}
    assert "VEC4" not in launches(66)[0].defines and "VEC4" not in launches(64, w_start=2)[0].defines
    with tuned(SMALL_TILES):
        assert launches(64)[0].spec == (128, 32, 32, 16, 16, 32, 1, 0, 1)
    with tuned(PASS_2BUF):
        first, gemm = launches(64)
        assert first.defines == {"ROW_SCALES": 1, "W_BF16": 1, "VEC8": 1} and first.spec == (256, 64, 128)
        assert first.grid == (-(-2 * (100 + 300) // 16), 1, 1) and gemm.spec == (128, 64, 128, 32, 64, 32, 2, 1, 3)
        (only,) = launches(64, T=129)       # a last token tile of 1 row: the scales by tile
        assert only.spec[6:] == (2, 0, 3)


@pytest.mark.parametrize("chunk, knobs", [(16, {}), (32, {}), (32, {"coopmat.scales": "pass", "coopmat.x_half": True})],
                         ids=["16", "32", "32_x_half"])
def test_model_logits_on_the_tensor_core_path_match_transformers(chunk, knobs):
    """The BF16 fixture model with every MUL_MAT of ≥ 16 tokens over its bf16 linears on the tensor-core
    path's data flow (coopmat.auto, and coopmat.emulate: coopmat_fma where there are no matrix units),
    prompt chunks of 16 and 32 tokens, and with x rounded once by the first pass (coopmat.x_half, every
    MUL_MAT sharing its scratch): logits against transformers' at NMSE ≤ 1e-5 after the prefill and
    every decode step (the issue's bound for it)."""
    name = "bf16"
    from logits_check import logits_errors
    from test_model import fixture
    from dsv4_vk.model import Model
    cfg, w, e = fixture(name)
    with tuned({"coopmat.emulate": True, "coopmat.auto": True, **knobs}):
        m = Model(cfg, w, prefill_chunk=chunk)
    details = " ".join(m.compiled("prefill").dispatch_details)
    assert "mul_mat_coopmat" in details and ("CM_NV" in details) == (coopmat_unavailable(m.device) is None)
    assert details.count("X_HALF") == (details.count("mul_mat_coopmat") if knobs else 0)
    errs = logits_errors(m, e)
    assert max(errs) <= NMSE_MAX, f"{name}: NMSE per position {errs}"


def bench_primitives(monkeypatch):
    """tools/bench_primitives.py as a module (tools/ on the path: it imports tools/ablation.py)."""
    import importlib.util
    monkeypatch.syspath_prepend(os.path.join(HERE, "..", "tools"))
    spec = importlib.util.spec_from_file_location("bench_primitives", os.path.join(HERE, "..", "tools",
                                                                                   "bench_primitives.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_coopmat_tiles_seventh_field_is_x_half(monkeypatch):
    """--coopmat-tiles' seventh field sets coopmat.x_half (0 or 1, anything else refused), and the named set
    `variants` holds the H200's default tiling with it beside the one without."""
    bench = bench_primitives(monkeypatch)
    (_, off), (_, on) = bench.parse_tiles("128x128/64x32/64/1/pass/8/0,128x128/64x32/64/1/pass/8/1")
    assert off["coopmat.x_half"] is False and on == {**off, "coopmat.x_half": True}
    assert "coopmat.x_half" not in bench.parse_tiles("128x128/64x32/64/1/pass/8")[0][1]
    names = [n for n, _ in bench.parse_tiles("variants")]
    assert {"128x128/64x32/64/1/pass/8", "128x128/64x32/64/1/pass/8/1"} <= set(names)
    for bad in ("128x128/64x32/64/1/pass/8/2", "128x128/64x32/64/1/pass/8/1/0"):
        with pytest.raises(SystemExit, match="X_HALF"):
            bench.parse_tiles(bad)


# --- FP8-block and FP4-group weights -------------------------------------------------------------------

def quant_weights(rng, fmt, N, K, scale=None, edit=None):
    """(packed words, scale words, float64 w) of random codes (tests/test_quant.py's random_quant and its
    dequantisation written from the format), with the scale bytes given (`scale`, the grid) or random, and
    the codes changed in place by edit(codes) if given."""
    from test_quant import dequant, random_quant
    codes, s = random_quant(rng, fmt, N, K)
    if edit is not None:
        edit(codes)
    if scale is not None:
        s = np.asarray(scale, np.uint8).reshape(s.shape)
    words, sw = quant.quant_arrays(codes, s)
    return words, sw, dequant(fmt, codes, s)


def run_quant(x, words, sw, fmt, kernel="coopmat_fma", **params):
    g = Graph()
    g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(words), g.const(sw), wq=fmt, kernel=kernel,
                       **params))
    ex = Executor()
    out = ex.run(g, x=x)
    assert ex.last.check_guards() == []
    return out["y"]


def fp16_quant_reference(x, w):
    """float64 x @ wᵀ with x's rows scaled, rounded to fp16 and scaled back (the kernel's one rounding over
    quantised weights: their values reach the products exactly)."""
    x = np.asarray(x, np.float64)
    sx = row_shifts(x)
    xh = (x * np.exp2(sx)[..., None]).astype(np.float32).astype(np.float16).astype(np.float64)
    return (xh * np.exp2(-sx)[..., None]) @ np.asarray(w, np.float64).T


def check_quant_rel(got, x, w, what, f32_rows=()):
    """Every output against float64 relative to the sum of its |terms| (2e-3: fp16's rounding of x), and to
    the fp16-rounded x (f32_sum_rel: f32 summation), but outputs of w rows in f32_rows (FP4 rows the
    kernel sums in f32) to f32_sum_rel of the exact product; outputs whose terms sum below 2^−120 (near f32's
    subnormals, where an f32 kernel loses bits), or whose sums the kernel holds below it, are left out."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    exact, terms = x64 @ w64.T, np.abs(x64) @ np.abs(w64).T
    assert np.isfinite(got).all(), what
    # the kernel holds an output's sums at its value times 2^sx (x's row shift, negative for rows past
    # 2^15): where that falls below f32's normal range a device that flushes f32 subnormals (the H200)
    # loses bits there, as an f32 kernel does below 2^−120
    held = terms * np.exp2(np.minimum(row_shifts(x64), 0))[:, None]
    terms = np.where((terms >= 2.0 ** -120) & (held >= 2.0 ** -120), terms, np.inf)
    rel = np.abs(got - exact) / terms
    assert rel.max() <= 2e-3, f"{what}: worst {rel.max():.2e} at {np.unravel_index(rel.argmax(), rel.shape)}"
    rel16 = np.abs(got - fp16_quant_reference(x, w)) / terms
    cols = np.setdiff1d(np.arange(w64.shape[0]), list(f32_rows))
    assert rel16[:, cols].max() <= f32_sum_rel(x64.shape[1]), f"{what}: {rel16[:, cols].max():.2e} from the fp16-rounded x"
    if len(f32_rows):
        assert rel[:, list(f32_rows)].max() <= f32_sum_rel(x64.shape[1]), f"{what}: the f32-summed rows {rel[:, list(f32_rows)].max():.2e}"
    return rel


# (fmt, T, N, K): partial 128 × 128 blocks, K and N not multiples of the tile or the k step, K % 8 and
# K % 4 != 0 (narrower loads), one token tile
QUANT_CASES = [("fp8", 37, 200, 300), ("fp8", 20, 40, 256), ("fp8", 5, 9, 70), ("fp8", 17, 33, 66),
               ("fp4", 20, 40, 96), ("fp4", 17, 33, 70), ("fp4", 40, 50, 260), ("fp4", 9, 7, 36)]


def check_quant_coopmat(rng, kernel="coopmat_fma", cases=QUANT_CASES, knobs=SMALL_TILES):
    with tuned(knobs):
        for fmt, T, N, K in cases:
            words, sw, w = quant_weights(rng, fmt, N, K)
            x = rng.standard_normal((T, K)).astype(np.float32) * 3
            got = run_quant(x, words, sw, fmt, kernel)
            exact = x.astype(np.float64) @ w.T
            what = (fmt, T, N, K, knobs.get("coopmat.scales"))
            assert nmse(got, exact) <= NMSE_MAX, what
            assert nmse(got, fp16_quant_reference(x, w)) <= NMSE_FP16_MAX[kernel], what


@pytest.mark.parametrize("knobs", [SMALL_TILES, {**SMALL_TILES, **PASS_2BUF}, {},
                                   {"coopmat.tokens": 64, "coopmat.outputs": 64, "coopmat.warp_tokens": 32,
                                    "coopmat.warp_outputs": 32, "coopmat.k_step": 64, "coopmat.scales": "pass"}],
                         ids=["32x32", "32x32_pass_2buf", "default", "64x64_k64_pass"])
def test_coopmat_fma_quantised_matches_float64(rng, knobs):
    """FP8 (128 × 128 blocks) and FP4 (32-input groups) weights on the tensor-core path's data flow against
    the float64 dequantisation written from the format: NMSE ≤ 1e-5, and the fp16-rounded x's product
    (the weights' values reach the products exactly) to f32 summation error."""
    check_quant_coopmat(rng, knobs=knobs)


@pytest.mark.parametrize("scales", ["tile", "pass"])
def test_coopmat_fp8_extreme_block_scales(rng, scales):
    """FP8 block scales 2^−127 (byte 0) to 2^60 in one tensor, beside x rows past fp16's range: each block's
    partial product is scaled in f32, so every output matches float64 relative to its own terms, and the
    fp16-rounded x's product to f32 summation error."""
    T, N, K = 20, 200, 300                                  # block grid 2 × 3, partial last blocks
    grid = [[0, 1, 0], [187, 60, 127]]                      # 2^−127 block row; 2^60, 2^−67, 1
    words, sw, w = quant_weights(rng, "fp8", N, K, grid)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[0] *= 1e15
    x[1] *= 1e-15
    x[2, 7] = 3e8
    with tuned({**SMALL_TILES, "coopmat.scales": scales}):
        got = run_quant(x, words, sw, "fp8")
    check_quant_rel(got, x, w, ("fp8 extremes", scales))
    assert ((np.abs(x.astype(np.float64)) @ np.abs(w[:128].T))[3:] >= 2.0 ** -120).all()    # (so checked above)
    assert (got[3:, :128] != 0).all() and np.abs(got[3:, :128]).max() < 2.0 ** -100   # ordinary x, 2^−127 block row


@pytest.mark.parametrize("scales", ["tile", "pass"])
def test_coopmat_fp4_scale_spread(rng, scales):
    """FP4 rows whose group scales span up to 26 binades are staged exactly (every value a normal fp16 after
    the row's power of two: checked against the fp16-rounded x's product); rows spanning more (27 and
    40 binades, and tiny and huge scales) are summed in f32 from the weights (checked to f32_sum_rel of the
    exact product): without that their small groups would be lost below fp16's normals."""
    T, N, K = 18, 40, 160                                   # 5 groups a row
    grid = rng.integers(120, 131, (N, K // 32))
    grid[0] = [127, 101, 110, 127, 120]                     # 26 binades: exact in fp16
    grid[1] = [10, 30, 36, 20, 12]                          # small scales, 26 binades
    grid[2] = [150, 124, 150, 150, 150]                     # 26 binades, large
    grid[3] = [127, 100, 127, 127, 127]                     # 27: summed in f32
    grid[4] = [160, 120, 150, 160, 130]                     # 40
    grid[5] = [1, 200, 100, 50, 180]
    words, sw, w = quant_weights(rng, "fp4", N, K, grid)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[:, 32:64] *= 2.0 ** 26                                # the small groups carry the products
    x[3] *= 1e-12
    with tuned({**SMALL_TILES, "coopmat.scales": scales}):
        got = run_quant(x, words, sw, "fp4")
    check_quant_rel(got, x, w, ("fp4 spread", scales), f32_rows=(3, 4, 5))
    # the f32 rows hold what fp16 could not: row 3's small group below fp16's normals after the row's shift,
    # row 4's rounded away
    assert np.abs(w[3, 32:64]).min() * 2.0 ** (140 - grid[3].max()) < 2.0 ** -14
    staged = w[4] * 2.0 ** (140 - grid[4].max())
    assert (staged.astype(np.float16).astype(np.float64) != staged).any()


def test_coopmat_quant_choice_and_refusals(device, monkeypatch):
    """The automatic choice takes FP8 and FP4 weights onto the matrix units; FP8 needs tile outputs and a
    k step dividing 128 and tiles inside one 128-row block row, and says so where it takes the f32
    lanes instead (or, asked for kernel='coopmat*', refuses naming it)."""
    with_matrix_units(device, monkeypatch)
    pick = mul_mat.pick_kernel
    for fmt in ("fp8", "fp4"):
        c = pick(device, 512, 4096, w_dtype="i32", quant=fmt)
        assert c.kernel == "coopmat" and f"over {fmt.upper()} weights" in c.reason, c
    with tuned({"coopmat.outputs": 256, "coopmat.warp_outputs": 64}):
        c = pick(device, 512, 4096, w_dtype="i32", quant="fp8")
        assert c.kernel == "gemm_shared" and "coopmat.outputs 256" in c.reason, c
        assert pick(device, 512, 4096, w_dtype="i32", quant="fp4").kernel == "coopmat"
    with tuned({"coopmat.k_step": 48}):
        assert "coopmat.k_step 48" in pick(device, 512, 4096, w_dtype="i32", quant="fp8").reason
    rng = np.random.default_rng(3)
    words, sw, _ = quant_weights(rng, "fp8", 2 * 100, 64)
    g = Graph()                                             # 2 batch items of 100 rows in one grid
    g.op("MUL_MAT", g.input("x", (2, 80, 64)), g.const(words.reshape(2, 100, -1)), g.const(sw), wq="fp8")
    c = mul_mat.node_kernel(g.nodes[-1], device)
    assert c.kernel == "gemm_shared" and "span two 128-row scale blocks" in c.reason, c
    (launch,) = g.nodes[-1].op.lower(g.nodes[-1], device)
    assert launch.shader == "mul_mat"
    g.op("MUL_MAT", g.input("x2", (2, 80, 64)), g.const(words.reshape(2, 100, -1)), g.const(sw), wq="fp8",
         grid_rows=100)                                     # a grid per item: each tile in one block row
    assert mul_mat.node_kernel(g.nodes[-1], device).kernel == "coopmat"
    g.op("MUL_MAT", g.input("x3", (2, 80, 64)), g.const(words.reshape(2, 100, -1)), g.const(sw), wq="fp8",
         kernel="coopmat_fma")
    with pytest.raises(ValueError, match="kernel='coopmat_fma' cannot take these weights: .*span two 128-row"):
        g.nodes[-1].op.lower(g.nodes[-1], device)


def test_coopmat_tiling_follows_shared_memory(device, monkeypatch):
    """Tiling knobs left at None: 128 × 128 tiles (warps 64 × 32, k step 64, scales by pass, groups of 8)
    where a workgroup may take 48 KiB, else 64 × 128 (lavapipe's 32 KiB); a knob set wins."""
    def limits(shared):
        return dataclasses.replace(device.caps.limits, max_shared_memory=shared, max_workgroup_invocations=1024,
                                   max_workgroup_size=(1024,) + device.caps.limits.max_workgroup_size[1:])
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=limits(48 * 1024)))
    assert mul_mat_coopmat.coopmat_tiling(device) == dict(tokens=128, outputs=128, warp_tokens=64, warp_outputs=32,
                                                  k_step=64, buffers=1, scales="pass", group=8)
    assert mul_mat_coopmat.coopmat_spec(device, "coopmat_fma", 8) == (256, 128, 128, 64, 32, 64, 1, 1, 8)
    with tuned({"coopmat.group": 2}):
        assert mul_mat_coopmat.coopmat_tiling(device)["group"] == 2
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=limits(32 * 1024)))
    assert mul_mat_coopmat.coopmat_spec(device, "coopmat_fma", 8) == (128, 64, 128, 32, 64, 32, 1, 0, 1)


@pytest.mark.parametrize("kernel", ["coopmat_fma", "coopmat"])
def test_coopmat_quant_on_the_matrix_units_or_their_fma_twin(device, rng, kernel):
    """The quantised cases on the cooperative matrices where the device has them (and the 128 × 128 tiles
    with the model's widths there), else on coopmat_fma."""
    units = not coopmat_unavailable(device)
    if kernel == "coopmat" and not units:
        kernel = "coopmat_fma"
    check_quant_coopmat(rng, kernel, QUANT_CASES[:2] + QUANT_CASES[4:6])
    if units:
        check_quant_coopmat(rng, kernel, [("fp8", 512, 1024, 4096), ("fp4", 300, 520, 4096)], BIG_TILES)
        check_quant_coopmat(rng, kernel, [("fp8", 512, 1024, 4096)], BIG_PASS_2BUF)


@pytest.mark.parametrize("fp8_scales", ["block", "fold"])
def test_model_fp8_logits_on_the_tensor_core_path_match_transformers(fp8_scales):
    """The published-layout FP8/FP4 fixture with every MUL_MAT of ≥ 16 tokens on the tensor-core path's data
    flow (coopmat.emulate where there are no matrix units), FP8 block scales either way: logits against
    transformers' at NMSE ≤ 1e-5."""
    from logits_check import logits_errors
    from dsv4_vk.model import Model
    d = os.path.join(HERE, "fixtures", "dsv4_fp8")
    e = np.load(os.path.join(d, "expected.npz"))
    with tuned({"coopmat.emulate": True, "coopmat.fp8_scales": fp8_scales}):
        m = Model.load(d, prefill_chunk=16, max_ctx=64)
    details = " ".join(m.compiled("prefill").dispatch_details)
    assert "mul_mat_coopmat" in details and "W_FP8" in details, details[:2000]
    assert ("FP8_FOLD" in details) == (fp8_scales == "fold")
    errs = logits_errors(m, e)
    assert max(errs) <= NMSE_MAX, f"NMSE per position {errs}"


def test_model_gpu_bench_names_the_kernel_that_ran():
    """tools/model_gpu_bench.py's prefill label: the MUL_MAT kernels as chosen under the model's own knobs
    (coopmat.emulate here: coopmat_fma, which its prefill graph dispatches), not under the defaults."""
    import importlib.util
    from test_model import fixture
    from dsv4_vk.core.tuning import Tuning
    from dsv4_vk.model import Model
    spec = importlib.util.spec_from_file_location("model_gpu_bench", os.path.join(HERE, "..", "tools",
                                                                                  "model_gpu_bench.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg, w, _ = fixture("bf16")
    m = Model(cfg, w, prefill_chunk=16, tuning=Tuning({"coopmat.emulate": True}))
    kernels = bench.mul_mat_kernels(m)
    ran = "coopmat" if coopmat_unavailable(m.device) is None else "coopmat_fma"
    assert ran in kernels and ("mul_mat_coopmat" in " ".join(m.compiled("prefill").dispatch_details)), kernels


def test_coopmat_fma_fp8_batched_one_grid(rng):
    """wo_a's form: one [G·r, K] FP8 matrix (one scale grid) read as G batched [r, K] weights, r a multiple
    of 128 (each item's tiles inside its own block rows), x batched: against float64."""
    G, r, K, T = 2, 256, 136, 21
    words, sw, w = quant_weights(rng, "fp8", G * r, K)
    x = rng.standard_normal((G, T, K)).astype(np.float32)
    g = Graph()
    g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(words).reshape(G, r, words.shape[-1]),
                       g.const(sw), wq="fp8", kernel="coopmat_fma"))
    with tuned(SMALL_TILES):
        ex = Executor()
        got = ex.run(g, x=x)["y"]
    assert ex.last.check_guards() == []
    exact = np.matmul(x.astype(np.float64), np.swapaxes(w.reshape(G, r, K), -1, -2))
    assert nmse(got, exact) <= NMSE_MAX
    ref16 = np.stack([fp16_quant_reference(x[i], w.reshape(G, r, K)[i]) for i in range(G)])
    assert nmse(got, ref16) <= NMSE_FP16_MAX["coopmat_fma"]


FOLD = {"coopmat.fp8_scales": "fold"}


@pytest.mark.parametrize("knobs", [{**SMALL_TILES, **FOLD}, {**SMALL_TILES, **PASS_2BUF, **FOLD}],
                         ids=["32x32", "32x32_pass_2buf"])
def test_coopmat_fma_fp8_folded_scales(rng, knobs):
    """coopmat.fp8_scales='fold': FP8 block scales folded into per-row shifts, at the quantised cases and the
    batched form whose tiles span two block rows (which 'block' refuses): against float64 and the
    fp16-rounded x's product."""
    check_quant_coopmat(rng, cases=[c for c in QUANT_CASES if c[0] == "fp8"], knobs=knobs)
    words, sw, w = quant_weights(rng, "fp8", 2 * 100, 64)
    x = rng.standard_normal((2, 40, 64)).astype(np.float32)
    with tuned(knobs):
        g = Graph()
        g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(words.reshape(2, 100, -1)), g.const(sw),
                           wq="fp8", kernel="coopmat_fma"))
        (launch,) = [ln for ln in g.nodes[-1].op.lower(g.nodes[-1], default_device()) if "ROW_SCALES" not in ln.defines]
        assert launch.defines.get("FP8_FOLD") == 1
        got = Executor().run(g, x=x)["y"]
    ref = np.matmul(x.astype(np.float64), np.swapaxes(w.reshape(2, 100, 64), -1, -2))
    assert nmse(got, ref) <= NMSE_MAX
    assert nmse(got, np.stack([fp16_quant_reference(x[i], w.reshape(2, 100, 64)[i]) for i in range(2)])) <= 1e-11


@pytest.mark.parametrize("scales", ["tile", "pass"])
def test_coopmat_fp8_folded_scale_spread(rng, scales):
    """'fold': a block row whose scales span 12 binades is exact in fp16; 13 and 100 are summed in f32 (f32_sum_rel of
    the exact product), beside extreme scales (2^−127, 2^60)."""
    T, N, K = 20, 384, 300                                  # block grid 3 × 3
    grid = [[127, 115, 120], [127, 114, 127], [0, 100, 60]]
    words, sw, w = quant_weights(rng, "fp8", N, K, grid, edit=lambda c: c.__setitem__((128, 130), 0x01))
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[:, 128:256] *= 2.0 ** 12
    with tuned({**SMALL_TILES, **FOLD, "coopmat.scales": scales}):
        got = run_quant(x, words, sw, "fp8")
    check_quant_rel(got, x, w, ("fp8 fold", scales), f32_rows=range(128, 384))
    assert w[128, 130] * 2.0 ** (134 - 127) < 2.0 ** -14    # row 128's smallest code, shifted: below fp16's normals


def test_coopmat_fp8_scales_knob_checked(device):
    with tuned({"coopmat.fp8_scales": "row"}), pytest.raises(ValueError, match="'coopmat.fp8_scales' must be one of"):
        mul_mat.pick_kernel(device, 512, 4096, w_dtype="i32", quant="fp8")


# --- coopmat.x_half: x rounded to fp16 once, by the first pass -------------------------------------------

X_HALF_TILES = {**SMALL_TILES, "coopmat.scales": "pass"}


def run_x_half_pair(build, feeds, knobs=X_HALF_TILES):
    """The output of the graph build(g) -> y with coopmat.x_half off and on, which must be the same bit for
    bit (the same fp16 rounding of the same scaled values, the same sums in the same order); the on run's
    launches (its last node's) checked to take the halves."""
    outs = []
    for on in (False, True):
        with tuned({**knobs, "coopmat.x_half": on}):
            g = Graph()
            g.output("y", build(g))
            launches = g.nodes[-1].op.lower(g.nodes[-1], default_device())
            assert [("X_HALF" in ln.defines) for ln in launches] == [on, on], launches
            ex = Executor()
            outs.append(ex.run(g, **feeds)["y"])
            assert ex.last.check_guards() == []
    off, on = outs
    assert np.array_equal(off.view(np.uint32), on.view(np.uint32)), f"{np.sum(off != on)} outputs differ"
    return on


X_HALF_CASES = [(37, 136, 50, "bf16"), (20, 64, 34, "f16"), (70, 264, 40, "bf16"), (20, 1032, 34, "bf16")]
X_HALF_QUANT_CASES = [("fp8", 37, 200, 264, {}), ("fp8", 20, 40, 256, FOLD), ("fp4", 40, 50, 264, {}),
                      ("fp4", 17, 34, 96, {})]


def check_x_half(rng, knobs=X_HALF_TILES, kernel="coopmat_fma", cases=X_HALF_CASES, quant_cases=X_HALF_QUANT_CASES):
    """coopmat.x_half against the plain kernel (bit for bit) and float64 over bf16, f16, FP8 (block and fold)
    and FP4 weights: partial token and output tiles, K past a k step, x broadcast over a batch of weights."""
    for T, K, N, dtype in cases:
        x = rng.standard_normal((T, K)).astype(np.float32) * 3
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np_dtype(dtype))
        got = run_x_half_pair(lambda g: g.op("MUL_MAT", g.input("x", x.shape), g.const(w), kernel=kernel),
                              {"x": x}, knobs)
        check_against_both(got, x, w, ("x_half", T, K, N, dtype), kernel)
    x = rng.standard_normal((19, 48)).astype(np.float32)
    w = (rng.standard_normal((2, 21, 48)) / 7).astype(BF16)         # x broadcast: each item's rows written
    got = run_x_half_pair(lambda g: g.op("MUL_MAT", g.input("x", x.shape), g.const(w), kernel=kernel),
                          {"x": x}, knobs)
    check_against_both(got, np.broadcast_to(x, (2, 19, 48)), w, "x_half, x broadcast", kernel)
    for fmt, T, N, K, extra in quant_cases:
        words, sw, w = quant_weights(rng, fmt, N, K)
        x = rng.standard_normal((T, K)).astype(np.float32) * 3
        got = run_x_half_pair(lambda g: g.op("MUL_MAT", g.input("x", x.shape), g.const(words), g.const(sw), wq=fmt,
                                             kernel=kernel), {"x": x}, {**knobs, **extra})
        exact = x.astype(np.float64) @ w.T
        what = ("x_half", fmt, T, N, K, extra)
        assert np.isfinite(got).all(), what
        assert nmse(got, exact) <= NMSE_MAX and max_abs(got, exact) <= 3e-3 * np.abs(exact).max(), what
        assert nmse(got, fp16_quant_reference(x, w)) <= NMSE_FP16_MAX[kernel], what


@pytest.mark.parametrize("knobs", [X_HALF_TILES, {**SMALL_TILES, **PASS_2BUF},
                                   {"coopmat.tokens": 64, "coopmat.outputs": 32, "coopmat.warp_tokens": 32,
                                    "coopmat.warp_outputs": 16, "coopmat.k_step": 64, **PASS_2BUF}],
                         ids=["32x32_pass", "32x32_pass_2buf", "64x32_k64_pass_2buf"])
def test_coopmat_fma_x_half_is_the_plain_kernel_bit_for_bit(rng, knobs):
    check_x_half(rng, knobs)


def test_coopmat_x_half_on_the_matrix_units_or_their_fma_twin(device, rng):
    """coopmat.x_half on the cooperative matrices where the device has them (bit for bit as without it: the
    products see the same staged halves), there also at the model's widths with 128 × 128 tiles; else
    on coopmat_fma at the small cases."""
    units = not coopmat_unavailable(device)
    kernel = "coopmat" if units else "coopmat_fma"
    check_x_half(rng, X_HALF_TILES, kernel, X_HALF_CASES[:2], X_HALF_QUANT_CASES[:1])
    if units:
        check_x_half(rng, {**BIG_TILES, "coopmat.scales": "pass", "coopmat.k_step": 64}, kernel,
                     [(512, 4096, 1024, "bf16"), (300, 1024, 520, "bf16")], [("fp8", 512, 1024, 4096, {}),
                                                                           ("fp4", 300, 520, 4096, {})])


def test_coopmat_fma_x_half_rows_past_fp16_inf_nan_and_views(rng):
    """coopmat.x_half bit for bit as without it where x rows are scaled 1e20 and 1e-20 (and w rows past fp16's
    range), with inf and NaN in x, and over batched and offset views; each checked against float64."""
    x, w = range_inputs(rng)
    got = run_x_half_pair(lambda g: g.op("MUL_MAT", g.input("x", x.shape), g.const(w), kernel="coopmat_fma"),
                          {"x": x})
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    assert np.isfinite(got).all() and (np.abs(got - exact) / scale).max() <= 2e-3
    assert nmse(got / scale, exact / scale) <= NMSE_MAX
    T, K, N = 18, 40, 20
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(BF16)
    x[3, 5], x[7, 0], x[9, 39] = np.inf, np.nan, -np.inf
    w[4, 5] = 0
    got = run_x_half_pair(lambda g: g.op("MUL_MAT", g.input("x", x.shape), g.const(w), kernel="coopmat_fma"),
                          {"x": x})
    with np.errstate(invalid="ignore"):
        ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref).all(axis=1)
    assert nmse(got[fin], ref[fin]) <= NMSE_MAX
    B, T, K, N = 2, 21, 40, 19
    x = rng.standard_normal((B, 3, T, K)).astype(np.float32)
    w = (rng.standard_normal((1, 3, N + 2, K)) / np.sqrt(K)).astype(BF16)
    got = run_x_half_pair(lambda g: g.op("MUL_MAT", g.input("x", x.shape), g.const(w)[:, :, 1:N + 1],
                                         kernel="coopmat_fma"), {"x": x}, {**SMALL_TILES, **PASS_2BUF})
    check_against_both(got, x, np.broadcast_to(w[:, :, 1:N + 1], (B, 3, N, K)), "x_half batched")


def fp16_rows(x):
    """x's rows as the first pass writes them for coopmat.x_half: x · 2^shift in f32, rounded to fp16."""
    x = np.asarray(x, np.float32)
    return (x * np.exp2(row_shifts(x)).astype(np.float32)[..., None]).astype(np.float16)


def test_coopmat_fma_x_half_pass_writes_the_halves_every_run(rng):
    """The first pass writes x's rows as fp16 (bit for bit numpy's rounding of x · 2^shift) on every run: two
    MUL_MATs share the scratch (the second's rows over the first's), and a replay with other x still gives
    the right products, so halves left from an earlier node or run cannot pass."""
    (T1, K1, N1), (T2, K2, N2) = (40, 1032, 30), (21, 64, 35)      # (K1: a row past 512 inputs, 4 chunks × 16 lanes)
    w1 = (rng.standard_normal((N1, K1)) / np.sqrt(K1)).astype(BF16)
    w2 = (rng.standard_normal((N2, K2)) / np.sqrt(K2)).astype(BF16)
    with tuned({**X_HALF_TILES, "coopmat.x_half": True}):
        g = Graph()
        g.output("y1", g.op("MUL_MAT", g.input("x1", (T1, K1)), g.const(w1), kernel="coopmat_fma"))
        g.output("y2", g.op("MUL_MAT", g.input("x2", (T2, K2)), g.const(w2), kernel="coopmat_fma"))
        g.output("halves", g.scratch(mul_mat_coopmat.X_HALF_POOL))
        prog = g.compile()
    for _ in range(2):
        x1 = rng.standard_normal((T1, K1)).astype(np.float32) * rng.uniform(0.1, 100)
        x2 = rng.standard_normal((T2, K2)).astype(np.float32) * rng.uniform(0.1, 100)
        out = prog.run(x1=x1, x2=x2)
        halves = out["halves"].view(np.float16)
        assert halves.size == T1 * K1
        assert np.array_equal(halves[:T2 * K2].view(np.uint16), fp16_rows(x2).ravel().view(np.uint16))
        assert np.array_equal(halves[T2 * K2:].view(np.uint16), fp16_rows(x1).ravel()[T2 * K2:].view(np.uint16))
        check_against_both(out["y1"], x1, w1, "x_half, first")
        check_against_both(out["y2"], x2, w2, "x_half, second over the first's halves")


def test_coopmat_fma_x_half_stages_from_the_halves(rng, monkeypatch):
    """With coopmat.x_half the multiplying dispatch takes x from the halves: given NaN for x itself it still
    gives the products (the first pass read the real x); without the knob the same swap gives NaN."""
    T, K, N = 37, 72, 40
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(BF16)
    lower = mul_mat.MulMat.lower
    nan_x = {}

    def lower_with_nan_x(self, node, device):
        first, main = lower(self, node, device)
        return [first, dataclasses.replace(main, args=[nan_x["t"], *main.args[1:]])]
    monkeypatch.setattr(mul_mat.MulMat, "lower", lower_with_nan_x)
    for on in (True, False):
        with tuned({**X_HALF_TILES, "coopmat.x_half": on}):
            g = Graph()
            nan_x["t"] = g.const(np.full((T, K), np.nan, np.float32))
            g.output("y", g.op("MUL_MAT", g.input("x", (T, K)), g.const(w), kernel="coopmat_fma"))
            got = Executor().run(g, x=x)["y"]
        if on:
            check_against_both(got, x, w, "x_half from the halves")
        else:
            assert np.isnan(got).all()


def test_coopmat_x_half_knob_and_where_it_does_not_apply(device, rng, monkeypatch):
    """coopmat.x_half must be a bool (refused naming it); with 4 or 2 inputs a load (K % 8 != 0), scales by
    tile or a tile of a single row the kernel runs as without it, bit for bit, asks for no scratch, and the
    reason says why; where it applies the reason says so."""
    with tuned({"coopmat.x_half": 1}), pytest.raises(ValueError, match="'coopmat.x_half' must be True or False, "
                                                                          "got 1"):
        g = Graph()
        g.op("MUL_MAT", g.input("x", (32, 64)), g.input("w", (16, 64), "bf16"), kernel="coopmat_fma")
    for T, K, N, knobs in ((37, 68, 50, X_HALF_TILES), (37, 70, 50, X_HALF_TILES),
                           (37, 64, 50, SMALL_TILE_SCALES), (33, 64, 50, X_HALF_TILES)):
        x = rng.standard_normal((T, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(BF16)
        outs = []
        for on in (False, True):
            with tuned({**knobs, "coopmat.x_half": on}):
                g = Graph()
                g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(w), kernel="coopmat_fma"))
                assert not any("X_HALF" in ln.defines for ln in g.nodes[0].op.lower(g.nodes[0], device))
                reason = mul_mat.node_kernel(g.nodes[0], device).reason
                if K % 8:
                    assert reason == "asked for" if not on else reason == (
                        "asked for; coopmat.x_half not used: it needs 8 inputs a load (K % 8 == 0, x and weight "
                        "rows 16-byte aligned)"), reason
                    with pytest.raises(ValueError, match="no op of this graph asked for scratch pool"):
                        g.scratch(mul_mat_coopmat.X_HALF_POOL)
                elif on:
                    assert ("coopmat.scales='pass'" in reason if knobs is SMALL_TILE_SCALES else
                            "a tile with a single row" in reason), reason
                outs.append(Executor().run(g, x=x)["y"])
        assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), (T, K, N)
        check_against_both(outs[1], x, w, ("x_half unused", T, K, N))
    with_matrix_units(device, monkeypatch)
    limits = dataclasses.replace(device.caps.limits, max_workgroup_invocations=1024, max_shared_memory=48 * 1024,
                                 max_workgroup_size=(1024,) + device.caps.limits.max_workgroup_size[1:])
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=limits))
    with tuned({"coopmat.x_half": True}):           # the H200's tiling: scales by a first pass
        c = mul_mat.pick_kernel(device, 512, 4096, w_dtype="bf16")
        assert c.kernel == "coopmat" and c.reason.endswith(
            "B of shared memory); x rounded to fp16 once, by the first pass (coopmat.x_half)"), c
        assert "x_half not used: it needs 8 inputs a load" in mul_mat.pick_kernel(device, 512, 4096, w_dtype="bf16",
                                                                                   chunk=4).reason
    assert "x_half" not in mul_mat.pick_kernel(device, 512, 4096, w_dtype="bf16").reason     # off: no word of it
