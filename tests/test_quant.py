"""DeepSeek-V4's published low-precision checkpoints (docs/quantized_weights.md): the kernels that
read FP8 / FP4 weights against a float64 dequantisation written here from the format description
(ml_dtypes' E4M3 / E2M1 / E8M0 decoding, not the kernels' bit tricks), the loader's checks, and the
model's logits against transformers loading the same directories (tests/fixtures/dsv4_fp8*, written
by tools/make_dsv4_fixtures.py with FineGrainedFP8Config(dequantize=True), float32).

Run as a script, the file is the subprocess worker for other lavapipe subgroup sizes.
"""
import dataclasses
import json
import os
import sys

import ml_dtypes
import numpy as np
import pytest
from lavapipe_child import worker_output
from logits_check import logits_errors
from safetensors.numpy import load_file, save_file

from dsv4_vk import Executor, Graph
from dsv4_vk.core.tuning import tuned
from dsv4_vk.hc.metrics import max_abs, nmse
from dsv4_vk.model import Model, V4Config
from dsv4_vk.model.checkpoint import CheckpointError, QuantWeight, load_hf
from dsv4_vk.model.synthetic import write_random
from dsv4_vk.model.config import ConfigError
from dsv4_vk.ops import get_op
from dsv4_vk.ops.base import coopmat_unavailable
from dsv4_vk.ops.mul_mat_coopmat import COOPMAT
from dsv4_vk.ops.quant import QUANT, quant_arrays
from dsv4_vk.ops.reduce_rows import reference_rms_norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
FIXTURES = ("fp8", "fp8_d256")


# --- the format, from its description ----------------------------------------------------------------

def e8m0(b):
    return np.asarray(b, np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)


def dequant_fp8(codes, scale):
    """codes uint8 [N, K] (E4M3), scale bytes [ceil(N/128), ceil(K/128)]: one per 128 × 128 block."""
    N, K = codes.shape
    s = np.repeat(np.repeat(e8m0(scale), 128, axis=0), 128, axis=1)[:N, :K]
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * s


def dequant_fp4(packed, scale):
    """packed uint8 [N, K/2]: element 2j in the low nibble; scale bytes [N, ceil(K/32)]."""
    nib = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    v = nib.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    return v * np.repeat(e8m0(scale), 32, axis=1)[:, :v.shape[1]]


def random_quant(rng, fmt, N, K, level=-6):
    """(codes, scale bytes) of a random N × K weight: every non-NaN code, scales around 2^level."""
    if fmt == "fp8":
        codes = rng.integers(0, 256, (N, K), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x38                   # NaN codes are refused at load
        grid = (-(-N // 128), -(-K // 128))
    else:
        codes = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
        grid = (N, -(-K // 32))
    return codes, rng.integers(127 + level - 2, 127 + level + 3, grid, dtype=np.uint8)


def dequant(fmt, codes, scale):
    return dequant_fp8(codes, scale) if fmt == "fp8" else dequant_fp4(codes, scale)


def run_graph(g, **inputs):
    ex = Executor()
    out = ex.run(g, **inputs)
    assert ex.last.check_guards() == []
    return out


def close(got, ref, what, tol=None):
    """NMSE ≤ 1e-10 and every |got − ref| within tol (default: 1e-5 of the largest |ref|, at least 1e-5)."""
    assert nmse(got, ref) <= 1e-10, what
    bound = 1e-5 * max(1.0, np.abs(ref).max()) if tol is None else tol
    assert np.all(np.abs(np.asarray(got, np.float64) - ref) <= bound), (what, max_abs(got, ref))


def swiglu_tol(x, gn, w13, route, limit, ref):
    """Per-element bound for MUL_MAT_ID's SwiGLU: 1e-5 of the largest |ref| plus f32 rounding of the
    gate's and up's dot products (64 ulp of their sums of |terms|, through the SwiGLU's slopes):
    where random scales make a dot product cancel, its f32 sum keeps only the rounding of its
    terms, in any kernel."""
    xn = np.asarray(x, np.float64) if gn is None else reference_rms_norm(x, gn, 1e-6)
    w = np.asarray(w13, np.float64)[route[..., 0].astype(np.int64)]          # [T, R, 2F, D]
    y = np.einsum("trnk,tk->trn", w, xn)
    terms = np.einsum("trnk,tk->trn", np.abs(w), np.abs(xn))
    F = w.shape[2] // 2
    g, u = y[..., :F], y[..., F:]
    gc, uc = np.minimum(g, limit), np.clip(u, -limit, limit)
    slope = terms[..., :F] * np.abs(uc) * 1.1 * (g < limit) + terms[..., F:] * np.abs(gc / (1 + np.exp(-gc))) * (
        np.abs(u) < limit)
    return 1e-5 * max(1.0, np.abs(ref).max()) + 64 * 2.0 ** -24 * slope


# --- kernels --------------------------------------------------------------------------------------------

# (N, K): partial last blocks (300 rows, 260 inputs), K % 4 != 0 (scalar loads), K = 4096 (V4's D)
SHAPES = {"fp8": [(300, 260), (37, 4096), (9, 70), (20, 208)], "fp4": [(40, 96), (33, 4096), (7, 70)]}


def check_mul_mat(rng, as_gpu=False):
    """The f32-lane kernels over quantised weights (coopmat.auto off, so that "auto" at 20 tokens stays on
    them where the device has matrix units: their path over these weights is tests/test_mul_mat_coopmat.py's)."""
    with tuned({"coopmat.auto": False}):
        check_f32_mul_mat(rng)


def check_f32_mul_mat(rng):
    for fmt, shapes in SHAPES.items():
        for N, K in shapes:
            codes, scale = random_quant(rng, fmt, N, K)
            w = dequant(fmt, codes, scale)
            words, sw = quant_arrays(codes, scale)
            for T in (1, 3, 20):
                x = rng.standard_normal((T, K)).astype(np.float32)
                gn = rng.standard_normal(K).astype(np.float32)
                kernels = ("auto", "gemm_regs", "gemm_shared") if T > 1 else ("auto", "gemv", "gemm_shared")
                for kernel in kernels:
                    for norm in (False, True) if kernel in ("auto", "gemv") and T == 1 else (False,):
                        g = Graph()
                        args = [g.input("x", x.shape), g.const(words)] + ([g.const(gn)] if norm else [])
                        prm = {"rms_eps": 1e-6} if norm else {}
                        g.output("y", g.op("MUL_MAT", *args, g.const(sw), wq=fmt, kernel=kernel, **prm))
                        got = run_graph(g, x=x)["y"]
                        ref = get_op("MUL_MAT").reference(x, w, *([gn] if norm else []), **prm)
                        close(got, ref, (fmt, N, K, T, kernel, norm))


def check_mul_mat_batched(rng):
    """wo_a's form: one [G·r, K] FP8 matrix (one scale grid) read as G batched [r, K] weights."""
    G, r, K, T = 2, 160, 136, 3
    codes, scale = random_quant(rng, "fp8", G * r, K)
    w = dequant_fp8(codes, scale).reshape(G, r, K)
    words, sw = quant_arrays(codes, scale)
    x = rng.standard_normal((G, T, K)).astype(np.float32)
    for kernel in ("gemv", "gemm_regs"):
        g = Graph()
        wt = g.const(words).reshape(G, r, words.shape[-1])
        g.output("y", g.op("MUL_MAT", g.input("x", x.shape), wt, g.const(sw), wq="fp8", kernel=kernel))
        close(run_graph(g, x=x)["y"], np.matmul(x.astype(np.float64), np.swapaxes(w, -1, -2)), kernel)


def check_mul_mat_id(rng):
    """SwiGLU (norm folded or not) and the weighted sum over quantised experts; w13 keeps a grid for
    the gate rows and one for the up rows of each expert (grid_rows = F), as loaded."""
    op = get_op("MUL_MAT_ID")
    for fmt, D, F in (("fp4", 256, 64), ("fp4", 96, 40), ("fp8", 200, 136), ("fp8", 66, 34), ("fp8", 144, 80)):
        T, E = 3, 5
        route = get_op("MOE_ROUTE").reference(rng.standard_normal((T, E)), top_k=3).astype(np.float32)
        parts13 = [random_quant(rng, fmt, F, D) for _ in range(2 * E)]
        parts2 = [random_quant(rng, fmt, D, F) for _ in range(E)]
        w13 = np.stack([np.concatenate([dequant(fmt, *parts13[2 * e]), dequant(fmt, *parts13[2 * e + 1])])
                        for e in range(E)])
        w2 = np.stack([dequant(fmt, *p) for p in parts2])
        q13 = quant_arrays(np.stack([np.concatenate([parts13[2 * e][0], parts13[2 * e + 1][0]]) for e in range(E)]),
                           np.concatenate([p[1].reshape(-1) for p in parts13]))
        q2 = quant_arrays(np.stack([p[0] for p in parts2]), np.concatenate([p[1].reshape(-1) for p in parts2]))
        x, gn = rng.standard_normal((T, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32)
        add = rng.standard_normal((T, D)).astype(np.float32)
        for norm in (False, True):
            g = Graph()
            xi, ri = g.input("x", x.shape), g.input("r", route.shape)
            extra, prm = ([g.const(gn)], {"rms_eps": 1e-6}) if norm else ([], {})
            h = g.output("h", g.op("MUL_MAT_ID", xi.reshape(T, 1, D), g.const(q13[0]), ri, *extra, g.const(q13[1]),
                                   mode="swiglu", limit=3.0, wq=fmt, grid_rows=F, **prm))
            g.output("y", g.op("MUL_MAT_ID", h, g.const(q2[0]), ri, g.input("a", add.shape), g.const(q2[1]),
                               mode="sum", wq=fmt))
            out = run_graph(g, x=x, r=route, a=add)
            rh = op.reference(x[:, None, :], w13, route, *([gn] if norm else []), mode="swiglu", limit=3.0, **prm)
            ry = op.reference(rh, w2, route, add, mode="sum")
            close(out["h"], rh, (fmt, D, F, norm, "swiglu"), swiglu_tol(x, gn if norm else None, w13, route, 3.0, rh))
            close(out["y"], ry, (fmt, D, F, norm, "sum"))


def check_shared_expert_in_the_same_dispatch(rng, staged_on=None):
    """FP4 routed experts and an FP8 shared expert (id E, its own tensors) in one MUL_MAT_ID: as if
    the shared expert were stacked after the others. Where `staged_on` (a device) is given, asserts
    that the staged kernel runs where K % 32 == 0."""
    op = get_op("MUL_MAT_ID")
    for D, F in ((256, 64), (96, 40)):
        T, E = 3, 6
        route = get_op("V4_ROUTE").reference(rng.standard_normal((T, E)), rng.standard_normal(E),
                                             top_k=2).astype(np.float32)         # route 2: the shared one
        r13 = [random_quant(rng, "fp4", 2 * F, D) for _ in range(E)]
        r2 = [random_quant(rng, "fp4", D, F) for _ in range(E)]
        s13 = [random_quant(rng, "fp8", F, D) for _ in range(2)]               # gate, up: a grid each
        s2 = random_quant(rng, "fp8", D, F)
        w13 = np.stack([dequant("fp4", *p) for p in r13] + [np.concatenate([dequant("fp8", *p) for p in s13])])
        w2 = np.stack([dequant("fp4", *p) for p in r2] + [dequant("fp8", *s2)])
        q13 = quant_arrays(np.stack([p[0] for p in r13]), np.concatenate([p[1].ravel() for p in r13]))
        q2 = quant_arrays(np.stack([p[0] for p in r2]), np.concatenate([p[1].ravel() for p in r2]))
        qs13 = quant_arrays(np.concatenate([p[0] for p in s13])[None], np.concatenate([p[1].ravel() for p in s13]))
        qs2 = quant_arrays(s2[0][None], s2[1])
        x, gn = rng.standard_normal((T, D)).astype(np.float32), rng.standard_normal(D).astype(np.float32)
        g = Graph()
        xi, ri = g.input("x", x.shape), g.input("r", route.shape)
        h = g.output("h", g.op("MUL_MAT_ID", xi.reshape(T, 1, D), g.const(q13[0]), ri, g.const(gn), g.const(q13[1]),
                               *map(g.const, qs13), mode="swiglu", rms_eps=1e-6, wq="fp4", shared_wq="fp8",
                               shared_grid_rows=F))
        g.output("y", g.op("MUL_MAT_ID", h, g.const(q2[0]), ri, g.const(q2[1]), *map(g.const, qs2), mode="sum",
                           wq="fp4", shared_wq="fp8"))
        if staged_on is not None:
            for node, K in zip(g.nodes, (D, F)):
                (launch,) = node.op.lower(node, staged_on)
                assert ("X_SHARED" in launch.defines) == (K % 32 == 0), (D, F, node.params["mode"])
        out = run_graph(g, x=x, r=route)
        rh = op.reference(x[:, None, :], w13, route, gn, mode="swiglu", rms_eps=1e-6)
        close(out["h"], rh, (D, F, "swiglu"))
        close(out["y"], op.reference(rh, w2, route, mode="sum"), (D, F, "sum"))


def kernel_checks(rng):
    check_mul_mat(rng)
    check_mul_mat_batched(rng)
    check_mul_mat_id(rng)
    check_shared_expert_in_the_same_dispatch(rng)


def test_kernels_match_a_float64_dequantisation(rng):
    kernel_checks(rng)


def test_gemv_rows_per_cluster_on_the_cpu_lowering(tune, rng, monkeypatch):
    tune({"gemv_quant.rows": 4})
    check_mul_mat(rng)


@pytest.mark.parametrize("rows,as_gpu", [(4, False), (2, True), (4, True)])
def test_expert_sum_rows_per_cluster(tune, rows, as_gpu, rng, monkeypatch, device):
    """MUL_MAT_ID's weighted sum over quantised experts with 2 or 4 output rows a cluster (N not a
    multiple of them: clamped rows not stored)."""
    if as_gpu:
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.rows": rows, "mul_mat_id.x_shared": False, "gemv_quant.x_shared": False})
    check_mul_mat_id(rng)
    check_shared_expert_in_the_same_dispatch(rng)


@pytest.mark.parametrize("spread,rows", [(None, 1), (0, 1), (None, 4), (0, 2)])
def test_kernels_as_on_a_gpu(tune, spread, rows, rng, monkeypatch, device):
    """Lowered for a GPU: lane clusters over K, GEMV outputs reduced by a workgroup (spread None) or
    by subgroup-lane clusters, 8 tokens a GEMV cluster, 4 loads in flight; at one token 1, 2 or 4
    output rows a cluster (N not a multiple of them: clamped rows not stored)."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"gemv.spread": spread, "gemv_quant.x_shared": False, "mul_mat_id.x_shared": False})
    tune({"gemv_quant.rows": rows})
    g = Graph()
    g.op("MUL_MAT", g.input("x", (1, 4096)), g.input("w", (37, 1024), "i32"), g.input("s", (8,), "i32"), wq="fp8")
    (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
    assert launch.spec[2] == rows
    check_mul_mat(rng)
    check_mul_mat_id(rng)
    check_shared_expert_in_the_same_dispatch(rng)


@pytest.mark.parametrize("as_gpu,rows", [(False, 1), (True, 1), (True, 4)])
def test_gemv_16_byte_loads(tune, as_gpu, rows, rng, monkeypatch, device):
    """The GEMV at one token loading a uvec4 of codes a step (knob gemv_quant.load 16: FP8 K % 16 == 0,
    FP4 K % 32 == 0, a partial 128-block at the row's end included) matches the float64
    dequantisation; other widths keep the word loads."""
    if as_gpu:
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"gemv_quant.load": 16, "gemv_quant.rows": rows, "gemv_quant.x_shared": False, "mul_mat_id.x_shared": False})
    for fmt, K, wide in (("fp8", 208, 1), ("fp8", 260, 0), ("fp4", 96, 1), ("fp4", 80, 0)):
        g = Graph()
        sr, sc = QUANT[fmt].grid(37, K)
        g.op("MUL_MAT", g.input("x", (1, K)), g.input("w", (37, QUANT[fmt].words(K)), "i32"),
             g.input("s", (-(-sr * sc // 4),), "i32"), wq=fmt)
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert launch.spec[3] == wide, (fmt, K)
    check_mul_mat(rng)


@pytest.mark.parametrize("as_gpu,rows", [(False, 1), (True, 2)])
def test_expert_16_byte_loads(tune, as_gpu, rows, rng, monkeypatch, device):
    """MUL_MAT_ID over quantised experts loading a uvec4 of codes a step (knob mul_mat_id.load 16,
    where K allows it; the FP8 shared expert beside FP4 ones keeps word loads) matches the float64
    dequantisation."""
    if as_gpu:
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.load": 16, "mul_mat_id.rows": rows, "mul_mat_id.x_shared": False, "gemv_quant.x_shared": False})
    for fmt, K, wide in (("fp8", 144, 1), ("fp8", 136, 0), ("fp4", 96, 1), ("fp4", 40, 0)):
        g = Graph()
        sr, sc = QUANT[fmt].grid(16, K)
        g.op("MUL_MAT_ID", g.input("x", (2, 3, K)), g.input("w", (4, 16, QUANT[fmt].words(K)), "i32"),
             g.input("r", (2, 3, 2)), g.input("s", (-(-4 * sr * sc // 4),), "i32"), mode="sum", wq=fmt)
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert launch.spec[3] == wide, (fmt, K)
    check_mul_mat_id(rng)
    check_shared_expert_in_the_same_dispatch(rng)


# (format, N, K): N not a multiple of the rows a cluster; K a single uvec4 of codes or not a multiple
# of a cluster's uvec4s (FP4 K = 28: a half-padded last word, x staged as zeros past K)
STAGED_SHAPES = [("fp8", 37, 4096), ("fp8", 300, 208), ("fp8", 9, 16), ("fp8", 130, 400), ("fp4", 33, 4096),
                 ("fp4", 40, 96), ("fp4", 7, 28), ("fp4", 131, 1024)]


def check_staged_gemv(rng, device=None):
    """The staged GEMV (gemv_quant.x_shared) at one token, plain and with the norm folded in, on
    weights with every code (E4M3 subnormals included) and scales from 2^−127 to 2^40, batched
    weights included, and weights of several scale grids (blocks of rows straddling two); where
    `device` is given, asserts the launches are the staged kernel's."""
    for fmt, N, K in STAGED_SHAPES:
        codes, scale = random_quant(rng, fmt, N, K)
        scale = rng.integers(0, 168, scale.shape, dtype=np.uint8)      # E8M0 bytes: 2^−127 .. 2^40
        scale[rng.random(scale.shape) < 0.5] = 127 - 6
        w = dequant(fmt, codes, scale)
        words, sw = quant_arrays(codes, scale)
        x = rng.standard_normal((1, K)).astype(np.float32)
        gn = rng.standard_normal(K).astype(np.float32)
        for norm in (False, True):
            g = Graph()
            args = [g.input("x", x.shape), g.const(words)] + ([g.const(gn)] if norm else [])
            prm = {"rms_eps": 1e-6} if norm else {}
            g.output("y", g.op("MUL_MAT", *args, g.const(sw), wq=fmt, **prm))
            if device is not None:
                (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
                assert "X_SHARED" in launch.defines, (fmt, N, K)
            got = run_graph(g, x=x)["y"]
            close(got, get_op("MUL_MAT").reference(x, w, *([gn] if norm else []), **prm), (fmt, N, K, norm))
    G, r, K = 3, 70, 256                       # wo_a's form: batched rows of one FP8 matrix, x per batch
    codes, scale = random_quant(rng, "fp8", G * r, K)
    w = dequant_fp8(codes, scale).reshape(G, r, K)
    words, sw = quant_arrays(codes, scale)
    x = rng.standard_normal((G, 1, K)).astype(np.float32)
    g = Graph()
    g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(words).reshape(G, r, -1), g.const(sw), wq="fp8"))
    close(run_graph(g, x=x)["y"], np.matmul(x.astype(np.float64), np.swapaxes(w, -1, -2)), "batched")
    # three matrices of r rows in one tensor, a scale grid each (grid_rows = r): blocks of rows that
    # straddle two grids, as one [3r, K] weight and as a batch of 3
    parts = [random_quant(rng, "fp8", r, K) for _ in range(G)]
    w3 = np.stack([dequant_fp8(*q) for q in parts])
    words, sw = quant_arrays(np.concatenate([q[0] for q in parts]), np.concatenate([q[1].ravel() for q in parts]))
    x1 = rng.standard_normal((1, K)).astype(np.float32)
    g = Graph()
    g.output("y", g.op("MUL_MAT", g.input("x", x1.shape), g.const(words), g.const(sw), wq="fp8", grid_rows=r))
    close(run_graph(g, x=x1)["y"], x1.astype(np.float64) @ w3.reshape(G * r, K).T, "grids")
    g = Graph()
    g.output("y", g.op("MUL_MAT", g.input("x", x.shape), g.const(words).reshape(G, r, -1), g.const(sw), wq="fp8",
                       grid_rows=r))
    close(run_graph(g, x=x)["y"], np.matmul(x.astype(np.float64), np.swapaxes(w3, -1, -2)), "batched grids")


@pytest.mark.parametrize("as_gpu,rows,unroll,groups,wg,lanes", [
    (False, 2, 2, 1024, 256, None), (True, 1, 1, 1, 256, None), (True, 2, 2, 1024, 1, None), (True, 4, 3, 2, 64, None),
    (False, 4, 2, 2, 256, 2), (True, 2, 1, 3, 64, 4), (True, 1, 2, 1024, 8, "subgroup")])
def test_staged_gemv(tune, as_gpu, rows, unroll, groups, wg, lanes, rng, monkeypatch, device):
    """The GEMV at one token with x staged in shared memory (knob gemv_quant.x_shared) matches the
    float64 dequantisation for 1, 2 or 4 rows a cluster, 1 to 3 steps in flight, few workgroups
    (clusters looping over row blocks), workgroups of one cluster, and clusters of 2, 4 or a
    subgroup's lanes (gemv_quant.x_shared_lanes: several clusters a subgroup, the folded norm's sums
    added a subgroup at a time); shapes it cannot take (rows not whole uvec4s) keep the GEMV."""
    if as_gpu:
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    lanes = device.caps.subgroup.min_size if lanes == "subgroup" else lanes
    tune({"gemv_quant.x_shared": True, "gemv_quant.x_shared_rows": rows, "gemv_quant.x_shared_unroll": unroll,
          "gemv_quant.x_shared_groups": groups, "gemv_quant.x_shared_wg": wg, "gemv_quant.x_shared_lanes": lanes})
    check_staged_gemv(rng, device)
    for fmt, K, staged in (("fp8", 260, False), ("fp4", 80, False), ("fp8", 208, True)):
        g = Graph()
        sr, sc = QUANT[fmt].grid(37, K)
        g.op("MUL_MAT", g.input("x", (1, K)), g.input("w", (37, QUANT[fmt].words(K)), "i32"),
             g.input("s", (-(-sr * sc // 4),), "i32"), wq=fmt)
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert ("X_SHARED" in launch.defines) == staged, (fmt, K)
        if staged:
            # (None: a subgroup on GPUs, at most the 13 uvec4s of a row rounded up to a power of two)
            L, sg = launch.defines["LANES"], device.caps.subgroup.min_size
            assert L == (lanes or (min(sg, 16) if as_gpu else 1)), launch.defines
            assert ("LANES_SHUFFLE" in launch.defines) == (1 < L < sg), launch.defines
            whole = device.caps.subgroup.max_size if L > 1 else 1
            blocks, clusters = -(-37 // rows), max(wg, whole) // L
            assert launch.spec == (max(wg, whole), unroll, rows, 0, 52)
            assert launch.grid[0] * launch.grid[1] == min(groups, -(-blocks // clusters)), launch.grid
    check_mul_mat(rng)


@pytest.mark.parametrize("as_gpu", [False, True])
def test_the_staged_kernels_are_the_gpu_default(as_gpu, monkeypatch, device):
    """By default (knobs x_shared None) GPUs take the staged GEMV and expert kernels over quantised
    weights, with 4 output rows a cluster where N and K are both ≥ 4096 and 1 elsewhere; CPU devices
    keep the word-load kernels."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu" if as_gpu else "cpu"))
    for N, K, rows in ((4096, 4096, 4), (1024, 4096, 1), (4096, 1024, 1)):
        g = Graph()
        sr, sc = QUANT["fp8"].grid(N, K)
        g.op("MUL_MAT", g.input("x", (1, K)), g.input("w", (N, QUANT["fp8"].words(K)), "i32"),
             g.input("s", (-(-sr * sc // 4),), "i32"), wq="fp8")
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert ("X_SHARED" in launch.defines) == as_gpu
        if as_gpu:
            assert launch.spec[2] == rows, (N, K)
    g = Graph()
    sr, sc = QUANT["fp4"].grid(64, 256)
    g.op("MUL_MAT_ID", g.input("x", (1, 3, 256)), g.input("w", (4, 64, QUANT["fp4"].words(256)), "i32"),
         g.input("r", (1, 3, 2)), g.input("s", (-(-4 * sr * sc // 4),), "i32"), mode="sum", wq="fp4")
    (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
    assert ("X_SHARED" in launch.defines) == as_gpu


def test_staged_gemv_falls_back_where_x_does_not_fit(tune, rng, monkeypatch, device):
    """x past the device's maxComputeSharedMemorySize: the GEMV without staging, still right."""
    limits = dataclasses.replace(device.caps.limits, max_shared_memory=4096 + 1023)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", limits=limits))
    tune({"gemv_quant.x_shared": True})
    for K, norm, staged in ((1024, False, True), (1024, True, False), (1600, False, False)):
        g = Graph()
        args = [g.input("x", (1, K)), g.input("w", (5, K // 4), "i32")] + ([g.input("g", (K,))] if norm else [])
        g.op("MUL_MAT", *args, g.input("s", (4,), "i32"), wq="fp8", **({"rms_eps": 1e-6} if norm else {}))
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert ("X_SHARED" in launch.defines) == staged, (K, norm)
    check_mul_mat(rng)


def test_staged_knobs_key_the_program():
    """Each staged kernel knob is part of a graph's signature (its program's cache key)."""
    def signature(**knobs):
        with tuned(knobs):
            g = Graph()
            g.op("MUL_MAT", g.input("x", (1, 64)), g.input("w", (4, 16), "i32"), g.input("s", (1,), "i32"), wq="fp8")
            return g.signature()
    base = signature()
    changed = [{"gemv_quant.x_shared": True}, {"gemv_quant.x_shared_rows": 4}, {"gemv_quant.x_shared_unroll": 1},
               {"gemv_quant.x_shared_groups": 7}, {"gemv_quant.x_shared_wg": 64}, {"mul_mat_id.x_shared": True},
               {"mul_mat_id.x_shared_rows": 1}, {"mul_mat_id.x_shared_unroll": 3}, {"mul_mat_id.x_shared_groups": 5},
               {"mul_mat_id.x_shared_split": 2}, {"gemv_quant.x_shared_lanes": 4},
               {"gemv_quant.x_shared_one_scale": True}, {"mul_mat_id.x_shared_heavy_first": True},
               {"mul_mat_id.x_shared_route_groups": 2}, {"mul_mat_id.x_shared_lanes": 4},
               {"mul_mat_id.x_shared_sum_rows": 4}]
    sigs = {signature(**{k: v for k, v in c.items()}) for c in changed}
    assert base not in sigs and len(sigs) == len(changed)


@pytest.mark.parametrize("knob,value,match", [
    ("x_shared_rows", 3, r"'gemv_quant\.x_shared_rows' must be 1, 2 or 4, got 3"),
    ("x_shared_rows", True, r"'gemv_quant\.x_shared_rows' must be 1, 2 or 4, got True"),
    ("x_shared_rows", 4.0, r"'gemv_quant\.x_shared_rows' must be 1, 2 or 4, got 4\.0"),
    ("x_shared_unroll", 0, r"'gemv_quant\.x_shared_unroll' must be an integer in \[1, 8\], got 0"),
    ("x_shared_groups", 0, r"'gemv_quant\.x_shared_groups' must be an integer ≥ 1, got 0"),
    ("x_shared_wg", 96, r"'gemv_quant\.x_shared_wg' must be a power of two ≤ 256, got 96"),
    *[("x_shared_lanes", v, r"'gemv_quant\.x_shared_lanes' must be None or a power of two from 2 to the device's "
       rf"smallest subgroup \(\d+ lanes\), got {v}") for v in (1, 3, 64, 2.0, True)],
    ("x_shared_one_scale", 1, r"'gemv_quant\.x_shared_one_scale' must be True or False, got 1"),
])
def test_staged_gemv_knobs_are_checked(tune, knob, value, match, device):
    tune({"gemv_quant.x_shared": True, f"gemv_quant.{knob}": value})
    g = Graph()
    g.op("MUL_MAT", g.input("x", (1, 64)), g.input("w", (4, 16), "i32"), g.input("s", (1,), "i32"), wq="fp8")
    with pytest.raises(ValueError, match=match):
        g.nodes[0].op.lower(g.nodes[0], device)


@pytest.mark.parametrize("rows,lanes", [(2, None), (4, 4)])
def test_staged_gemv_one_scale_for_the_rows(tune, rows, lanes, rng, monkeypatch, device):
    """gemv_quant.x_shared_one_scale: FP8 rows of a cluster in one 128-row block of the scale grid take one
    scale word a step (spec constant 5 set) where the layout guarantees it (consecutive rows, batch
    items' and matrices' first rows multiples of the rows a cluster), and match the float64
    dequantisation; elsewhere (FP4, rows straddling two matrices' grids or batch items starting
    mid-block) one a row, still right."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"gemv_quant.x_shared": True, "gemv_quant.x_shared_rows": rows, "gemv_quant.x_shared_lanes": lanes,
          "gemv_quant.x_shared_one_scale": True})

    def one_scale(fmt, batch, r, grid_rows=None, K=256):
        g = Graph()
        sr, sc = QUANT[fmt].grid(grid_rows or batch * r, K)
        w = g.input("w", (batch * r, QUANT[fmt].words(K)), "i32")
        s = g.input("s", (-(-sr * sc * (batch * r // (grid_rows or batch * r)) // 4),), "i32")
        x = g.input("x", (batch, 1, K) if batch > 1 else (1, K))
        g.op("MUL_MAT", x, w.reshape(batch, r, -1) if batch > 1 else w, s, wq=fmt,
             **({"grid_rows": grid_rows} if grid_rows else {}))
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert "X_SHARED" in launch.defines
        return launch.spec[5:] == (1,)
    assert one_scale("fp8", 1, 300) and one_scale("fp8", 1, 37) and not one_scale("fp4", 1, 40)
    assert one_scale("fp8", 3, 72) and one_scale("fp8", 3, 72, grid_rows=72)
    assert one_scale("fp8", 3, 70) == (rows == 2) and one_scale("fp8", 3, 70, grid_rows=70) == (rows == 2)
    assert one_scale("fp8", 1, 210, grid_rows=70) == (rows == 2)
    check_staged_gemv(rng, device)


def test_staged_gemv_lanes_need_subgroup_shuffles(tune, monkeypatch, device):
    """Clusters of fewer lanes than a subgroup reduce by shuffles: a device without them refuses the
    knob gemv_quant.x_shared_lanes, naming it (None keeps whole-subgroup clusters there)."""
    sg = dataclasses.replace(device.caps.subgroup, operations=("basic", "arithmetic"))
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", subgroup=sg))
    g = Graph()
    g.op("MUL_MAT", g.input("x", (1, 1024)), g.input("w", (4, 256), "i32"), g.input("s", (2,), "i32"), wq="fp8")
    tune({"gemv_quant.x_shared": True})
    (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
    assert "LANES_SUBGROUP_OPS" in launch.defines
    tune({"gemv_quant.x_shared_lanes": 2})
    with pytest.raises(ValueError, match=r"'gemv_quant\.x_shared_lanes' = 2: clusters of 2 lanes need subgroup "
                                         "shuffles"):
        g.nodes[0].op.lower(g.nodes[0], device)


def nan_close(got, ref, what):
    assert np.array_equal(np.isnan(got), np.isnan(ref)), what
    close(np.nan_to_num(got), np.nan_to_num(ref), what)


STAGED_EXPERT_SHAPES = (("fp4", 256, 64), ("fp4", 1024, 96), ("fp8", 144, 80), ("fp8", 400, 208))


def check_staged_experts(rng, device=None, staged=None, shapes=STAGED_EXPERT_SHAPES):
    """MUL_MAT_ID's staged kernel (mul_mat_id.x_shared): SwiGLU (norm folded or not, x one row a token
    or one a route) and the weighted sum (with an addend; scales from 2^−127 to 2^40) over quantised
    experts with every code; an invalid expert id (NaN outputs) and experts held by another part
    of a split stack (0 / no contribution). Where `device` is given, asserts for each mode in
    `staged` (default: both) whether it launches the staged kernel."""
    staged = {"swiglu": True, "sum": True} if staged is None else staged
    op = get_op("MUL_MAT_ID")
    for fmt, D, F in shapes:
        T, E, n_ids, R = 2, 4, 6, 3
        route = get_op("MOE_ROUTE").reference(rng.standard_normal((T, n_ids)), top_k=R).astype(np.float32)
        route[1, 2, 0] = 99.0                           # not an expert id: NaN outputs for token 1
        route[0, :, 0] = [4, 1, 2]                      # expert 4: another part's (id_base 0, E = 4 here)

        def experts(N, K, wide):
            parts = [random_quant(rng, fmt, N, K) for _ in range(E)]
            if wide:
                parts = [(c, np.where(rng.random(sc.shape) < 0.5, 121, rng.integers(0, 168, sc.shape)).astype(np.uint8))
                         for c, sc in parts]
            w = np.stack([dequant(fmt, *q) for q in parts])
            return w, quant_arrays(np.stack([q[0] for q in parts]), np.concatenate([q[1].ravel() for q in parts]))
        w13, q13 = experts(2 * F, D, False)         # (the SwiGLU's clamp of sums that cancel: f32 rounding)
        w2, q2 = experts(D, F, True)
        gn = rng.standard_normal(D).astype(np.float32)
        add = rng.standard_normal((T, D)).astype(np.float32)
        for per_route, norm in ((False, False), (False, True), (True, True)):
            x = rng.standard_normal((T, R if per_route else 1, D)).astype(np.float32)
            h = rng.standard_normal((T, R, F)).astype(np.float32)
            g = Graph()
            ri = g.input("r", route.shape)
            extra, prm = ([g.const(gn)], {"rms_eps": 1e-6}) if norm else ([], {})
            g.output("h", g.op("MUL_MAT_ID", g.input("x", x.shape), g.const(q13[0]), ri, *extra, g.const(q13[1]),
                               mode="swiglu", limit=30.0, wq=fmt, n_ids=n_ids, **prm))
            g.output("y", g.op("MUL_MAT_ID", g.input("hh", h.shape), g.const(q2[0]), ri, g.input("a", add.shape),
                               g.const(q2[1]), mode="sum", wq=fmt, n_ids=n_ids))
            if device is not None:
                for node in g.nodes:
                    (launch,) = node.op.lower(node, device)
                    if node.params["mode"] in staged:
                        assert ("X_SHARED" in launch.defines) == staged[node.params["mode"]], (fmt, D, F, node.params)
            out = run_graph(g, x=x, r=route, hh=h, a=add)
            with np.errstate(over="ignore"):               # silu of gates far below 0: exp overflows to inf
                rh = op.reference(x, w13, route, *([gn] if norm else []), mode="swiglu", limit=30.0, n_ids=n_ids,
                                  **prm)
            nan_close(out["h"], rh, (fmt, D, F, per_route, norm, "swiglu"))
            nan_close(out["y"], op.reference(h, w2, route, add, mode="sum", n_ids=n_ids), (fmt, D, F, "sum"))


@pytest.mark.parametrize("as_gpu,rows,unroll,groups", [(False, 2, 2, 1024), (True, 1, 1, 1), (True, 4, 3, 2)])
def test_staged_experts(tune, as_gpu, rows, unroll, groups, rng, monkeypatch, device):
    """MUL_MAT_ID's staged kernel matches the float64 dequantisation for 1, 2 or 4 outputs a
    cluster, 1 to 3 steps in flight, few workgroups, beside an FP8 shared expert too (where K % 32
    == 0; else, and with rows not whole uvec4s, the other kernel runs)."""
    if as_gpu:
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_rows": rows, "mul_mat_id.x_shared_unroll": unroll,
          "mul_mat_id.x_shared_groups": groups})
    check_staged_experts(rng, device)
    check_mul_mat_id(rng)
    check_shared_expert_in_the_same_dispatch(rng, device)


@pytest.mark.parametrize("split,rows,unroll", [(2, 1, 1), (4, 2, 2), (1024, 4, 1)])
def test_staged_expert_sum_split_over_routes(tune, split, rows, unroll, rng, monkeypatch, device):
    """The staged weighted sum with the routes split among clusters (mul_mat_id.x_shared_split: 2 of
    3 routes, 4 with a cluster that has none, as many as a workgroup has clusters) matches the
    float64 dequantisation, NaN for an invalid id and nothing from another part's expert included,
    beside an FP8 shared expert too; where not every route's x fits in shared memory, no split."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_rows": rows, "mul_mat_id.x_shared_unroll": unroll,
          "mul_mat_id.x_shared_split": split})
    check_staged_experts(rng, device)
    check_shared_expert_in_the_same_dispatch(rng, device)
    clusters = 256 // min(device.caps.subgroup.min_size, 16)
    for room, want in ((3 * 832 + 1024, min(split, clusters)), (2 * 832 + 1024, 1)):     # (+ the split sums)
        limits = dataclasses.replace(device.caps.limits, max_shared_memory=room)
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=limits))
        g = Graph()
        g.op("MUL_MAT_ID", g.input("x", (1, 3, 208)), g.input("w", (4, 16, 52), "i32"), g.input("r", (1, 3, 2)),
             g.input("s", (16,), "i32"), mode="sum", wq="fp8")
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert launch.spec[8] == want and launch.grid[0] * launch.grid[1] == -(-(-(-16 // rows)) // (clusters // want))
        if want > 1:
            check_staged_experts(rng, device, {"sum": True}, (("fp8", 400, 208),))
    # rows of 2 uvec4s (FP4, F 64): clusters of 2 lanes or fewer, 128 or more a workgroup; split only
    # where their outputs fit the 256 floats the split sums are added in
    lanes = min(device.caps.subgroup.min_size, 2)
    g = Graph()
    g.op("MUL_MAT_ID", g.input("x", (1, 3, 64)), g.input("w", (4, 16, 8), "i32"), g.input("r", (1, 3, 2)),
         g.input("s", (32,), "i32"), mode="sum", wq="fp4")
    (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
    assert launch.spec[8] == (min(split, 256 // lanes) if 256 // lanes * rows <= 256 else 1), (lanes, rows)


def staged_sum_launch(device, R=3, N=16, K=208):
    """The launch of a staged weighted sum over FP8 experts (x [1, R, K], N outputs)."""
    g = Graph()
    sr, sc = QUANT["fp8"].grid(N, K)
    g.op("MUL_MAT_ID", g.input("x", (1, R, K)), g.input("w", (4, N, K // 4), "i32"), g.input("r", (1, R, 2)),
         g.input("s", (-(-4 * sr * sc // 4),), "i32"), mode="sum", wq="fp8")
    (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
    return launch


def test_staged_expert_sum_rows_of_its_own(tune, rng, monkeypatch, device):
    """mul_mat_id.x_shared_sum_rows sets the weighted sum's outputs a cluster apart from the SwiGLU's
    (x_shared_rows): the sum's launch takes it, the SwiGLU's keeps x_shared_rows, both match the float64
    dequantisation; values other than None, 1, 2, 4 are refused by name."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_rows": 1, "mul_mat_id.x_shared_sum_rows": 4})
    assert staged_sum_launch(device).spec[4] == 4
    g = Graph()
    g.op("MUL_MAT_ID", g.input("x", (1, 1, 208)), g.input("w", (4, 32, 208 // 4), "i32"), g.input("r", (1, 3, 2)),
         g.input("s", (8,), "i32"), mode="swiglu", wq="fp8")
    (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
    assert "X_SHARED" in launch.defines and launch.spec[4] == 1
    check_staged_experts(rng, device)
    for bad in (3, 0, True, 4.0, "4"):
        tune({"mul_mat_id.x_shared_sum_rows": bad})
        with pytest.raises(ValueError, match=r"'mul_mat_id.x_shared_sum_rows' must be None, 1, 2 or 4, got"):
            staged_sum_launch(device)


# the sum over N = 202 outputs (not a multiple of the rows a cluster) beside the shapes of
# check_staged_experts (its SwiGLU, over K = 202, is not staged: not whole uvec4s)
ODD_N_SHAPES = (("fp8", 202, 48), ("fp4", 202, 64))


@pytest.mark.parametrize("groups,rows,split,want", [(2, 1, 1, 2), (3, 4, 1, 3), (1024, 2, 2, 3)])
def test_staged_expert_sum_route_groups(tune, groups, rows, split, want, rng, monkeypatch, device):
    """The staged weighted sum with its routes in groups (mul_mat_id.x_shared_route_groups: 2 groups of 3
    routes, 2 and 1; one route each; more groups than routes: R of them), a workgroup per (output block,
    group) and the groups' partials added by the last one, matches the float64 dequantisation: NaN for an
    invalid id, nothing from another part's expert, the addend added once, beside an FP8 shared expert
    too, N not a multiple of the rows, several tokens (a counter each)."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_rows": rows, "mul_mat_id.x_shared_route_groups": groups,
          "mul_mat_id.x_shared_split": split})
    launch = staged_sum_launch(device)
    assert "ROUTE_GROUPS" in launch.defines and launch.spec[10] == want and len(launch.writes) == 3, launch.spec
    check_staged_experts(rng, device, shapes=STAGED_EXPERT_SHAPES[::3])
    check_staged_experts(rng, device, {"sum": True}, ODD_N_SHAPES)
    check_shared_expert_in_the_same_dispatch(rng, device)


def test_staged_expert_sum_route_groups_stage_their_rows(tune, rng, monkeypatch, device):
    """Each route group stages its own routes' x rows: 7 routes in 2 groups need room for 4 rows, not 7,
    where the shared memory holds 4 (FP8, K 208: 832 bytes a row, beside the split sums and the ticket);
    with room for 1, a group's 2 of 3 routes are staged one after the other (results checked)."""
    def room(rows):
        limits = dataclasses.replace(device.caps.limits, max_shared_memory=rows * 832 + 1024 + 4)
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", limits=limits))
    room(4)
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_split": 2})
    assert staged_sum_launch(device, R=7).spec[6] == 4
    tune({"mul_mat_id.x_shared_route_groups": 2})
    launch = staged_sum_launch(device, R=7)
    assert launch.spec[6] == 4 and launch.spec[8] > 1 and launch.spec[10] == 2, launch.spec
    assert declared_shared_bytes(launch) <= device.caps.limits.max_shared_memory
    room(1)
    launch = staged_sum_launch(device)
    assert launch.spec[6] == 1 and launch.spec[8] == 1 and launch.spec[10] == 2, launch.spec
    check_staged_experts(rng, device, {"sum": True}, (("fp8", 400, 208),))


def test_staged_swiglu_heavy_first_changes_no_bit(tune, rng, monkeypatch, device):
    """The staged SwiGLU with the last route's blocks first (mul_mat_id.x_shared_heavy_first) writes
    exactly what it writes without, FP4 routed experts beside the FP8 shared one (the last route) and
    FP8 ones, x one row a token or one a route, the norm folded or not, an invalid id and another
    part's expert included; and matches the float64 dequantisation."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_groups": 2})
    F, D, T, E = 48, 256, 2, 4
    route = get_op("V4_ROUTE").reference(rng.standard_normal((T, E)), rng.standard_normal(E),
                                         top_k=3).astype(np.float32)        # route 3: the shared expert
    route[1, 1, 0] = -1.0                                                   # not an expert id
    route[0, 0, 0] = 0.0                                    # (the FP8 stack below holds experts 1 .. 4)
    parts = [random_quant(rng, "fp4", 2 * F, D) for _ in range(E)]
    q13 = quant_arrays(np.stack([c for c, _ in parts]), np.concatenate([sc.ravel() for _, sc in parts]))
    s13 = random_quant(rng, "fp8", 2 * F, D)
    qs13 = quant_arrays(s13[0][None], s13[1])
    f8 = [random_quant(rng, "fp8", 2 * F, D) for _ in range(E)]
    q8 = quant_arrays(np.stack([c for c, _ in f8]), np.concatenate([sc.ravel() for _, sc in f8]))
    w4 = np.stack([dequant("fp4", *q) for q in parts] + [dequant("fp8", *s13)])
    w8 = np.stack([dequant("fp8", *q) for q in f8])
    gn = rng.standard_normal(D).astype(np.float32)
    op = get_op("MUL_MAT_ID")
    for per_route, norm in ((False, True), (True, False)):
        x = rng.standard_normal((T, 4 if per_route else 1, D)).astype(np.float32)
        outs = []
        for heavy in (False, True):
            tune({"mul_mat_id.x_shared_heavy_first": heavy})
            g = Graph()
            xi, ri = g.input("x", x.shape), g.input("r", route.shape)
            extra, prm = ([g.const(gn)], {"rms_eps": 1e-6}) if norm else ([], {})
            g.output("a", g.op("MUL_MAT_ID", xi, g.const(q13[0]), ri, *extra, g.const(q13[1]), *map(g.const, qs13),
                               mode="swiglu", limit=30.0, wq="fp4", shared_wq="fp8", **prm))
            g.output("b", g.op("MUL_MAT_ID", xi, g.const(q8[0]), ri, *extra, g.const(q8[1]), mode="swiglu",
                               limit=30.0, wq="fp8", n_ids=E + 2, id_base=1, **prm))
            for node in g.nodes:
                (launch,) = node.op.lower(node, device)
                assert "X_SHARED" in launch.defines and launch.spec[9] == heavy, launch.spec
            outs.append(run_graph(g, x=x, r=route))
        for k in ("a", "b"):
            assert np.array_equal(outs[0][k], outs[1][k], equal_nan=True), (k, per_route, norm)
        with np.errstate(over="ignore"):
            ra = op.reference(x, w4, route, *([gn] if norm else []), mode="swiglu", limit=30.0, **prm)
            rb = op.reference(x, w8, route, *([gn] if norm else []), mode="swiglu", limit=30.0, n_ids=E + 2,
                              id_base=1, **prm)
        nan_close(outs[1]["a"], ra, ("fp4+fp8", per_route, norm))
        nan_close(outs[1]["b"], rb, ("fp8", per_route, norm))


@pytest.mark.parametrize("lanes", [2, 4])
def test_staged_experts_lanes_a_cluster(tune, lanes, rng, monkeypatch, device):
    """The staged kernels with clusters of fewer lanes than the subgroup (mul_mat_id.x_shared_lanes: several
    clusters a subgroup, a shuffle butterfly) match the float64 dequantisation, with route groups too."""
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu"))
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_lanes": lanes, "mul_mat_id.x_shared_route_groups": lanes // 2,
          "mul_mat_id.x_shared_rows": 4 // lanes})
    assert staged_sum_launch(device).defines["LANES"] == min(lanes, device.caps.subgroup.min_size)
    check_staged_experts(rng, device, shapes=STAGED_EXPERT_SHAPES[1:3])
    check_shared_expert_in_the_same_dispatch(rng, device)


@pytest.mark.parametrize("knob,value,match", [
    ("x_shared_route_groups", 0, r"'mul_mat_id\.x_shared_route_groups' must be an integer ≥ 1, got 0"),
    ("x_shared_route_groups", 2.0, r"'mul_mat_id\.x_shared_route_groups' must be an integer ≥ 1, got 2\.0"),
    ("x_shared_lanes", 6, r"'mul_mat_id\.x_shared_lanes' must be None or a power of two in \[1, 256\].*got 6"),
    ("x_shared_lanes", 0, r"'mul_mat_id\.x_shared_lanes' must be None or a power of two in \[1, 256\].*got 0"),
    ("x_shared_heavy_first", 1, r"'mul_mat_id\.x_shared_heavy_first' must be True or False, got 1"),
    ("x_shared_split", 3, r"'mul_mat_id\.x_shared_split' must be a power of two ≥ 1, got 3"),
    ("x_shared_rows", 3, r"'mul_mat_id\.x_shared_rows' must be 1, 2 or 4, got 3"),
    ("x_shared_rows", True, r"'mul_mat_id\.x_shared_rows' must be 1, 2 or 4, got True"),
    ("x_shared_unroll", 9, r"'mul_mat_id\.x_shared_unroll' must be an integer in \[1, 8\], got 9"),
    ("x_shared_groups", -1, r"'mul_mat_id\.x_shared_groups' must be an integer ≥ 1, got -1"),
])
def test_staged_expert_knobs_are_checked(tune, knob, value, match, device):
    tune({"mul_mat_id.x_shared": True, f"mul_mat_id.{knob}": value})
    g = Graph()
    g.op("MUL_MAT_ID", g.input("x", (1, 3, 64)), g.input("w", (4, 16, 16), "i32"), g.input("r", (1, 3, 2)),
         g.input("s", (4,), "i32"), mode="sum", wq="fp8")
    with pytest.raises(ValueError, match=match):
        g.nodes[0].op.lower(g.nodes[0], device)


def test_staged_expert_sum_stages_the_routes_that_fit(tune, rng, monkeypatch, device):
    """The staged weighted sum with shared memory for 2 or 1 of 3 routes' x rows (staged again as the
    routes go: FP8, F = 208, 832 bytes a row) beside its split sums (1 KiB); without room for one,
    the other kernel."""
    tune({"mul_mat_id.x_shared": True})
    for room, staged in ((2 * 832 + 1024, True), (832 + 1024, True), (831 + 1024, False)):
        limits = dataclasses.replace(device.caps.limits, max_shared_memory=room)
        monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", limits=limits))
        check_staged_experts(rng, device, {"sum": staged}, (("fp8", 400, 208),))
        g = Graph()
        g.op("MUL_MAT_ID", g.input("x", (1, 3, 208)), g.input("w", (4, 16, 52), "i32"), g.input("r", (1, 3, 2)),
             g.input("s", (16,), "i32"), mode="sum", wq="fp8")
        (launch,) = g.nodes[0].op.lower(g.nodes[0], device)
        assert launch.spec[6:7] == (((room - 1024) // 832,) if staged else ()), room


def declared_shared_bytes(launch) -> int:
    """Bytes of shared memory a launch's pipeline declares as specialised (dsv4_vk.vk.spirv)."""
    from dsv4_vk.vk.shader import compile_shader, specialize
    from dsv4_vk.vk.spirv import workgroup_bytes
    defines, named = specialize(launch.shader, launch.defines)
    got = workgroup_bytes(compile_shader(launch.shader, defines), {**dict(enumerate(launch.spec)), **named})
    assert got is not None, launch.shader
    return got


@pytest.mark.parametrize("fmt", ["fp4", "fp8"])
def test_the_one_token_kernels_fit_the_h200s_shared_memory(tune, fmt, monkeypatch, device):
    """The staged MUL_MAT_ID and GEMV kernels as lowered for DeepSeek-V4-Flash's widths (experts
    D 4096, F 2048, 65 of them, 7 routes; the attention's GEMV shapes) on a GPU with the H200's
    49152 B of shared memory declare at most that (the staged sum's x rows filled it exactly and
    its split sums' 1 KiB went past: the H200 lost the device), for every route split."""
    limits = dataclasses.replace(device.caps.limits, max_shared_memory=49152)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", limits=limits))
    q = QUANT[fmt]
    names = iter(range(1 << 20))

    def inp(g, shape, dtype="f32"):
        return g.input(f"i{next(names)}", shape, dtype)

    def weights(g, E, N, K):
        sr, sc = q.grid(N, K)
        return inp(g, (E, N, q.words(K)), "i32"), inp(g, (-(-E * sr * sc // 4),), "i32")
    for knobs in ({"mul_mat_id.x_shared_split": 1}, {"mul_mat_id.x_shared_split": 8},
                  {"mul_mat_id.x_shared_route_groups": 2, "mul_mat_id.x_shared_split": 8},
                  {"mul_mat_id.x_shared_route_groups": 7, "mul_mat_id.x_shared_lanes": 8,
                   "mul_mat_id.x_shared_heavy_first": True}):
        tune({"mul_mat_id.x_shared": True, "gemv_quant.x_shared": True, **knobs})
        g = Graph()
        w, s = weights(g, 65, 2 * 2048, 4096)
        r = inp(g, (1, 7, 2))
        for norm in ([], [inp(g, (4096,))]):
            g.op("MUL_MAT_ID", inp(g, (1, 1, 4096)), w, r, *norm, s, mode="swiglu", wq=fmt,
                 **({"rms_eps": 1e-6} if norm else {}))
        w2, s2 = weights(g, 65, 4096, 2048)
        g.op("MUL_MAT_ID", inp(g, (1, 7, 2048)), w2, r, s2, mode="sum", wq=fmt)
        for N, K in ((32768, 1024), (4096, 8192), (8192, 4096), (1024, 4096), (512, 4096)):
            w1, s1 = weights(g, 1, N, K)
            g.op("MUL_MAT", inp(g, (1, K)), w1.reshape((N, q.words(K))), s1, wq=fmt)
        staged = False
        for node in g.nodes:
            for launch in node.op.lower(node, device):
                assert declared_shared_bytes(launch) <= 49152, (knobs, node.op.name, launch.defines, launch.spec)
                staged |= "X_SHARED" in launch.defines
        assert staged, knobs


def test_quantised_weights_are_checked():
    g = Graph()
    x, w, s4 = g.input("x", (1, 64)), g.input("w", (8, 16), "i32"), g.input("s", (4,), "i32")
    with pytest.raises(ValueError, match=r"wq must be one of \['fp4', 'fp8'\]"):
        g.op("MUL_MAT", x, w, s4, wq="int4")
    with pytest.raises(ValueError, match=r"holds 16 words a row; 64 fp4 codes take 8"):
        g.op("MUL_MAT", x, w, s4, wq="fp4")
    with pytest.raises(ValueError, match=r"scale holds 4 bytes.*needs 1 grid\(s\) of 8 × 2 = 16"):
        g.op("MUL_MAT", x, g.input("w4", (8, 8), "i32"), g.input("s1", (1,), "i32"), wq="fp4")
    with pytest.raises(ValueError, match=r"grid_rows must be an integer ≥ 1 dividing the weight's 8 rows, got 3"):
        g.op("MUL_MAT", x, g.input("w6", (8, 8), "i32"), s4, wq="fp4", grid_rows=3)
    with pytest.raises(ValueError, match=r"must be one of \('f32', 'bf16', 'f16'\), got i32 \(quantised weights: wq=\)"):
        g.op("MUL_MAT", x, g.input("wi", (8, 64), "i32"))
    with pytest.raises(ValueError, match=r"whole contiguous tensor"):
        g.op("MUL_MAT", g.input("x2", (1, 16)), g.input("w5", (8, 4), "i32")[1:], s4, wq="fp8")


# --- loading ----------------------------------------------------------------------------------------------

SMALL = V4Config(vocab_size=48, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=32,
                 q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=32, layer_types=("compressed_sparse_attention", "sliding_attention"),
                 mlp_layer_types=("hash_moe", "moe"), index_n_heads=16, index_head_dim=16, index_topk=4,
                 sliding_window=8, compress_rates={"compressed_sparse_attention": 4,
                                                   "heavily_compressed_attention": 8}, max_ctx=32)


@pytest.fixture
def qdir(tmp_path):
    d = tmp_path / "m"
    write_random(str(d), SMALL, 3, dtype="fp8", naming="deepseek")
    return d


def rewrite(d, fn):
    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"))


def test_published_layouts_load_as_published(tmp_path):
    """DeepSeek's names with .scale, save_pretrained's with .weight_scale_inv; E8M0, U8 and F32
    scales; one file or shards: the same QuantWeights, bytes unchanged (no widening)."""
    base = None
    for naming, shards, sd in (("deepseek", 1, "e8m0"), ("save_pretrained", 3, "u8"), ("deepseek", 2, "f32")):
        d = tmp_path / f"{naming}{shards}"
        written = write_random(str(d), SMALL, 5, dtype="fp8", naming=naming, shards=shards, scale_dtype=sd)
        cfg, w = load_hf(str(d))
        q = w["layers.1.attn.wq_b.weight"]
        assert isinstance(q, QuantWeight) and q.fmt == "fp8" and q.codes.dtype == np.uint8
        e = w["layers.1.ffn.experts.w13"]
        assert e.fmt == "fp4" and e.codes.shape == (4, 64, 32) and e.grid_rows == 32
        for k, a in written.items():
            if isinstance(a, QuantWeight):
                assert np.array_equal(a.codes, w[k].codes) and np.array_equal(a.scale.ravel(), w[k].scale.ravel()), k
        if base is None:
            base = w
        assert all(np.array_equal(np.asarray(base[k], np.float64), np.asarray(w[k], np.float64)) for k in w)
    with open(tmp_path / "save_pretrained3" / "model.safetensors.index.json") as f:
        wm = json.load(f)["weight_map"]
    assert wm["model.layers.0.attn.wq_a.weight"] != wm["model.layers.0.attn.wq_a.weight_scale_inv"]


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.__setitem__("layers.0.attn.wq_a.scale", np.zeros((2, 1), np.uint8)),
     r"scale 'layers\.0\.attn\.wq_a\.scale' has shape \[2, 1\]; fp8 weight 'layers\.0\.attn\.wq_a\.weight' \[32, 64\] "
     r"needs \[1, 1\]"),
    (lambda t: t.__setitem__("layers.1.ffn.experts.2.w2.scale", np.zeros((64, 2), np.uint8)),
     r"scale 'layers\.1\.ffn\.experts\.2\.w2\.scale' has shape \[64, 2\]; fp4 weight .* \[64, 32\] needs \[64, 1\]"),
    (lambda t: t["layers.1.attn.wo_b.scale"].view(np.uint8).__setitem__((0, 0), 255),
     r"scale 'layers\.1\.attn\.wo_b\.scale' holds the E8M0 NaN byte 255"),
    (lambda t: t.pop("layers.0.ffn.shared_experts.w2.scale"),
     r"quantised tensor 'layers\.0\.ffn\.shared_experts\.w2\.weight' \(F8_E4M3\) has no scale"),
    (lambda t: t.update({"layers.0.ffn.gate.weight": np.zeros((4, 64), ml_dtypes.float8_e4m3fn),
                         "layers.0.ffn.gate.scale": np.full((1, 1), 127, np.uint8)}),
     r"tensor 'layers\.0\.ffn\.gate\.weight' is quantised \(F8_E4M3\), but the format keeps it in BF16/F32"),
    (lambda t: t["layers.0.attn.wkv.weight"].view(np.uint8).__setitem__((3, 5), 0x7F),
     r"tensor 'layers\.0\.attn\.wkv\.weight' holds E4M3 NaN codes"),
    (lambda t: t.__setitem__("layers.0.attn.wq_b.scale", np.full((1, 1), 3.0, np.float32)),
     r"scale 'layers\.0\.attn\.wq_b\.scale' \(F32\) holds \[3\.0\]: E8M0 scales are powers of two"),
    (lambda t: t.__setitem__("layers.0.ffn.gate.tid2eid", t["layers.0.ffn.gate.tid2eid"].astype(np.float32) + 0.7),
     r"tensor 'layers\.0\.ffn\.gate\.tid2eid' \(float32\) holds non-integer expert ids \[[0-9.]+7"),
    (lambda t: t.__setitem__("head.weight", np.ones((48, 64), np.int32)),
     r"linear weight 'head\.weight' has integer dtype I32"),
])
def test_bad_checkpoints_refused_naming_the_tensor(qdir, edit, match):
    rewrite(qdir, edit)
    with pytest.raises(CheckpointError, match=match):
        load_hf(str(qdir))


def test_fp4_odd_width_refused(tmp_path):
    """An FP4 tensor packs two inputs a byte: experts of an odd width cannot be stored."""
    cfg = dataclasses.replace(SMALL, moe_intermediate_size=33)
    d = tmp_path / "m"
    write_random(str(d), SMALL, 3, dtype="fp8", naming="deepseek")
    with open(d / "config.json") as f:
        c = json.load(f)
    c["moe_intermediate_size"] = cfg.moe_intermediate_size
    with open(d / "config.json", "w") as f:
        json.dump(c, f)
    with pytest.raises(CheckpointError, match=r"'layers\.0\.ffn\.experts\.w2' has shape \[4, 64, 32\], expected "
                                              r"\[4, 64, 33\]: an FP4 tensor packs two inputs a byte, and its width 33 "
                                              r"is odd"):
        load_hf(str(d))


@pytest.mark.parametrize("qc,match", [
    ({"weight_block_size": [64, 64]}, r"weight_block_size \[64, 64\] not supported; expected \[128, 128\]"),
    ({"fmt": "e5m2"}, r"quantization_config\.fmt 'e5m2' not supported"),
    ({"quant_method": "gptq"}, r"quant_method 'gptq' not supported"),
])
def test_unsupported_quantization_config_refused(qdir, qc, match):
    with open(qdir / "config.json") as f:
        c = json.load(f)
    c["quantization_config"].update(qc)
    with open(qdir / "config.json", "w") as f:
        json.dump(c, f)
    with pytest.raises(CheckpointError, match=match):
        load_hf(str(qdir))
    with pytest.raises(ConfigError, match=r"expert_dtype 'int2'"):
        V4Config.from_hf(dict(c, quantization_config=None, expert_dtype="int2"))


def test_large_tensors_stream_from_the_files_when_uploaded(qdir, monkeypatch):
    """Past EAGER_BYTES a tensor stays Lazy until its param is uploaded (the host never holds the
    whole checkpoint); the model then computes what the eagerly read one does, and a bad value in
    a lazy tensor is refused when it is read, naming the file's tensor."""
    from dsv4_vk.model import checkpoint, tensor_files
    eager = Model.load(str(qdir))
    x = eager.prefill([1, 2, 3, 4, 5])
    monkeypatch.setattr(checkpoint, "EAGER_BYTES", 64)
    cfg, w = load_hf(str(qdir))
    assert isinstance(w["embed.weight"], tensor_files.Lazy) and isinstance(w["layers.0.ffn.experts.w13"].codes,
                                                                         tensor_files.Lazy)
    lazy = Model(cfg, w)
    assert isinstance(lazy.params["head.weight"], tensor_files.Lazy)          # the model keeps no host copy
    assert np.array_equal(lazy.prefill([1, 2, 3, 4, 5]), x)
    rewrite(qdir, lambda t: t["layers.1.attn.wo_b.weight"].view(np.uint8).__setitem__((2, 3), 0xFF))
    cfg, w = load_hf(str(qdir))                       # not read yet
    with pytest.raises(CheckpointError, match=r"tensor 'layers\.1\.attn\.wo_b\.weight' holds E4M3 NaN codes"):
        Model(cfg, w)
    rewrite(qdir, lambda t: t["head.weight"].view(np.uint16).__setitem__((1, 1), 0x7F80))      # BF16 +inf
    with pytest.raises(CheckpointError, match=r"tensor 'head\.weight' holds non-finite values"):
        Model.load(str(qdir))


def test_lazy_tensors_are_read_once_unmapped_and_never_dequantised(qdir, monkeypatch):
    """Model.load streams a checkpoint: each byte of a lazy tensor is read from its file once,
    straight into the upload's chunk (no memory map stays open: mapped pages count in the process's
    resident memory, so a mapped checkpoint ends up resident whole), expert stacks are never joined
    on the host, and no QuantWeight is widened to floats on the host."""
    from dsv4_vk.model import checkpoint, tensor_files
    monkeypatch.setattr(checkpoint, "EAGER_BYTES", 64)
    reads: list = []
    mapped: list = []
    read = tensor_files.FILES.read

    def counted(fn, key, dt, lo, out):
        reads.append((key, lo, out.size))
        with open("/proc/self/maps") as f:
            mapped.extend(line for line in f if str(qdir) in line)
        return read(fn, key, dt, lo, out)

    def widened(self, *args, **kwargs):
        raise AssertionError(f"{self!r} dequantised on the host")

    def loaded(self):
        raise AssertionError(f"{self!r} read whole on the host")

    monkeypatch.setattr(tensor_files.FILES, "read", counted)
    monkeypatch.setattr(tensor_files.QuantWeight, "__array__", widened)
    cfg, w = load_hf(str(qdir))
    lazy = {t.spans[0].key: t.nbytes for k, a in w.items()
            for t in ((a.codes, a.scale) if tensor_files.is_quant(a) else (a,))
            if isinstance(t, tensor_files.Lazy) and len(t.spans) == 1}
    assert lazy and any(isinstance(a.codes, tensor_files.Lazy) and len(a.codes.spans) > 1
                        for a in w.values() if tensor_files.is_quant(a))       # a stack of experts
    monkeypatch.setattr(tensor_files.Lazy, "load", loaded)
    Model(cfg, w)
    got: dict = {}
    for key, lo, n in sorted(reads):
        assert got.get(key, 0) == lo, f"{key}: bytes from {lo} read twice or skipped"
        got[key] = lo + n
    assert {k: got.get(k) for k in lazy} == lazy            # each whole, once
    assert not mapped, mapped[:3]


def test_the_moedec_step_names_the_staged_expert_knobs(device):
    """tools/gpu_session.sh's moedec step runs flash-43 with decode variants that tools/model_gpu_bench.py
    reads as the staged expert kernels' knobs (its short names), each a value their lowering takes."""
    import importlib.util
    import re
    spec = importlib.util.spec_from_file_location("model_gpu_bench", os.path.join(ROOT, "tools", "model_gpu_bench.py"))
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with open(os.path.join(ROOT, "tools", "gpu_session.sh")) as f:
        step = re.search(r"\n\s*moedec\)(.*?);;", f.read(), re.S)
    assert step is not None
    variants = bench.parse_variants(re.search(r'--variants \\\s*"([^"]*)"', step.group(1)).group(1))
    names = {k for _, sets in variants for k in sets}
    assert names == {"mul_mat_id.x_shared_heavy_first", "mul_mat_id.x_shared_route_groups", "mul_mat_id.x_shared_lanes",
                     "mul_mat_id.x_shared_sum_rows"}
    for _, sets in variants:
        with tuned({"mul_mat_id.x_shared": True, **sets}):
            staged_sum_launch(device, R=7)          # (a value the knobs refuse raises here)


def test_load_bench_reports_the_loading_process_own_peak_rss(tmp_path):
    """model_gpu_bench --load's peak RSS is the loading child's own (its VmHWM): a child's ru_maxrss
    starts at its parent's RSS (Linux keeps the high-water mark across fork and exec), so the
    bench's weights held in memory showed as the load's."""
    import importlib.util
    from dsv4_vk.model.synthetic import random_weights
    spec = importlib.util.spec_from_file_location("model_gpu_bench", os.path.join(ROOT, "tools", "model_gpu_bench.py"))
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    held = np.ones(768 << 20, np.uint8)             # touched: in this process's RSS
    cfg = V4Config()
    out = bench.load_speed(cfg, random_weights(cfg, 0), str(tmp_path / "m"))
    assert 0 < out["rss_before_load_bytes"] <= out["peak_rss_bytes"] < held.nbytes, out


def test_load_progress_is_reported_for_large_loads():
    import io
    out = io.StringIO()
    p = checkpoint_progress(out)
    p(1 << 30, 4 << 30)
    p(4 << 30, 4 << 30)
    text = out.getvalue()
    assert "loading weights: 1.1 / 4.3 GB (25%)" in text and "(100%)" in text and "GB/s" in text


def checkpoint_progress(stream):
    from dsv4_vk.model.checkpoint import LoadProgress
    return LoadProgress(min_bytes=1, every=0.0, stream=stream)


def test_device_bytes_stay_within_the_checkpoints(qdir):
    """Weights keep the published precision on the device: ≤ 1.15 × the checkpoint's bytes."""
    m = Model.load(str(qdir))
    mem = m.memory()["weights"]
    ckpt = os.path.getsize(qdir / "model.safetensors")
    assert sum(mem.values()) <= 1.15 * ckpt, (mem, ckpt)
    assert mem["fp4"] > 0 and mem["fp8"] > 0 and mem["e8m0"] > 0 and "f32" in mem


# --- the model against transformers ---------------------------------------------------------------------

def check_fixture(name, fused, chunk=16):
    """Prefill the prompt, then every forced decode token; logits against transformers'."""
    d = os.path.join(FIX, f"dsv4_{name}")
    e = np.load(os.path.join(d, "expected.npz"))
    m = Model.load(d, fused=fused, prefill_chunk=chunk, max_ctx=64)
    assert any(isinstance(a, QuantWeight) for a in m.params.values())
    errs = logits_errors(m, e)
    assert len(errs) == len(e["prompt"]) + len(e["decode"]) and len(e["decode"]) >= 16
    assert max(errs) <= 1e-6, f"{name} fused={fused}: NMSE per position {errs}"
    paths = {p.path for p in m.paths()}
    assert (paths == {"unfused"}) if fused is False else ("unfused" not in paths)
    return max(errs)


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_logits_match_transformers(name, fused):
    check_fixture(name, fused)


def test_staged_kernels_in_the_model_match_too(tune):
    """The staged GEMV and expert kernels (knobs gemv_quant.x_shared, mul_mat_id.x_shared) where
    they apply in the published layout's model: logits against transformers'."""
    tune({"gemv_quant.x_shared": True, "mul_mat_id.x_shared": True})
    check_fixture("fp8", True)
    tune({"shared.fused": False})                       # FP4 routed and FP8 shared experts apart
    check_fixture("fp8", True)


def test_staged_expert_knobs_in_the_model_match_too(tune):
    """The staged experts with the SwiGLU's last route first and the sum's routes in groups (their partials in
    the graph's scratch), the lanes knob set (the fixture's rows, one uvec4 of codes, keep 1 lane), in the
    published layout's model: logits against transformers'."""
    tune({"mul_mat_id.x_shared": True, "mul_mat_id.x_shared_heavy_first": True,
          "mul_mat_id.x_shared_route_groups": 2, "mul_mat_id.x_shared_lanes": 4})
    check_fixture("fp8", True)


def test_shared_expert_in_its_own_dispatches_matches_too(tune, monkeypatch):
    """The FP8 shared expert run apart from the FP4 routed ones (four MUL_MAT_IDs a layer, not two)."""
    tune({"shared.fused": False})
    check_fixture("fp8", True)


def worker():
    """Subprocess entry: kernels and fixtures at this process's subgroup size."""
    from dsv4_vk.vk import default_device
    print(f"worker: subgroup size {default_device().subgroup_size}")
    kernel_checks(np.random.default_rng(7))
    with tuned({"gemv_quant.rows": 2, "mul_mat_id.rows": 2}):
        check_mul_mat(np.random.default_rng(8))
        check_mul_mat_id(np.random.default_rng(9))
    with tuned({"gemv_quant.load": 16, "mul_mat_id.load": 16}):
        check_mul_mat(np.random.default_rng(10))
        check_mul_mat_id(np.random.default_rng(11))
        check_shared_expert_in_the_same_dispatch(np.random.default_rng(12))
    dev = default_device()
    cpu_caps = dev.caps
    with tuned({"gemv_quant.x_shared": True, "gemv_quant.x_shared_groups": 2, "mul_mat_id.x_shared": True,
                "mul_mat_id.x_shared_groups": 2}):
        check_staged_gemv(np.random.default_rng(13))
        check_staged_experts(np.random.default_rng(15))
        dev.caps = dataclasses.replace(cpu_caps, type="discrete-gpu")     # lane clusters of this subgroup size
        try:
            check_staged_gemv(np.random.default_rng(14), dev)
            with tuned({"gemv_quant.x_shared_lanes": dev.caps.subgroup.min_size // 2, "gemv_quant.x_shared_rows": 4,
                        "gemv_quant.x_shared_one_scale": True}):
                check_staged_gemv(np.random.default_rng(21), dev)     # several clusters a subgroup
            check_staged_experts(np.random.default_rng(16), dev)
            check_shared_expert_in_the_same_dispatch(np.random.default_rng(17), dev)
            with tuned({"mul_mat_id.x_shared_split": 4, "mul_mat_id.x_shared_rows": 1}):
                check_staged_experts(np.random.default_rng(19), dev)
                check_shared_expert_in_the_same_dispatch(np.random.default_rng(20), dev)
            with tuned({"mul_mat_id.x_shared_route_groups": 2, "mul_mat_id.x_shared_heavy_first": True,
                        "mul_mat_id.x_shared_lanes": 4}):
                check_staged_experts(np.random.default_rng(21), dev, shapes=STAGED_EXPERT_SHAPES[1:3])
                check_staged_experts(np.random.default_rng(22), dev, {"sum": True}, ODD_N_SHAPES)
                check_shared_expert_in_the_same_dispatch(np.random.default_rng(23), dev)
        finally:
            dev.caps = cpu_caps
    print("worker: kernels ok")
    for name in FIXTURES:
        for fused in (True, False):
            print(f"worker: {name} fused={fused} worst nmse {check_fixture(name, fused, chunk=7):.3g} ok")


@pytest.mark.parametrize("width,subgroup", [(128, 4), (512, 16)])
def test_other_subgroup_sizes(width, subgroup):
    out = worker_output(__file__, width, timeout=900)
    assert f"worker: subgroup size {subgroup}" in out and "worker: kernels ok" in out, out
    for name in FIXTURES:
        for fused in (True, False):
            assert f"worker: {name} fused={fused} worst nmse" in out, out


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    {"worker": worker}[sys.argv[1]]()


@pytest.mark.parametrize("dtype,limit", [("fp8", 160 << 10), (np.float32, 600 << 10)])
def test_expert_stacks_past_the_binding_limit_are_split(dtype, limit, monkeypatch, device):
    """An expert stack larger than maxStorageBufferRange becomes parts, each bound alone (the
    pipeline refuses any binding past the limit); the logits stay the reference's."""
    from dsv4_vk.model import V4Reference, random_weights
    from dsv4_vk.model.checkpoint import dequantized
    cfg = dataclasses.replace(SMALL, n_routed_experts=16, moe_intermediate_size=256)
    limits = dataclasses.replace(device.caps.limits, max_storage_buffer_range=limit)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=limits))
    w = random_weights(cfg, 2, dtype)
    m = Model(cfg, w, device=device)
    parts = [n for n in m.params if ".ffn.w13." in n or ".ffn.w2." in n]
    assert "layers.1.ffn.w13.2" in parts and "layers.1.ffn.w13" not in m.params, parts
    assert all(p.nbytes <= limit for p in m.ex.params.values())
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 12)
    want = V4Reference(cfg, dequantized(w, np.float64)).forward(ids)
    got = np.concatenate([m.prefill(ids[:9], all_logits=True)] + [m.step(int(t), output="logits")[None]
                                                                  for t in ids[9:]])
    # (a device with matrix units, with coopmat.auto on, multiplies the prompt's bf16 linears in fp16:
    # docs/tensor_cores.md)
    assert nmse(got, want) <= (1e-10 if coopmat_unavailable(device) or not COOPMAT["auto"] else 1e-6)


def test_fp8_routed_experts_stack_with_the_shared_expert(device):
    """FP8 routed experts share the FP8 shared expert's layout: one stack of E + 1 experts (the
    shared one last) per weight, whose logits are the reference's (it was stacked on a new axis
    and refused)."""
    from dsv4_vk.model import V4Reference, random_weights
    from dsv4_vk.model.checkpoint import dequantized
    w = random_weights(SMALL, 2, "fp8", experts="fp8")
    m = Model(SMALL, w, device=device)
    assert "layers.0.ffn.shared.w13" not in m.params and m.params["layers.0.ffn.w13"].shape[0] == 5
    ids = np.random.default_rng(0).integers(0, SMALL.vocab_size, 6)
    want = V4Reference(SMALL, dequantized(w, np.float64)).forward(ids)
    assert nmse(m.prefill(ids, all_logits=True), want) <= 1e-10


@pytest.mark.parametrize("dtype", ["fp8", np.float32])
def test_arrays_in_memory_stream_as_they_upload_directly(dtype, monkeypatch, device):
    """Large arrays in memory (STREAM_BYTES) are streamed by the upload's threads, as lazy ones are:
    the device holds the same bytes as set_param puts there (the same logits)."""
    from dsv4_vk.model import random_weights, tensor_files
    w = random_weights(SMALL, 4, dtype)
    ids = [3, 1, 4, 1, 5]
    want = Model(SMALL, w, device=device).prefill(ids, all_logits=True)
    monkeypatch.setattr(tensor_files, "STREAM_BYTES", 0)
    from dsv4_vk.core.executor import Executor
    streamed = []
    monkeypatch.setattr(Executor, "stream_param", lambda self, name, *a, sp=Executor.stream_param, **kw:
                        (streamed.append(name), sp(self, name, *a, **kw))[1])
    m = Model(SMALL, w, device=device)
    assert np.array_equal(m.prefill(ids, all_logits=True), want)
    assert "embed.weight" in streamed and "layers.1.ffn.w13" in streamed
    assert not {"step.pos", "step.token", "sampler.cfg"} & set(streamed)    # per-step values: set_param's mapped ones


def test_info_names_the_decode_kernels(monkeypatch, device):
    """`info` says which one-token GEMV FP8 weights get, INDEX_SCORE's kernel and TOPK's settings at
    V4's widths, each with its reason: the word loads and the cluster kernel on a CPU device; the
    staged GEMV (4 rows a cluster at [4096, 4096]) and the entry kernel on a GPU whose 48 KiB of shared
    memory holds q; a GPU without that room keeps the cluster kernel, naming the bytes."""
    from dsv4_vk.cli import info
    rep = info.report(device)
    human = info._human(rep)
    if device.caps.is_cpu:
        assert rep["gemv_quant"]["kernel"] == "word loads" and "CPU devices" in rep["gemv_quant"]["reason"]
        assert rep["index_score"]["kernel"] == "cluster" and rep["topk"]["scan"] == "groups"
    assert f"MUL_MAT       one token over FP8 [4096, 4096]: {rep['gemv_quant']['kernel']}" in human
    assert f"INDEX_SCORE   64 heads × 128: {rep['index_score']['kernel']} — " in human
    assert f"TOPK          k 512: workgroup {rep['topk']['workgroup']}, {rep['topk']['bits']}-bit digits" in human
    limits = dataclasses.replace(device.caps.limits, max_shared_memory=48 * 1024)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, type="discrete-gpu", limits=limits))
    rep = info.report(device)
    assert rep["gemv_quant"]["kernel"] == "staged" and rep["gemv_quant"]["rows"] == 4
    assert rep["index_score"]["kernel"] == "entry" and "33088 B" in rep["index_score"]["reason"]
    limits = dataclasses.replace(device.caps.limits, max_shared_memory=32 * 1024)
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, limits=limits))
    rep = info.report(device)
    assert rep["index_score"] == {"heads": 64, "head_dim": 128, "kernel": "cluster", "reason":
                                  "a cluster of lanes an entry: q and wt need 33088 B of shared memory, the device "
                                  "has 32768 B"}
