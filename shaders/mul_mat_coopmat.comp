#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: W_BF16 | W_F16 ; - | CM_NV ; - | VEC4
// MUL_MAT on 16-bit matrix units: d[b0, b1, t, n] = Σ_k x[b0, b1, t, k] · w[b0, b1, n, k] (x @ wᵀ) for
// bf16 / f16 weights (W_BF16 / W_F16, weights.glsl) and f32 x, with fp16 products accumulated in f32.
// x, w, d are strided 4-D views as in mul_mat.comp (same push block; broadcast batch dims stride 0).
//
// Range. fp16 holds 2⁻²⁴..65504, f32 activations and bf16 weights much more, so every row is scaled
// by a power of two before it is rounded to fp16: a row of x (one token, all of K) by 2^sx, a row of
// w (one output, all of K) by 2^sw, with sx = min(15 − e, 126) where 2^(e−1) ≤ m < 2^e, m the row's
// largest finite |value| (its exponent field: m·2^sx < 2¹⁵ ≤ 65504, so no finite value overflows,
// and values down to m·2⁻²⁹ stay normal fp16, 11 significant bits). A power of two is exact; the
// only rounding is fp16's (2⁻¹¹ relative; bf16 weights in range convert exactly). The product
// Σ (x·2^sx)(w·2^sw) ≤ K·2³⁰ is accumulated in f32 and multiplied back by 2^−(sx+sw) in f32 (two
// exact power-of-two factors, each within f32's normal range). inf and NaN are left out of m: they
// stay inf / NaN through the scale and give the f32 path's inf / NaN outputs.
//
// Layout: workgroup g → batch (b0, b1), token tile t0 = BM·i, output tile n0 = BN·j (output tiles
// fastest); NW = (BM / WM)·(BN / WN) groups of 32 invocations ("warps"), warp w computing tokens
// WM·(w / (BN/WN)) .. +WM−1 and outputs WN·(w % (BN/WN)) .. +WN−1 of the tile as (WM/16)·(WN/16)
// 16 × 16 f32 accumulators. Steps:
//   1. scales: the invocations that stage a row in step 2 scan it over all of K (chunk i % (BK/KC)
//      of every step, the next step's loads in flight while a step is compared), a shared atomicMax
//      of each one's max |value| (f32 bits of a non-negative float order as uints), then sh[row] =
//      the row's shift.
//   2. per BK-deep k step: invocation i stages KC consecutive k (chunk i % (BK/KC); KC = 4 with
//      -D VEC4: K % 4 == 0, k contiguous, x rows 16-byte and w rows 8-byte aligned, one vec4 / uvec2
//      load each; else 2, scalar loads at any strides) of rows i / (BK/KC) + RS·r (RS = NW·32 /
//      (BK/KC)) of x and w, scaled and rounded to fp16, into xs [BM][XS], ws [BN][XS] (XS = BK + 8
//      halves a row: 16-byte-aligned rows on distinct banks; k past K: 0); barrier; the next step's
//      chunks are loaded into registers (in flight during the products); each warp multiplies its
//      16 × 16 tiles BK/16 times; barrier.
//   3. epilogue, tile by tile: each warp's accumulator to its 16 × 16 f32 scratch (cst), barrier, lane
//      l of warp w stores elements l + 32·m (row (l + 32m) / 16, column (l + 32m) % 16), unscaled;
//      rows past T and outputs past N are not stored (loads clamp them to the last row).
//   -D CM_NV: the products by VK_NV_cooperative_matrix (16 × 16 × 16 fp16 · fp16 + f32, subgroup
//     scope, 32-lane subgroups, full subgroups): A from xs row-major, B from ws column-major
//     (B(k, n) = ws[n·XS + k]); warp w is subgroup gl_SubgroupID.
//   without: the same staging (fp16 bits, packHalf2x16 pairs) and epilogue with the products formed by
//     FMA loops, lane l of warp w holding the elements l + 32·m of each of its tiles (any device:
//     the kernel's data flow and rounding, for tests).
// Spec constants: 0 workgroup size (NW·32), 1 BM, 2 BN, 3 WM, 4 WN (multiples of 16; BM % WM ==
// BN % WN == 0), 5 BK (a multiple of 16; BK/KC divides NW·32 and RS divides BM and BN).
// Push: as mul_mat.comp's (ne0, ne1, T, N, K, then offset and 4 strides of x, w, d).
#include "common.glsl"
#if defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
layout(binding = 0) readonly buffer X { float x[]; };
#if defined(VEC4)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#endif
layout(binding = 2) writeonly buffer D { float d[]; };
layout(push_constant) uniform P {
    uint ne0, ne1, T, N, K;
    uint x_off, x_s0, x_s1, x_s2, x_s3;
    uint w_off, w_s0, w_s1, w_s2, w_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
} p;
#define W_S3 p.w_s3
#include "weights.glsl"

layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint WM = 32;
layout(constant_id = 4) const uint WN = 64;
layout(constant_id = 5) const uint BK = 32;
const uint NWN = BN / WN;                       // warps along the outputs
const uint NW = (BM / WM) * NWN;                // warps a workgroup
const uint TI = WM / 16u, TJ = WN / 16u;        // 16 × 16 tiles of a warp
const uint XS = BK + 8u;                        // halves between staged rows
#if defined(VEC4)
const uint KC = 4u;                             // consecutive k an invocation loads and stages
#else
const uint KC = 2u;
#endif
const uint KP = BK / KC;                        // chunks of KC a row a step
const uint RS = NW * 32u / KP;                  // rows staged at once
const uint XR = BM / RS, WR = BN / RS;          // x and w rows an invocation stages

#if defined(CM_NV)
shared float16_t xs[BM * XS], ws[BN * XS];
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
void stage(bool is_w, uint i, vec4 v) {         // halves i .. i + KC − 1 (i a multiple of KC)
    [[unroll]] for (uint c = 0u; c < KC; ++c) {
        if (is_w) ws[i + c] = float16_t(v[c]);
        else xs[i + c] = float16_t(v[c]);
    }
}
#else
shared uint xs[BM * XS / 2u], ws[BN * XS / 2u];  // fp16 pairs (packHalf2x16: k even in the low half)
void stage(bool is_w, uint i, vec4 v) {
    [[unroll]] for (uint c = 0u; c < KC / 2u; ++c) {
        uint h = packHalf2x16(vec2(v[2u * c], v[2u * c + 1u]));
        if (is_w) ws[i / 2u + c] = h;
        else xs[i / 2u + c] = h;
    }
}
#endif
shared uint mx[BM + BN];                        // rows' largest finite |value| (f32 bits)
shared int sh[BM + BN];                         // rows' shifts: x rows 0..BM−1, then w rows
shared float cst[NW * 256u];                    // a 16 × 16 f32 scratch per warp (epilogue)

uint x_row(uint b0, uint b1, uint t) { return p.x_off + b0 * p.x_s0 + b1 * p.x_s1 + min(t, p.T - 1u) * p.x_s2; }
uint w_row(uint b0, uint b1, uint n) { return p.w_off + b0 * p.w_s0 + b1 * p.w_s1 + min(n, p.N - 1u) * p.w_s2; }

// x[k .. k + KC − 1] of the row at xb and w's of the row at wb (0 past K). VEC4: K % 4 == 0, rows 16-byte
// (x) and 8-byte (w) aligned, k contiguous: one vec4 and one uvec2 load.
vec4 x_chunk(uint xb, uint k) {
#if defined(VEC4)
    return k < p.K ? x4[(xb + k) / 4u] : vec4(0.0);
#else
    return vec4(k < p.K ? x[xb + k * p.x_s3] : 0.0, k + 1u < p.K ? x[xb + (k + 1u) * p.x_s3] : 0.0, 0.0, 0.0);
#endif
}
vec4 w_chunk(uint wb, uint k) {
#if defined(VEC4)
    return k < p.K ? W4_ROW(wb, k / 4u) : vec4(0.0);
#else
    return vec4(k < p.K ? W1_ROW(wb, k) : 0.0, k + 1u < p.K ? W1_ROW(wb, k + 1u) : 0.0, 0.0, 0.0);
#endif
}
float pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23); }     // 2^e, −126 ≤ e ≤ 127
float finite_abs(float v) {                     // |v|, or 0 for inf / NaN
    float a = abs(v);
    return a <= uintBitsToFloat(0x7F7FFFFFu) ? a : 0.0;
}
float finite_max(vec4 v) { return max(max(finite_abs(v.x), finite_abs(v.y)), max(finite_abs(v.z), finite_abs(v.w))); }
int row_shift(float m) {                        // min(15 − e, 126), 2^(e−1) ≤ m < 2^e (m finite ≥ 0)
    return min(15 - (int(floatBitsToUint(m) >> 23) - 126), 126);
}

void main() {
    uint n_tiles = (p.N + BN - 1u) / BN, t_tiles = (p.T + BM - 1u) / BM;
    uint g = flat_group();                      // uniform per workgroup: no early return inside
    if (g >= p.ne0 * p.ne1 * t_tiles * n_tiles) return;
    uint n0 = (g % n_tiles) * BN, r = g / n_tiles;
    uint t0 = (r % t_tiles) * BM; r /= t_tiles;
    uint b1 = r % p.ne1, b0 = r / p.ne1;
    uint id = gl_LocalInvocationID.x, warp = id / 32u, lane = id % 32u;

    // 1. the rows' scales. Invocation (kc, r0) stages chunk kc of every step of the rows r0 + RS·i (x,
    // then w: RS divides BM) in step 2, and scans the same chunks here, a step's chunks of all its rows
    // loaded while the previous step's are compared (as many loads in flight as step 2 has).
    uint kc = id % KP, r0 = id / KP;
    uint xb[XR], wb[WR];
    vec4 xv[XR], wv[WR];
    float xmax[XR], wmax[WR];
    [[unroll]] for (uint i = 0u; i < XR; ++i) {
        xb[i] = x_row(b0, b1, t0 + r0 + RS * i);
        xv[i] = x_chunk(xb[i], KC * kc);
        xmax[i] = 0.0;
    }
    [[unroll]] for (uint i = 0u; i < WR; ++i) {
        wb[i] = w_row(b0, b1, n0 + r0 + RS * i);
        wv[i] = w_chunk(wb[i], KC * kc);
        wmax[i] = 0.0;
    }
    for (uint i = id; i < BM + BN; i += NW * 32u) mx[i] = 0u;
    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
        uint kn = k0 + BK + KC * kc;            // the next step's chunks (0 past K)
        vec4 xnext[XR], wnext[WR];
        [[unroll]] for (uint i = 0u; i < XR; ++i) xnext[i] = x_chunk(xb[i], kn);
        [[unroll]] for (uint i = 0u; i < WR; ++i) wnext[i] = w_chunk(wb[i], kn);
        [[unroll]] for (uint i = 0u; i < XR; ++i) { xmax[i] = max(xmax[i], finite_max(xv[i])); xv[i] = xnext[i]; }
        [[unroll]] for (uint i = 0u; i < WR; ++i) { wmax[i] = max(wmax[i], finite_max(wv[i])); wv[i] = wnext[i]; }
    }
    barrier();                                  // (mx cleared)
    [[unroll]] for (uint i = 0u; i < XR; ++i) atomicMax(mx[r0 + RS * i], floatBitsToUint(xmax[i]));
    [[unroll]] for (uint i = 0u; i < WR; ++i) atomicMax(mx[BM + r0 + RS * i], floatBitsToUint(wmax[i]));
    barrier();
    for (uint i = id; i < BM + BN; i += NW * 32u) sh[i] = row_shift(uintBitsToFloat(mx[i]));
    barrier();

    // 2. the products, BK inputs a step
#if defined(CM_NV)
    uint wc = gl_SubgroupID;                    // this subgroup's warp tile
    uint wt = (wc / NWN) * WM, wn = (wc % NWN) * WN;
    MAT_C acc[TI * TJ];
    [[unroll]] for (uint a = 0u; a < TI * TJ; ++a) acc[a] = MAT_C(0.0);
#else
    uint wt = (warp / NWN) * WM, wn = (warp % NWN) * WN;
    float acc[TI * TJ][8];
    for (uint a = 0u; a < TI * TJ; ++a) for (uint m = 0u; m < 8u; ++m) acc[a][m] = 0.0;
#endif
    // this invocation's rows r0 + RS·i: their scales, and the chunks of the next step, loaded before
    // the products of this one (in flight meanwhile)
    float xf[XR], wf[WR];
    [[unroll]] for (uint i = 0u; i < XR; ++i) {
        xf[i] = pow2(sh[r0 + RS * i]);
        xv[i] = x_chunk(xb[i], KC * kc);
    }
    [[unroll]] for (uint i = 0u; i < WR; ++i) {
        wf[i] = pow2(sh[BM + r0 + RS * i]);
        wv[i] = w_chunk(wb[i], KC * kc);
    }
    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
        [[unroll]] for (uint i = 0u; i < XR; ++i) stage(false, (r0 + RS * i) * XS + KC * kc, xv[i] * xf[i]);
        [[unroll]] for (uint i = 0u; i < WR; ++i) stage(true, (r0 + RS * i) * XS + KC * kc, wv[i] * wf[i]);
        barrier();
        uint kn = k0 + BK + KC * kc;            // the next step's chunks (0 past K)
        [[unroll]] for (uint i = 0u; i < XR; ++i) xv[i] = x_chunk(xb[i], kn);
        [[unroll]] for (uint i = 0u; i < WR; ++i) wv[i] = w_chunk(wb[i], kn);
#if defined(CM_NV)
        [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
            MAT_A a[TI];
            [[unroll]] for (uint i = 0u; i < TI; ++i) coopMatLoadNV(a[i], xs, (wt + 16u * i) * XS + kk, XS, false);
            [[unroll]] for (uint j = 0u; j < TJ; ++j) {
                MAT_A b;                        // column-major: B(k, n) at n·XS + k
                coopMatLoadNV(b, ws, (wn + 16u * j) * XS + kk, XS, true);
                [[unroll]] for (uint i = 0u; i < TI; ++i) acc[i * TJ + j] = coopMatMulAddNV(a[i], b, acc[i * TJ + j]);
            }
        }
#else
        // (loops kept rolled: lavapipe's compile time grows with the unrolled tiles)
        [[dont_unroll]] for (uint i = 0u; i < TI; ++i) [[dont_unroll]] for (uint j = 0u; j < TJ; ++j)
            [[dont_unroll]] for (uint m = 0u; m < 8u; ++m) {
                uint e = lane + 32u * m;
                uint xa = ((wt + 16u * i + e / 16u) * XS) / 2u, wa = ((wn + 16u * j + e % 16u) * XS) / 2u;
                float s = acc[i * TJ + j][m];
                for (uint q = 0u; q < BK / 2u; ++q) {          // the step's k pairs
                    vec2 xv = unpackHalf2x16(xs[xa + q]), wv = unpackHalf2x16(ws[wa + q]);
                    s = fma(xv.y, wv.y, fma(xv.x, wv.x, s));
                }
                acc[i * TJ + j][m] = s;
            }
#endif
        barrier();
    }

    // 3. epilogue: a tile at a time through the warp's scratch, unscaled, stored where in range
    uint et = (warp / NWN) * WM, en = (warp % NWN) * WN;    // (the same tile as wt, wn: warp w's)
#if defined(CM_NV)
    [[unroll]] for (uint a = 0u; a < TI * TJ; ++a) {
        coopMatStoreNV(acc[a], cst, wc * 256u, 16u, false);
#else
    [[dont_unroll]] for (uint a = 0u; a < TI * TJ; ++a) {
        [[dont_unroll]] for (uint m = 0u; m < 8u; ++m) cst[warp * 256u + lane + 32u * m] = acc[a][m];
#endif
        barrier();
        for (uint m = 0u; m < 8u; ++m) {
            uint e = lane + 32u * m;
            uint tl = et + 16u * (a / TJ) + e / 16u, nl = en + 16u * (a % TJ) + e % 16u;
            uint t = t0 + tl, n = n0 + nl;
            int s = sh[tl] + sh[BM + nl];       // −226..252: two factors 2^−(s/2), 2^−(s − s/2) in range
            float v = cst[warp * 256u + e] * pow2(-(s / 2)) * pow2(-(s - s / 2));
            if (t < p.T && n < p.N) d[p.d_off + b0 * p.d_s0 + b1 * p.d_s1 + t * p.d_s2 + n * p.d_s3] = v;
        }
        barrier();
    }
}
