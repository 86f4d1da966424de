#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: VEC4 ; - | POST ; - | CM_NV CM_N=8 | CM_NV CM_N=16
// HC_MIX_PART (and HC_POST_MIX with -D POST) on 16-bit tensor cores at fp32 accuracy (TC; many
// tokens; partials as hc_mix_token.comp writes them; VEC4 only). Only when asked for
// (MIX_TUNING["kernel"] = "tc"): its staging makes it slower than KSPLIT on the H200.
// Layout: workgroup g → token block g / G of 64 tokens and split g % G of `slice` chunks per stream;
// 128 invocations. Per step (16 chunks = 64 floats of one stream) the block's x and the M fn rows are
// staged in shared memory split into two fp16 parts, hi = v·σ on fp16's grid and lo = f16((v·σ −
// hi)·2¹¹) (σ = 2⁻⁸ for x, 1 for fn; hc_mix_split.glsl), so that x·f = 2⁸·(xhi·fhi + 2⁻¹¹·(xhi·flo +
// xlo·fhi)) up to the dropped xlo·flo (2⁻²² relative): two fp32 accumulators, C1 = Σ xhi·fhi and
// C2 = Σ (xhi·flo + xlo·fhi), each product exact. σ keeps |x| < 2²⁴ inside fp16's range; below 2⁻⁶
// the parts are subnormal, the error stays under 2⁻²⁸ absolute. Σx² is summed in fp32 while staging
// (lanes of 16 invocations per token, added in the epilogue). The staged rows are XS = 72 halves apart
// (64 + 8: consecutive rows start on different banks).
//   -D CM_NV: the products by VK_NV_cooperative_matrix, subgroup s of 4 (32 lanes) taking tokens
//     16s..16s+15 against ⌈M / CM_N⌉ tiles of CM_N fn rows (CM_N = 8 or 16, the device's shape
//     16 × CM_N × 16); the accumulators are stored to shared memory at the end.
//   without: the same staging and epilogue with the products formed by FMA loops (invocation i:
//     token i % 64, rows 12·(i / 64) + 0..11) — the kernel's arithmetic on any device, for tests.
// The epilogue writes partials[t, split, j] = 2⁸·(C1 + 2⁻¹¹·C2) and [t, split, M] = Σx². Steps run
// stream by stream (a token's 64 floats of one stream: 256 contiguous bytes). With -D POST (bindings
// and push as hc_mix_ksplit.comp -D POST) a step is instead 4 chunks of all 4 streams, so that an
// invocation makes its stream of the new X (hc_post.glsl) from the 4 residual chunks it loads,
// writes it, and stages it; the fn rows are staged in the same order (k = 16·stream + 4·chunk +
// component), so the products are the same sums.
// Spec constants: 0 workgroup size (128), 1 M (a multiple of 4, ≤ 24).
// Push: as hc_mix_ksplit.comp (tb: 64).
#include "hc_mix_common.glsl"
// restrict: bindings never alias within a dispatch, so loads may be hoisted and batched (latency)
#if defined(POST)
layout(binding = 0) restrict readonly buffer Fsub { VEC fsub[]; };
layout(binding = 3) restrict readonly buffer X { VEC x[]; };            // the residual streams
layout(binding = 4) restrict readonly buffer PostW { float postw[]; };
layout(binding = 5) restrict readonly buffer CombW { float combw[]; };
layout(binding = 6) restrict writeonly buffer Xnew { VEC xnew[]; };
#else
layout(binding = 0) restrict readonly buffer X { VEC x[]; };
#endif
layout(binding = 1) restrict readonly buffer Fn { VEC fn[]; };
layout(binding = 2) restrict writeonly buffer Out { float out_[]; };
layout(push_constant) uniform P {
    uint T, chunks, slice, G;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_s2;
    uint tb;                                   // tokens per workgroup
#if defined(POST)
    uint s_off, s_st;                          // f (the sublayer's output), in chunks
    uint pw_off, pw_st, pw_sd, cw_off, cw_st, cw_ss, cw_sd;
    uint n_off, n_st, n_sd;                    // X_new, in chunks
#endif
} p;

#if !defined(VEC4)
#error "TC stages whole vec4 chunks"
#endif
const uint BT = 64;                             // tokens per block
const uint KC = 16;                             // chunks (vec4) of one stream per step
const uint XS = 4u * KC + 8u;                   // halves between staged rows
#include "hc_mix_split.glsl"
#if defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
const uint NT = (24u + CM_N - 1u) / CM_N;       // fn row tiles (M ≤ 24)
const uint NP = NT * CM_N;                      // fn rows staged (zeros past M)
const uint CW = NP;                             // the accumulators' row width in shared memory
shared float16_t xh[BT * XS], xl[BT * XS], fh[NP * XS], fl[NP * XS];
shared float cs[2u * BT * CW + BT * KC];        // C1, C2, then the Σx² lanes
#define C1(t, j) cs[(t) * CW + (j)]
#define C2(t, j) cs[BT * CW + (t) * CW + (j)]
#define SSQ(t, l) cs[2u * BT * CW + (t) * KC + (l)]
void stage_x(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) { xh[i + e] = float16_t(hi[e]); xl[i + e] = float16_t(lo[e]); }
}
void stage_f(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) { fh[i + e] = float16_t(hi[e]); fl[i + e] = float16_t(lo[e]); }
}
#else
const uint NP = 24u, CW = 24u;
// hi and lo as one packHalf2x16 word; after the last step the epilogue's sums (as float bits)
shared uint xp[BT * XS], fp[NP * XS];
#define C1(t, j) uintBitsToFloat(xp[(t) * CW + (j)])
#define C2(t, j) uintBitsToFloat(xp[BT * CW + (t) * CW + (j)])
#define SSQ(t, l) uintBitsToFloat(xp[2u * BT * CW + (t) * KC + (l)])
void stage_x(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) xp[i + e] = packHalf2x16(vec2(hi[e], lo[e]));
}
void stage_f(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) fp[i + e] = packHalf2x16(vec2(hi[e], lo[e]));
}
#endif

#if defined(POST)
#include "hc_post.glsl"
#endif

void main() {
    uint g = flat_group();
    uint block = g / p.G, split = g % p.G;
    uint id = gl_LocalInvocationID.x;           // the workgroup is 128 invocations
    uint t_base = block * BT;
    uint c_begin = split * p.slice, c_end = min(c_begin + p.slice, p.chunks);
    // staging: invocation id takes slot id % 16 of a step for tokens id / 16 + 8·r and fn rows
    // id / 16 + 8·q; a slot is a chunk of the step's stream, or with POST stream slot / 4, chunk slot % 4
    uint lc = id % KC, lr = id / KC;
#if defined(POST)
    const uint CPS = KC / 4u;                   // chunks per step
    uint n_steps = (c_end - c_begin + CPS - 1u) / CPS;
    uint ps = lc / 4u;                          // this invocation's stream of the new X
    float pw[BT / 8u];                          // its tokens' post[t, ps] and comb[t, 0..3, ps]
    vec4 cw[BT / 8u];
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) {
        uint t = min(t_base + lr + 8u * r, p.T - 1u);
        uint cb = p.cw_off + t * p.cw_st + ps * p.cw_sd;
        pw[r] = postw[p.pw_off + t * p.pw_st + ps * p.pw_sd];
        cw[r] = vec4(combw[cb], combw[cb + p.cw_ss], combw[cb + 2u * p.cw_ss], combw[cb + 3u * p.cw_ss]);
    }
#else
    uint n_steps = 4u * ((c_end - c_begin + KC - 1u) / KC);
#endif
    float ssq[BT / 8u];
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) ssq[r] = 0.0;
#if defined(CM_NV)
    fcoopmatNV<32, gl_ScopeSubgroup, 16, CM_N> c1[NT], c2[NT];
    [[unroll]] for (uint n = 0u; n < NT; ++n) {
        c1[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, CM_N>(0.0);
        c2[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, CM_N>(0.0);
    }
    uint row0 = 16u * gl_SubgroupID;            // this subgroup's tokens in the block
#else
    uint et = id % BT, ej = 12u * (id / BT);    // this invocation's token and first fn row
    float c1[12], c2[12];
    [[unroll]] for (uint r = 0u; r < 12u; ++r) { c1[r] = 0.0; c2[r] = 0.0; }
#endif
    for (uint step = 0u; step < n_steps; ++step) {        // uniform: every invocation takes every step
#if defined(POST)
        uint s = ps, c = c_begin + step * CPS + lc % 4u;
#else
        uint per = n_steps / 4u, s = step / per, c = c_begin + (step % per) * KC + lc;
#endif
        bool in_c = c < c_end;
        [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) {
            uint t = t_base + lr + 8u * r;
            bool live = in_c && t < p.T;
#if defined(POST)
            vec4 v = vec4(0.0);
            if (live) {
                uint rb = p.x_off + t * p.x_st + c;
                v = post_stream(fsub[p.s_off + t * p.s_st + c], pw[r], cw[r], x[rb], x[rb + p.x_ss],
                                x[rb + 2u * p.x_ss], x[rb + 3u * p.x_ss]);
                xnew[p.n_off + t * p.n_st + s * p.n_sd + c] = v;
            }
#else
            vec4 v = live ? x[p.x_off + t * p.x_st + s * p.x_ss + c] : vec4(0.0);
#endif
            ssq[r] += dot(v, v);
            stage_x((lr + 8u * r) * XS + 4u * lc, v, X_SIGMA);
        }
        [[unroll]] for (uint q = 0u; q < NP / 8u; ++q) {
            uint j = lr + 8u * q;
            vec4 v = in_c && j < M ? fn[p.f_off + j * p.f_sj + s * p.chunks + c] : vec4(0.0);
            stage_f(j * XS + 4u * lc, v, 1.0);
        }
        barrier();
#if defined(CM_NV)
        [[unroll]] for (uint kk = 0u; kk < 4u * KC; kk += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ah, al;
            coopMatLoadNV(ah, xh, row0 * XS + kk, XS, false);
            coopMatLoadNV(al, xl, row0 * XS + kk, XS, false);
            [[unroll]] for (uint n = 0u; n < NT; ++n) {
                if (n * CM_N >= M) break;
                fcoopmatNV<16, gl_ScopeSubgroup, 16, CM_N> bh, bl;    // column-major: (k, j) at j·XS + k
                coopMatLoadNV(bh, fh, n * CM_N * XS + kk, XS, true);
                coopMatLoadNV(bl, fl, n * CM_N * XS + kk, XS, true);
                c1[n] = coopMatMulAddNV(ah, bh, c1[n]);
                c2[n] = coopMatMulAddNV(ah, bl, c2[n]);
                c2[n] = coopMatMulAddNV(al, bh, c2[n]);
            }
        }
#else
        for (uint k = 0u; k < 4u * KC; ++k) {
            vec2 xv = unpackHalf2x16(xp[et * XS + k]);
            [[unroll]] for (uint r = 0u; r < 12u; ++r) {
                if (ej + r >= M) break;
                vec2 fv = unpackHalf2x16(fp[(ej + r) * XS + k]);
                c1[r] = fma(xv.x, fv.x, c1[r]);
                c2[r] = fma(xv.y, fv.x, fma(xv.x, fv.y, c2[r]));
            }
        }
#endif
        barrier();
    }
    // epilogue: the accumulators and the Σx² lanes to shared memory, then one value per invocation
#if defined(CM_NV)
    [[unroll]] for (uint n = 0u; n < NT; ++n) {
        coopMatStoreNV(c1[n], cs, row0 * CW + n * CM_N, CW, false);
        coopMatStoreNV(c2[n], cs, BT * CW + row0 * CW + n * CM_N, CW, false);
    }
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) SSQ(lr + 8u * r, lc) = ssq[r];
#else
    [[unroll]] for (uint r = 0u; r < 12u; ++r) {
        xp[et * CW + ej + r] = floatBitsToUint(c1[r]);          // rows past M: zeros, never read
        xp[BT * CW + et * CW + ej + r] = floatBitsToUint(c2[r]);
    }
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) xp[2u * BT * CW + (lr + 8u * r) * KC + lc] = floatBitsToUint(ssq[r]);
#endif
    barrier();
    for (uint i = id; i < BT * (M + 1u); i += gl_WorkGroupSize.x) {
        uint tl = i / (M + 1u), j = i % (M + 1u), t = t_base + tl;
        if (t >= p.T) continue;
        float v;
        if (j < M) {
            v = (C1(tl, j) + C2(tl, j) * (1.0 / LO)) / X_SIGMA;
        } else {
            v = 0.0;
            for (uint l = 0u; l < KC; ++l) v += SSQ(tl, l);
        }
        out_[p.o_off + t * p.o_st + split * p.o_s2 + j] = v;
    }
}
