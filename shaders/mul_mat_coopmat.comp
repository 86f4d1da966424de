#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: W_BF16 | W_F16 ; - | CM_NV ; - | VEC4 | VEC8
//! variants: W_BF16 | W_F16 ; ROW_SCALES ; - | VEC4 | VEC8
//! variants: W_FP8 | W_FP4 ; - | CM_NV ; - | VEC8
//! variants: W_FP8 | W_FP4 ; ROW_SCALES ; - | VEC8
//! variants: W_FP8 ; FP8_FOLD ; - | CM_NV ; - | VEC8
// MUL_MAT on 16-bit matrix units: d[b0, b1, t, n] = Σ_k x[b0, b1, t, k] · w[b0, b1, n, k] (x @ wᵀ) for
// bf16 / f16 weights (W_BF16 / W_F16, weights.glsl) or DeepSeek's FP8 / FP4 weights (W_FP8 / W_FP4,
// below) and f32 x, with fp16 products accumulated in f32. x, w, d are strided 4-D views as in
// mul_mat.comp (same push block; broadcast batch dims stride 0).
//
// Range. fp16 holds 2⁻²⁴..65504, f32 activations and bf16 weights much more, so every row is scaled
// by a power of two before it is rounded to fp16: a row of x (one token, all of K) by 2^sx, a row of
// w (one output, all of K) by 2^sw, with sx = min(15 − e, 126) where 2^(e−1) ≤ m < 2^e, m the row's
// largest finite |value| (its exponent field: m·2^sx < 2¹⁵ ≤ 65504, so no finite value overflows,
// and values down to m·2⁻²⁹ stay normal fp16, 11 significant bits). A power of two is exact; the
// only rounding is fp16's (2⁻¹¹ relative, to nearest even; bf16 weights in range convert exactly).
// The product Σ (x·2^sx)(w·2^sw) ≤ K·2³⁰ is accumulated in f32 and multiplied back by 2^−(sx+sw) in
// f32 (two exact power-of-two factors, each within f32's normal range). inf and NaN are left out of
// m: they stay inf / NaN through the scale and give the f32 path's inf / NaN outputs.
//
// Layout: workgroup g → batch (b0, b1), token tile t0 = BM·i, output tile n0 = BN·j (in groups of GM
// token tiles, token tiles fastest within a group: GM = 1 has output tiles fastest); NW = (BM / WM)·(BN / WN) groups of 32 invocations ("warps"), warp w computing tokens
// WM·(w / (BN/WN)) .. +WM−1 and outputs WN·(w % (BN/WN)) .. +WN−1 of the tile as (WM/16)·(WN/16)
// 16 × 16 f32 accumulators. Invocation i stages KC consecutive k (chunk kc = i % (BK/KC) of every
// step) of rows r0 + RS·r, r0 = i / (BK/KC), RS = NW·32 / (BK/KC), of x (then w): KC = 8 with
// -D VEC8 (K % 8 == 0, k contiguous, x and w rows 16-byte aligned: two vec4 and one uvec4 load,
// one 16-byte shared store), 4 with -D VEC4 (K % 4 == 0, x rows 16-byte and w rows 8-byte aligned),
// else 2 (scalar loads at any strides). Steps:
//   1. scales, by SCALES (spec constant 7):
//      0: each workgroup scans its own x and w rows over all of K (the invocation that stages a
//         chunk scans it, the next step's loads in flight while a step is compared), a shared
//         atomicMax of each one's max |value| (f32 bits of a non-negative float order as uints);
//      1: a first dispatch (-D ROW_SCALES, below) wrote each tile's row shifts into the tile's own
//         outputs; the workgroup reads them before it writes any output (only it writes its tile).
//   2. per BK-deep k step, into buffer s % NBUF (spec constant 6) of shared memory: the step's
//      chunks scaled, rounded to fp16 (packHalf2x16) and stored packed (X_HALF: x's as xh holds them),
//      rows of XS = BK + 8 halves (16-byte aligned, rows on distinct banks; k past K: 0), x rows then
//      w rows. Each step: barrier;
//      the next step's chunks loaded into registers (in flight during the products); each warp
//      multiplies its 16 × 16 tiles BK/16 times; with one buffer a barrier; the next step's chunks
//      stored (with two buffers into the other one, which no warp reads this step: one barrier a step).
//   3. epilogue, tile by tile: each warp's accumulator to its 16 × 16 f32 scratch (in the staging
//      memory, free after the loop), lane l of warp w stores elements l + 32·m (row (l + 32m) / 16,
//      column (l + 32m) % 16), unscaled; rows past T and outputs past N are not stored (loads clamp
//      them to the last row).
//   -D CM_NV: the products by VK_NV_cooperative_matrix (16 × 16 × 16 fp16 · fp16 + f32, subgroup
//     scope, 32-lane subgroups, full subgroups): A from x's rows row-major, B from w's rows
//     column-major (B(k, n) at row n, half k), loaded from the uvec4 staging array; warp w is
//     subgroup gl_SubgroupID.
//   without: the same staging and epilogue with the products formed by FMA loops, lane l of warp w
//     holding the elements l + 32·m of each of its tiles (any device: the kernel's data flow and
//     rounding, for tests).
// -D ROW_SCALES: the first dispatch of SCALES = 1. Workgroup g (256 invocations) takes 16 rows of the
//   list [batch][x rows 0..T−1, then w rows 0..N−1], 16 invocations a row each scanning every 16th
//   chunk; the row's shift s goes, as float(s), to every tile holding the row: x row t to slot t − t0
//   of each output tile of its token tile, w row n to slot R + n − n0 of each token tile's output tile
//   holding n (R = the tile's rows in range, C its outputs in range; slot q is output (t0 + q / C,
//   n0 + q % C)). Needs R + C ≤ R·C in every tile (R, C ≥ 2), which the launch checks.
// -D W_FP8 / W_FP4: w is the packed codes (words; w's strides and offset in words, rows whole words,
//   q_kw a row), their E8M0 scale bytes at binding 3, push fields q_kw, q_rows, q_srows, q_sc as in
//   weights.glsl; VEC8 or scalar chunks (no VEC4 variants: x rows 16-byte aligned with K % 8 != 0 take
//   the scalar ones). ROW_SCALES writes FP8 rows' folded shifts (FP8_FOLD's), which the block form
//   replaces by 0. A chunk is KC codes (KC·8 or KC·4 bits of the row, 0 past K), decoded exactly to
//   halves while staged (the codes as they are for E4M3; E2M1 times the scale, below).
//   W_FP8: w rows take no shift (every E4M3 value, 2⁻⁹..448, is a normal fp16, staged unscaled). Each
//     warp sums a 128-input block's products into a second set of accumulators (blk) and, after the
//     block's last k step, adds them to acc times the block's scale 2^(s−127) (two normal f32
//     factors): exact in f32 for any scale bytes. Needs BN | 128, BK | 128 and every tile's outputs in
//     one 128-row block row (the launch checks; tsr, the tile's first scale byte, serves all of it).
//   W_FP4: a row's shift is 140 − smax (smax its largest scale byte, found from the scale bytes by the
//     first pass or the workgroup), the chunk staged as code · 2^(27 + s − smax) · (half(code bits) =
//     code · 2⁻¹⁴): ≤ 6·2¹³, every value a normal fp16 where s ≥ smax − 26. A row spanning more is
//     flagged (shift + 4096, fold_flagged) and its outputs are summed by f32_dot (K fused multiply-adds
//     of x and the dequantised weight) in the epilogue instead.
//   W_FP8 -D FP8_FOLD: FP8 as FP4 (W_FOLD): the shift 134 − smax over the row's grid row, the chunk
//     staged as code · 2^(7 + s − smax) (≤ 448·2⁷ = 57344, normal where s ≥ smax − 12), rows spanning
//     more flagged and summed by f32_dot; one accumulator set and no tile constraint (W_BLOCK otherwise).
// X_HALF (spec constant 9, 0 or 1; with SCALES = 1 and VEC8 only, the launch sees to it): x rounded to
//   fp16 once instead of by every output tile. The first pass, once it knows an x row's shift sx, reads
//   the row again (from the cache: its 16 invocations scanned it just before) and writes it as
//   packHalf2x16(x · 2^sx), 8 halves a uvec4, to xh[batch][t][k] (k contiguous, K / 8 uvec4s a row,
//   batch = b0·ne1 + b1): the same f32 product and the same rounding the staging would apply. The main
//   dispatch then stages each x chunk as that one uvec4, unchanged (16 bytes per 8 inputs instead of 32,
//   no multiply or pack), and still reads x's row shifts from the tile's slots for the unscale; w's
//   staging, the FP8 / FP4 paths, the epilogue and f32_dot (which reads the f32 x) are as without it,
//   so the outputs are the same bit for bit. A specialization constant rather than a define: a branch on
//   it costs no SPIR-V variant (the define would double the VEC8 ones); so every variant declares xh
//   and every launch binds a buffer there (x itself where X_HALF is 0: never read).
// Bindings: 0 x (f32), 1 w, 2 d (f32), 3 w's scale bytes (W_FP8 / W_FP4), then xh (3, or 4 with
// quantised weights): X_HALF's fp16 x rows (written by ROW_SCALES, read by the main dispatch).
// Spec constants: 0 workgroup size (NW·32; 256 with ROW_SCALES), 1 BM, 2 BN, 3 WM, 4 WN (multiples
// of 16; BM % WM == BN % WN == 0), 5 BK (a multiple of 16; BK/KC divides NW·32 and RS divides BM and
// BN), 6 NBUF (1 or 2), 7 SCALES (0 or 1), 8 GM (≥ 1), 9 X_HALF (0 or 1).
// Push: as mul_mat.comp's (ne0, ne1, T, N, K, then offset and 4 strides of x, w, d).
#include "common.glsl"
#if defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
layout(binding = 0) readonly buffer X { float x[]; };
#if defined(VEC4) || defined(VEC8)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#endif
layout(binding = 2) buffer D { float d[]; };
layout(push_constant) uniform P {
    uint ne0, ne1, T, N, K;
    uint x_off, x_s0, x_s1, x_s2, x_s3;
    uint w_off, w_s0, w_s1, w_s2, w_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
#if defined(W_FP8) || defined(W_FP4)
    uint q_kw, q_rows, q_srows, q_sc;   // quantised weights' geometry (weights.glsl)
#endif
} p;
#define W_S3 p.w_s3
#define W_SCALE_BINDING 3
#include "weights.glsl"
#if defined(VEC8) && !defined(W_QUANT)
layout(binding = 1) readonly buffer W8 { uvec4 w128[]; };
#endif
#if defined(W_QUANT)
#define XH_BINDING 4
#else
#define XH_BINDING 3
#endif
#if defined(ROW_SCALES)
layout(binding = XH_BINDING) writeonly buffer XHalf { uvec4 xh[]; };    // x's rows · 2^sx as fp16 (X_HALF)
#else
layout(binding = XH_BINDING) readonly buffer XHalf { uvec4 xh[]; };
#endif

layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint WM = 32;
layout(constant_id = 4) const uint WN = 64;
layout(constant_id = 5) const uint BK = 32;
layout(constant_id = 6) const uint NBUF = 1;
layout(constant_id = 7) const uint SCALES = 0;
layout(constant_id = 8) const uint GM = 1;
layout(constant_id = 9) const uint X_HALF = 0;
#if defined(VEC8)
const uint KC = 8u;                             // consecutive k an invocation loads and stages
#elif defined(VEC4)
const uint KC = 4u;
#else
const uint KC = 2u;
#endif

uint x_row(uint b0, uint b1, uint t) { return p.x_off + b0 * p.x_s0 + b1 * p.x_s1 + min(t, p.T - 1u) * p.x_s2; }
uint w_row(uint b0, uint b1, uint n) { return p.w_off + b0 * p.w_s0 + b1 * p.w_s1 + min(n, p.N - 1u) * p.w_s2; }

// x[k .. k + KC − 1] of the row at xb and w's of the row at wb, as 8 floats (0 past K and past KC).
mat2x4 x_chunk(uint xb, uint k) {
#if defined(VEC8)
    return k < p.K ? mat2x4(x4[(xb + k) / 4u], x4[(xb + k) / 4u + 1u]) : mat2x4(0.0);
#elif defined(VEC4)
    return mat2x4(k < p.K ? x4[(xb + k) / 4u] : vec4(0.0), vec4(0.0));
#else
    return mat2x4(vec4(k < p.K ? x[xb + k * p.x_s3] : 0.0, k + 1u < p.K ? x[xb + (k + 1u) * p.x_s3] : 0.0, 0.0, 0.0),
                  vec4(0.0));
#endif
}
uvec4 pack_halves(mat2x4 v) {                   // 8 values as fp16 (round to nearest even), k even low
    return uvec4(packHalf2x16(v[0].xy), packHalf2x16(v[0].zw), packHalf2x16(v[1].xy), packHalf2x16(v[1].zw));
}
// w's chunks stay as loaded until they are staged (VEC8: the 16-bit values; quantised: the codes and,
// FP4, the chunk's scale byte; a conversion right after the load would wait for it before the products
// it should overlap)
#if defined(W_QUANT)
// W_FOLD: the scale bytes folded into per-row shifts (FP4; FP8 with -D FP8_FOLD); W_BLOCK: FP8's block
// scales applied to per-block sums
#if defined(W_FP4) || defined(FP8_FOLD) || defined(ROW_SCALES)
#define W_FOLD 1                                /* (ROW_SCALES: FP8's folded shifts, which W_BLOCK ignores) */
#else
#define W_BLOCK 1
#endif
#if defined(W_FP8)
const uint QB = 8u;                             // bits a code
#else
const uint QB = 4u;
#endif
#define W_CHUNK uvec3
uint scale_byte(uint i) { return (wscale[i >> 2] >> ((i & 3u) << 3)) & 0xFFu; }
// the codes of w[k .. k + KC − 1] of the row at word wb (code k in the lowest bits, 0 past K) in .x (and
// .y for FP8's 8 codes); W_FOLD: .z the chunk's scale byte, sr the row's first scale byte (q_scale_row)
uvec3 w_chunk(uint wb, uint sr, uint k) {
    if (k >= p.K) return uvec3(0u);
    const uint bits = KC * QB;                  // 64, 32, 16 or 8
    uint i = wb + k * QB / 32u, o = k * QB % 32u;
    uvec3 u = bits == 64u ? uvec3(wq[i], wq[i + 1u], 0u) :
              uvec3(bits == 32u ? wq[i] : (wq[i] >> o) & ((1u << bits) - 1u), 0u, 0u);
    if (k + KC > p.K) u.x &= (1u << ((p.K - k) * QB)) - 1u;   // (only KC = 2 reaches here: < 32 bits)
#if defined(W_FOLD)
    u.z = scale_byte(sr + k / Q_BC);            // (KC divides Q_BC: one scale a chunk)
#endif
    return u;
}
mat2x4 w_vals(uvec3 u) {                        // the code values · 2^−8 (E4M3) or 2^−14 (E2M1), exact
#if defined(W_FP8)
    return mat2x4(q_fp8x4(u.x), q_fp8x4(u.y));
#else
    return mat2x4(q_fp4x4(u.x), q_fp4x4(u.x >> 16));
#endif
}
#elif defined(VEC8)
#define W_CHUNK uvec4
W_CHUNK w_chunk(uint wb, uint sr, uint k) { return k < p.K ? w128[(wb + k) / 8u] : uvec4(0u); }
mat2x4 w_vals(uvec4 u) {
    return mat2x4(w_half(u.x & 0xFFFFu), w_half(u.x >> 16), w_half(u.y & 0xFFFFu), w_half(u.y >> 16),
                  w_half(u.z & 0xFFFFu), w_half(u.z >> 16), w_half(u.w & 0xFFFFu), w_half(u.w >> 16));
}
#else
#define W_CHUNK mat2x4
mat2x4 w_vals(mat2x4 v) { return v; }
mat2x4 w_chunk(uint wb, uint sr, uint k) {
#if defined(VEC4)
    return mat2x4(k < p.K ? W4_ROW(wb, k / 4u) : vec4(0.0), vec4(0.0));
#else
    return mat2x4(vec4(k < p.K ? W1_ROW(wb, k) : 0.0, k + 1u < p.K ? W1_ROW(wb, k + 1u) : 0.0, 0.0, 0.0), vec4(0.0));
#endif
}
#endif
#include "coopmat_scale.glsl"
#if defined(W_FOLD)
// A folded row's shift: its staged values are code · 2^(s − 127) · 2^sw with sw = FOLD_TOP − smax (smax
// the row's largest scale byte), i.e. half(code bits) · 2^(FOLD_EXP + s − smax). FP4: at most 6 · 2^13 =
// 49152, every nonzero value a normal fp16 (≥ 0.5 · 2^(s − smax + 13) ≥ 2^−14) where s ≥ smax − 26;
// FP8: at most 448 · 2^7 = 57344, every nonzero value normal (≥ 2^−9 · 2^(s − smax + 7)) where s ≥
// smax − 12. A row whose scale bytes span more is flagged (+ FOLD_FLAG): its outputs are summed in f32
// from the weights themselves (f32_dot).
#if defined(W_FP4)
const int FOLD_TOP = FP4_FOLD_TOP, FOLD_SPREAD = FP4_FOLD_SPREAD, FOLD_EXP = FP4_FOLD_EXP;
#else
const int FOLD_TOP = FP8_FOLD_TOP, FOLD_SPREAD = FP8_FOLD_SPREAD, FOLD_EXP = FP8_FOLD_EXP;
#endif
void scale_range(uint sr, uint j0, uint step, inout uint lo, inout uint hi) {
    for (uint j = j0; j < p.q_sc; j += step) {
        uint b = scale_byte(sr + j);
        lo = min(lo, b);
        hi = max(hi, b);
    }
}
int fold_shift(uint lo, uint hi) { return fold_shift_of(lo, hi, FOLD_TOP, FOLD_SPREAD); }
float f32_dot(uint xb, uint wb) {               // Σ_k x · w in f32, w dequantised (the f32 kernels' products)
    float acc = 0.0;
    for (uint k = 0u; k < p.K; ++k) acc = fma(x[xb + k * p.x_s3], W1_ROW(wb, k), acc);
    return acc;
}
#endif

#if defined(ROW_SCALES)
const uint RL = 16u;                            // invocations a row
const bool XH = X_HALF != 0u && KC == 8u;       // x's rows to xh as fp16 (VEC8 only)
shared uint rmx[256u / RL];
#if defined(W_FOLD)
shared uint rlo[256u / RL], rhi[256u / RL];     // FP4 w rows: their smallest and largest scale byte
#endif

void main() {
    uint id = gl_LocalInvocationID.x, rl = id / RL, lane = id % RL;
    uint rows = p.T + p.N, g = flat_group() * (256u / RL) + rl;
    bool live = g < p.ne0 * p.ne1 * rows;       // (no early return: the barrier below)
    uint r = live ? g % rows : 0u, b = live ? g / rows : 0u;
    uint b1 = b % p.ne1, b0 = b / p.ne1;
    bool is_w = r >= p.T;
    uint rb = is_w ? w_row(b0, b1, r - p.T) : x_row(b0, b1, r);
    float m = 0.0;
#if defined(W_QUANT)
    bool scan = !is_w;                          // quantised w rows: their scale bytes, below
#else
    bool scan = true;
#endif
    for (uint k = KC * lane; live && scan && k < p.K; k += 4u * RL * KC) {   // 4 chunks in flight
        mat2x4 v[4];
        [[unroll]] for (uint j = 0u; j < 4u; ++j)
            v[j] = is_w ? w_vals(w_chunk(rb, 0u, k + j * RL * KC)) : x_chunk(rb, k + j * RL * KC);
        [[unroll]] for (uint j = 0u; j < 4u; ++j) m = max(m, finite_max(v[j]));
    }
    if (lane == 0u) rmx[rl] = 0u;
#if defined(W_FOLD)
    if (lane == 0u) { rlo[rl] = 255u; rhi[rl] = 0u; }
    uint lo = 255u, hi = 0u;
    if (live && is_w) scale_range(q_scale_row(rb), lane, RL, lo, hi);
#endif
    barrier();
    atomicMax(rmx[rl], floatBitsToUint(m));
#if defined(W_FOLD)
    atomicMin(rlo[rl], lo);
    atomicMax(rhi[rl], hi);
#endif
    barrier();
    if (!live) return;
    float s = float(row_shift(uintBitsToFloat(rmx[rl])));
#if defined(W_BLOCK)
    if (is_w) s = 0.0;                          // the codes staged as they are (E4M3 fits fp16)
#elif defined(W_FOLD)
    if (is_w) s = float(fold_shift(rlo[rl], rhi[rl]));
#endif
    if (XH && !is_w) {                          // the row again (cached), scaled and rounded as stage() would
        float f = pow2(int(s));
        uint hb = (b * p.T + r) * (p.K / 8u);
        for (uint k = KC * lane; k < p.K; k += 4u * RL * KC) {   // 4 chunks in flight, as in the scan
            mat2x4 v[4];
            [[unroll]] for (uint j = 0u; j < 4u; ++j) v[j] = x_chunk(rb, k + j * RL * KC);
            [[unroll]] for (uint j = 0u; j < 4u; ++j)
                if (k + j * RL * KC < p.K) xh[hb + (k + j * RL * KC) / 8u] = pack_halves(v[j] * f);
        }
    }
    // the tiles holding the row: lanes take them in turn
    uint n_tiles = (p.N + BN - 1u) / BN, t_tiles = (p.T + BM - 1u) / BM;
    uint dbase = p.d_off + b0 * p.d_s0 + b1 * p.d_s1;
    if (!is_w) {
        uint t0 = (r / BM) * BM;
        for (uint j = lane; j < n_tiles; j += RL) {
            uint n0 = j * BN, C = min(BN, p.N - n0), q = r - t0;
            d[dbase + (t0 + q / C) * p.d_s2 + (n0 + q % C) * p.d_s3] = s;
        }
    } else {
        uint n = r - p.T, n0 = (n / BN) * BN, C = min(BN, p.N - n0);
        for (uint i = lane; i < t_tiles; i += RL) {
            uint t0 = i * BM, R = min(BM, p.T - t0), q = R + n - n0;
            d[dbase + (t0 + q / C) * p.d_s2 + (n0 + q % C) * p.d_s3] = s;
        }
    }
}
#else
const uint NWN = BN / WN;                       // warps along the outputs
const uint NW = (BM / WM) * NWN;                // warps a workgroup
const uint TI = WM / 16u, TJ = WN / 16u;        // 16 × 16 tiles of a warp
const uint XS = BK + 8u;                        // halves between staged rows
const uint XS8 = XS / 8u;                       // ... in uvec4s
const uint KP = BK / KC;                        // chunks of KC a row a step
const uint RS = NW * 32u / KP;                  // rows staged at once
const uint XR = BM / RS, WR = BN / RS;          // x and w rows an invocation stages
const uint BUF = (BM + BN) * XS;                // halves of one staging buffer (x rows, then w rows)
const uint STAGE8 = NBUF * BUF / 8u, SCRATCH8 = NW * 64u;
// the staging buffers (fp16 pairs, k even in the low half), later each warp's 16 × 16 f32 scratch
shared uvec4 smem[STAGE8 > SCRATCH8 ? STAGE8 : SCRATCH8];
shared uint mx[BM + BN];                        // rows' largest finite |value| (f32 bits)
shared int sh[BM + BN];                         // rows' shifts: x rows 0..BM−1, then w rows
const bool XH = X_HALF != 0u && KC == 8u && SCALES == 1u;   // x chunks from xh, as the first pass rounded them

#if defined(CM_NV)
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#endif

void stage(uint h, mat2x4 v) {                  // halves h .. h + KC − 1 (h a multiple of KC)
#if defined(VEC8)
    smem[h / 8u] = pack_halves(v);
#elif defined(VEC4)
    uint q = (h / 2u) % 4u;
    smem[h / 8u][q] = packHalf2x16(v[0].xy);
    smem[h / 8u][q + 1u] = packHalf2x16(v[0].zw);
#else
    smem[h / 8u][(h / 2u) % 4u] = packHalf2x16(v[0].xy);
#endif
}
// an x chunk: xh's 8 halves as they are, else the f32 values times the row's scale 2^sx
uvec4 xh_chunk(uint hb, uint k) { return k < p.K ? xh[hb + k / 8u] : uvec4(0u); }
void stage_x(uint h, mat2x4 v, uvec4 q, float f) {
    if (XH) smem[h / 8u] = q;
    else stage(h, v * f);
}
#if !defined(CM_NV)
vec2 staged_pair(uint i) { return unpackHalf2x16(smem[i / 4u][i % 4u]); }     // halves 2i, 2i + 1
#endif
void sync_warp() {                              // the warp's scratch: its own lanes only
#if defined(CM_NV)
    subgroupMemoryBarrierShared();
    subgroupBarrier();
#else
    barrier();                                  // (a warp may span several subgroups here)
#endif
}

void main() {
    uint n_tiles = (p.N + BN - 1u) / BN, t_tiles = (p.T + BM - 1u) / BM;
    uint g = flat_group();                      // uniform per workgroup: no early return inside
    if (g >= p.ne0 * p.ne1 * t_tiles * n_tiles) return;
    // the batch's tiles in groups of GM token tiles, token tiles fastest within a group (GM = 1: output
    // tiles fastest): a group's workgroups, in flight together, share its w tiles in L2
    uint tiles = t_tiles * n_tiles, r = g / tiles, tg = g % tiles;
    uint first = (tg / (GM * n_tiles)) * GM, gm = min(GM, t_tiles - first), local = tg % (GM * n_tiles);
    uint t0 = (first + local % gm) * BM, n0 = (local / gm) * BN;
    uint b1 = r % p.ne1, b0 = r / p.ne1;
    uint id = gl_LocalInvocationID.x, warp = id / 32u, lane = id % 32u;
    uint dbase = p.d_off + b0 * p.d_s0 + b1 * p.d_s1;

    uint kc = id % KP, r0 = id / KP;
    uint xb[XR], wb[WR], wsr[WR];               // rows' first element (w: word) and, FP4, first scale byte
    uint hb[XR];                                // XH: the rows' first uvec4
    mat2x4 xv[XR];
    uvec4 xq[XR];                               // XH: the x chunks as halves
    W_CHUNK wv[WR];
    [[unroll]] for (uint i = 0u; i < XR; ++i) {
        xb[i] = x_row(b0, b1, t0 + r0 + RS * i);
        hb[i] = (r * p.T + min(t0 + r0 + RS * i, p.T - 1u)) * (p.K / 8u);
        xv[i] = mat2x4(0.0);
        xq[i] = uvec4(0u);
        if (XH) xq[i] = xh_chunk(hb[i], KC * kc);
        else xv[i] = x_chunk(xb[i], KC * kc);
    }
    [[unroll]] for (uint i = 0u; i < WR; ++i) {
        wb[i] = w_row(b0, b1, n0 + r0 + RS * i);
#if defined(W_FOLD)
        wsr[i] = q_scale_row(wb[i]);
#else
        wsr[i] = 0u;
#endif
        wv[i] = w_chunk(wb[i], wsr[i], KC * kc);
    }
    // 1. the rows' scales
    if (SCALES == 0u) {
        float xmax[XR], wmax[WR];
        [[unroll]] for (uint i = 0u; i < XR; ++i) xmax[i] = 0.0;
        [[unroll]] for (uint i = 0u; i < WR; ++i) wmax[i] = 0.0;
        for (uint i = id; i < BM + BN; i += NW * 32u) mx[i] = 0u;
        for (uint k0 = 0u; k0 < p.K; k0 += BK) {
            uint kn = k0 + BK + KC * kc;        // the next step's chunks (0 past K)
            mat2x4 xnext[XR];
            W_CHUNK wnext[WR];
            [[unroll]] for (uint i = 0u; i < XR; ++i) xnext[i] = x_chunk(xb[i], kn);
#if !defined(W_QUANT)
            [[unroll]] for (uint i = 0u; i < WR; ++i) wnext[i] = w_chunk(wb[i], wsr[i], kn);
#endif
            [[unroll]] for (uint i = 0u; i < XR; ++i) { xmax[i] = max(xmax[i], finite_max(xv[i])); xv[i] = xnext[i]; }
#if !defined(W_QUANT)
            [[unroll]] for (uint i = 0u; i < WR; ++i) {
                wmax[i] = max(wmax[i], finite_max(w_vals(wv[i])));
                wv[i] = wnext[i];
            }
#endif
        }
        barrier();                              // (mx cleared)
        [[unroll]] for (uint i = 0u; i < XR; ++i) atomicMax(mx[r0 + RS * i], floatBitsToUint(xmax[i]));
        [[unroll]] for (uint i = 0u; i < WR; ++i) atomicMax(mx[BM + r0 + RS * i], floatBitsToUint(wmax[i]));
        barrier();
        for (uint i = id; i < BM + BN; i += NW * 32u) {
            int s = row_shift(uintBitsToFloat(mx[i]));
#if defined(W_BLOCK)
            if (i >= BM) s = 0;                 // the codes staged as they are (E4M3 fits fp16)
#elif defined(W_FOLD)
            if (i >= BM) {                      // the row's scale bytes
                uint lo = 255u, hi = 0u;
                scale_range(q_scale_row(w_row(b0, b1, n0 + i - BM)), 0u, 1u, lo, hi);
                s = fold_shift(lo, hi);
            }
#endif
            sh[i] = s;
        }
        [[unroll]] for (uint i = 0u; i < XR; ++i) xv[i] = x_chunk(xb[i], KC * kc);
#if !defined(W_QUANT)
        [[unroll]] for (uint i = 0u; i < WR; ++i) wv[i] = w_chunk(wb[i], wsr[i], KC * kc);
#endif
    } else {                                    // this tile's slots, as ROW_SCALES wrote them
        uint R = min(BM, p.T - t0), C = min(BN, p.N - n0);
        for (uint i = id; i < BM + BN; i += NW * 32u) {
            uint q = i < BM ? min(i, R - 1u) : R + min(i - BM, C - 1u);     // rows past the end: the last's
            sh[i] = int(d[dbase + (t0 + q / C) * p.d_s2 + (n0 + q % C) * p.d_s3]);
#if defined(W_BLOCK)
            if (i >= BM) sh[i] = 0;             // the codes staged as they are (the pass wrote the folded shift)
#endif
        }
    }
    barrier();

    // 2. the products, BK inputs a step
#if defined(CM_NV)
    uint wc = gl_SubgroupID;                    // this subgroup's warp tile
#else
    uint wc = warp;
#endif
    uint wt = (wc / NWN) * WM, wn = (wc % NWN) * WN;
#if defined(CM_NV)
    MAT_C acc[TI * TJ];
    [[unroll]] for (uint a = 0u; a < TI * TJ; ++a) acc[a] = MAT_C(0.0);
#if defined(W_BLOCK)
    MAT_C blk[TI * TJ];                         // the products of the current 128-input scale block
    [[unroll]] for (uint a = 0u; a < TI * TJ; ++a) blk[a] = MAT_C(0.0);
#endif
#else
    float acc[TI * TJ][8];
    for (uint a = 0u; a < TI * TJ; ++a) for (uint m = 0u; m < 8u; ++m) acc[a][m] = 0.0;
#if defined(W_BLOCK)
    float blk[TI * TJ][8];
    for (uint a = 0u; a < TI * TJ; ++a) for (uint m = 0u; m < 8u; ++m) blk[a][m] = 0.0;
#endif
#endif
#if defined(W_BLOCK)
#define PART blk                                /* products summed per scale block, then scaled into acc */
#else
#define PART acc
#endif
    float xf[XR];                               // this invocation's rows' scales
    [[unroll]] for (uint i = 0u; i < XR; ++i) xf[i] = pow2(sh[r0 + RS * i]);
#if defined(W_BLOCK)
#define W_STAGED(i, u) (w_vals(u) * 256.0)     /* the E4M3 values themselves */
    uint tsr = q_scale_row(w_row(b0, b1, n0));  // the tile's first scale byte (all its rows in one block row)
#elif defined(W_FOLD)
    int wtop[WR];                               // the rows' largest scale byte
    [[unroll]] for (uint i = 0u; i < WR; ++i) wtop[i] = FOLD_TOP - fold_unflag(sh[BM + r0 + RS * i]);
#define W_STAGED(i, u) (w_vals(u) * pow2(max(FOLD_EXP + int((u).z) - wtop[i], -126)))
#else
    float wf[WR];
    [[unroll]] for (uint i = 0u; i < WR; ++i) wf[i] = pow2(sh[BM + r0 + RS * i]);
#define W_STAGED(i, u) (w_vals(u) * wf[i])
#endif
    [[unroll]] for (uint i = 0u; i < XR; ++i) stage_x((r0 + RS * i) * XS + KC * kc, xv[i], xq[i], xf[i]);
    [[unroll]] for (uint i = 0u; i < WR; ++i) stage((BM + r0 + RS * i) * XS + KC * kc, W_STAGED(i, wv[i]));
    uint steps = (p.K + BK - 1u) / BK;
    for (uint s = 0u; s < steps; ++s) {
        barrier();
        uint kn = (s + 1u) * BK + KC * kc;      // the next step's chunks (0 past K)
        [[unroll]] for (uint i = 0u; i < XR; ++i) if (XH) xq[i] = xh_chunk(hb[i], kn); else xv[i] = x_chunk(xb[i], kn);
        [[unroll]] for (uint i = 0u; i < WR; ++i) wv[i] = w_chunk(wb[i], wsr[i], kn);
        uint base = (s % NBUF) * BUF;           // this step's buffer (halves)
#if defined(CM_NV)
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
            MAT_A a[TI];
            [[unroll]] for (uint i = 0u; i < TI; ++i)
                coopMatLoadNV(a[i], smem, (base + (wt + 16u * i) * XS + kk) / 8u, XS8, false);
            [[unroll]] for (uint j = 0u; j < TJ; ++j) {
                MAT_A b;                        // column-major: B(k, n) at w row n, half k
                coopMatLoadNV(b, smem, (base + (BM + wn + 16u * j) * XS + kk) / 8u, XS8, true);
                [[unroll]] for (uint i = 0u; i < TI; ++i) PART[i * TJ + j] = coopMatMulAddNV(a[i], b, PART[i * TJ + j]);
            }
        }
#else
        // (loops kept rolled: lavapipe's compile time grows with the unrolled tiles)
        [[dont_unroll]] for (uint i = 0u; i < TI; ++i) [[dont_unroll]] for (uint j = 0u; j < TJ; ++j)
            [[dont_unroll]] for (uint m = 0u; m < 8u; ++m) {
                uint e = lane + 32u * m;
                uint xa = (base + (wt + 16u * i + e / 16u) * XS) / 2u;
                uint wa = (base + (BM + wn + 16u * j + e % 16u) * XS) / 2u;
                float sum = PART[i * TJ + j][m];
                for (uint q = 0u; q < BK / 2u; ++q) {          // the step's k pairs
                    vec2 xp = staged_pair(xa + q), wp = staged_pair(wa + q);
                    sum = fma(xp.y, wp.y, fma(xp.x, wp.x, sum));
                }
                PART[i * TJ + j][m] = sum;
            }
#endif
#if defined(W_BLOCK)
        if ((s + 1u) * BK % 128u == 0u || s + 1u == steps) {      // uniform: a scale block's last step
            int e = int(scale_byte(tsr + s * BK / 128u)) - 127;    // its scale 2^e, as two normal factors
            float c1 = pow2(e / 2), c2 = pow2(e - e / 2);
#if defined(CM_NV)
            [[unroll]] for (uint a = 0u; a < TI * TJ; ++a) {
                acc[a] = acc[a] + blk[a] * c1 * c2;
                blk[a] = MAT_C(0.0);
            }
#else
            for (uint a = 0u; a < TI * TJ; ++a) for (uint m = 0u; m < 8u; ++m) {
                acc[a][m] += blk[a][m] * c1 * c2;
                blk[a][m] = 0.0;
            }
#endif
        }
#endif
        if (s + 1u < steps) {                   // uniform: the next step's chunks into its buffer
            if (NBUF == 1u) barrier();          // (one buffer: every warp done with this step)
            uint nb = ((s + 1u) % NBUF) * BUF;
            [[unroll]] for (uint i = 0u; i < XR; ++i) stage_x(nb + (r0 + RS * i) * XS + KC * kc, xv[i], xq[i], xf[i]);
            [[unroll]] for (uint i = 0u; i < WR; ++i) stage(nb + (BM + r0 + RS * i) * XS + KC * kc, W_STAGED(i, wv[i]));
        }
    }
    barrier();                                  // the staging memory becomes the warps' scratch

    // 3. epilogue: a tile at a time through the warp's scratch, unscaled, stored where in range
    uint sc = wc * 64u;                         // the warp's scratch (uvec4s)
#if defined(CM_NV)
    [[unroll]] for (uint a = 0u; a < TI * TJ; ++a) {
        coopMatStoreNV(acc[a], smem, sc, 4u, false);
#else
    [[dont_unroll]] for (uint a = 0u; a < TI * TJ; ++a) {
        [[dont_unroll]] for (uint m = 0u; m < 8u; ++m) {
            uint e = lane + 32u * m;
            smem[sc + e / 4u][e % 4u] = floatBitsToUint(acc[a][m]);
        }
#endif
        sync_warp();
        for (uint m = 0u; m < 8u; ++m) {
            uint e = lane + 32u * m;
            uint tl = wt + 16u * (a / TJ) + e / 16u, nl = wn + 16u * (a % TJ) + e % 16u;
            uint t = t0 + tl, n = n0 + nl;
#if defined(W_FOLD)
            int s = sh[tl] + fold_unflag(sh[BM + nl]);
#else
            int s = sh[tl] + sh[BM + nl];
#endif
            float v = unscale(uintBitsToFloat(smem[sc + e / 4u][e % 4u]), s);
#if defined(W_FOLD)
            if (fold_flagged(sh[BM + nl]) && t < p.T && n < p.N) v = f32_dot(x_row(b0, b1, t), w_row(b0, b1, n));
#endif
            if (t < p.T && n < p.N) d[dbase + t * p.d_s2 + n * p.d_s3] = v;
        }
        sync_warp();
    }
}
#endif
