#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: VEC4 ; CM_TT=1 | CM_TT=2 | CM_TT=4 ; - | CM_NV CM_N=8
// HC_MIX_TCR, the mixes of many tokens on fp16 tensor cores at fp32 accuracy without staging (TCR;
// partials as hc_mix_token.comp writes them; VEC4 only): x split in registers straight into the
// elements of the A matrices; fn split once per call by hc_mix_fn_split.comp into the B elements,
// in the order the lanes load them.
// With -D CM_NV on VK_NV_cooperative_matrix's 16 × 8 × 16 fp16 shape. Lane l = 4g + q holds, of a
// 16 × 16 A, rows g, g + 8 and columns 2q, 2q+1, 2q+8, 2q+9; of a 16 × 8 B, rows g, g + 8 and columns
// 2q, 2q+1 (as the H200 has them); which element is which the device probe (hc_mix_probe.comp,
// hc.tcr.tcr_layout) reads and spec constants 2–4 carry (hc_mix_tcr_layout.glsl). A sum over k is the
// same in any order of k, so the logical columns 2q, 2q+1, 2q+8, 2q+9 take the 4 floats of one vec4
// chunk (4q + j of a 16-chunk step, j the 16-deep product): each lane loads whole chunks of x, 4
// lanes 256 contiguous bytes of a token per step; B's rows gq, gq + 8 are then floats of the chunks
// 4·(gq / 2) + j of its two fn rows.
// Without CM_NV the same elements go through shared memory and FMA loops (32-invocation groups stand
// in for the subgroups): the kernel's data flow and arithmetic on any device, for tests.
// Layout: workgroup g → token block g / G and split g % G of `slice` chunks per stream; 4 groups of 32
// invocations, each TT (CM_TT) tiles of 16 tokens; tb = 64·TT tokens a workgroup.
// Range: x·2⁻⁸ must fit fp16: |x| beyond 2²⁴ overflows the hi part (that token's mixes infinite or NaN).
// Spec constants: 0 workgroup size (128), 1 M (a multiple of 4, ≤ 24), 2–4 TCR_AH, TCR_AF, TCR_BF.
// Push: as hc_mix_token.comp, then zero (0 at run time: tcr_split's read-back).
#include "hc_mix_common.glsl"
// restrict: bindings never alias within a dispatch, so loads may be hoisted and batched (latency)
layout(binding = 0) restrict readonly buffer X { VEC x[]; };
layout(binding = 1) restrict readonly buffer Fn { uvec4 fnp[]; };     // fn split by hc_mix_fn_split.comp
layout(binding = 2) restrict writeonly buffer Out { float out_[]; };
layout(push_constant) uniform P {
    uint T, chunks, slice, G;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_s2;
    uint tb;                                   // (tokens per workgroup in the kernels of many tokens)
    uint zero;                                 // 0 (tcr_split)
} p;

#if !defined(VEC4)
#error "TC stages whole vec4 chunks"
#endif
const uint BT = 64;                             // tokens per block
const uint KC = 16;                             // chunks (vec4) of one stream per step
const uint XS = 4u * KC + 8u;                   // halves between staged rows
#include "hc_mix_split.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#if defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif

#include "hc_mix_tcr_layout.glsl"

const uint TT = CM_TT;
const uint TW = 64u * TT;                       // tokens per workgroup
shared float ct[TW * 24u];                      // C1 + 2⁻¹¹·C2: [token][24]
shared float sq[TW];
#if defined(CM_NV)
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>
#else
// the emulation's matrices: per 32-invocation group A (hi, lo) of each tile, B (hi, lo) of each fn tile
// (hi, lo) as one packHalf2x16 word: the rounding to fp16 the matrices' elements have
shared uint ea[4u * TT * 256u], eb[4u * 3u * 128u];
#endif
// x·σ split into fp16 hi and lo = (x·σ − hi)·2¹¹ as packHalf2x16 words (floats 0, 1 | 2, 3): hi is the
// conversion's own rounding, read back through p.zero (0 at run time) so that the compiler cannot fold
// f32(f16(a)) to a (the trouble that makes split16 round by integer arithmetic). About 5 operations a float against split16's 12 and its two
// conversions; the products see the same hi + 2⁻¹¹·lo to fp32's rounding. Where hi is an fp16
// subnormal (|x| < 2⁻⁶) the read-back must agree with the matrices' reading of the same bits: both
// keep subnormals on the H200.
void tcr_split(vec4 v, out uvec2 hb, out uvec2 lb) {
    vec4 a = v * X_SIGMA;
    hb = uvec2(packHalf2x16(a.xy), packHalf2x16(a.zw));
    vec4 hi = vec4(unpackHalf2x16(hb.x ^ p.zero), unpackHalf2x16(hb.y ^ p.zero));
    vec4 lo = (a - hi) * LO;
    lb = uvec2(packHalf2x16(lo.xy), packHalf2x16(lo.zw));
}
void main() {
    uint g = flat_group();
    uint block = g / p.G, split = g % p.G;
    uint lane = gl_LocalInvocationID.x & 31u, grp = gl_LocalInvocationID.x >> 5u;
    uint gq = lane >> 2u, q = lane & 3u;
    uint tl0 = grp * 16u * TT;                  // this group's first token in the workgroup's block
    uint t0 = block * TW + tl0;
    uint c_begin = split * p.slice, c_end = min(c_begin + p.slice, p.chunks);
    uint n_ss = (c_end - c_begin) / 16u;        // 16-chunk steps per stream (the launch checks divisibility)
#if defined(CM_NV)
    MAT_C c1[TT][3], c2[TT][3];
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint n = 0u; n < 3u; ++n) {
        c1[tt][n] = MAT_C(0.0);
        c2[tt][n] = MAT_C(0.0);
    }
#else
    float c1[TT][3][4], c2[TT][3][4];
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint n = 0u; n < 3u; ++n)
        [[unroll]] for (uint e = 0u; e < 4u; ++e) { c1[tt][n][e] = 0.0; c2[tt][n][e] = 0.0; }
#endif
    float ssq[TT][2];
    uint xrow[TT][2];
    bool xlive[TT][2];
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint h = 0u; h < 2u; ++h) {
        uint t = t0 + 16u * tt + gq + 8u * h;
        xlive[tt][h] = t < p.T;
        xrow[tt][h] = p.x_off + min(t, p.T - 1u) * p.x_st;
        ssq[tt][h] = 0.0;
    }
    for (uint s = 0u; s < 4u; ++s) {
        for (uint ss = 0u; ss < n_ss; ++ss) {
            uint cb = c_begin + 16u * ss + 4u * q;
            vec4 xv[TT][2][4];
            [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint h = 0u; h < 2u; ++h)
                [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                    vec4 v = x[xrow[tt][h] + s * p.x_ss + cb + j];
                    xv[tt][h][j] = xlive[tt][h] ? v : vec4(0.0);
                }
            // B's elements of this lane, split by hc_mix_fn_split.comp: fp16 (hi of elements 0, 1; hi 2, 3; lo 0, 1; lo 2, 3)
            uvec4 fv[4][3];
            uint fb = p.f_off + (s * (p.chunks / 16u) + c_begin / 16u + ss) * 384u + lane;
            [[unroll]] for (uint j = 0u; j < 4u; ++j) [[unroll]] for (uint n = 0u; n < 3u; ++n)
                fv[j][n] = fnp[fb + (j * 3u + n) * 32u];
            [[unroll]] for (uint j = 0u; j < 4u; ++j) {
#if defined(CM_NV)
                MAT_B bh[3], bl[3];
#else
                barrier();                      // the previous step's products have read ea, eb
#endif
                [[unroll]] for (uint n = 0u; n < 3u; ++n) {
                    uvec4 b = fv[j][n];
#if defined(CM_NV)
                    f16vec2 h01 = unpackFloat2x16(b.x), h23 = unpackFloat2x16(b.y);
                    f16vec2 l01 = unpackFloat2x16(b.z), l23 = unpackFloat2x16(b.w);
                    bh[n][0] = h01.x; bh[n][1] = h01.y; bh[n][2] = h23.x; bh[n][3] = h23.y;
                    bl[n][0] = l01.x; bl[n][1] = l01.y; bl[n][2] = l23.x; bl[n][3] = l23.y;
#else
                    vec4 h = vec4(unpackHalf2x16(b.x), unpackHalf2x16(b.y)), l = vec4(unpackHalf2x16(b.z), unpackHalf2x16(b.w));
                    [[unroll]] for (uint e = 0u; e < 4u; ++e) {          // B element e: (k, column)
                        uint k = gq + 8u * (B_F(e) >> 1u), col = 2u * q + (B_F(e) & 1u);
                        eb[(grp * 3u + n) * 128u + k * 8u + col] = packHalf2x16(vec2(h[e], l[e]));
                    }
#endif
                }
                [[unroll]] for (uint tt = 0u; tt < TT; ++tt) {
                    vec4 a0 = xv[tt][0][j], a1 = xv[tt][1][j];
                    ssq[tt][0] += dot(a0, a0);
                    ssq[tt][1] += dot(a1, a1);
                    uvec2 hb[2], lb[2];
                    tcr_split(a0, hb[0], lb[0]);
                    tcr_split(a1, hb[1], lb[1]);
                    // element e: row gq + 8·A_H(e) (a0 or a1), float A_F(e) of its chunk
#if defined(CM_NV)
                    MAT_A mh, ml;
                    [[unroll]] for (uint e = 0u; e < 8u; ++e) {
                        mh[e] = unpackFloat2x16(hb[A_H(e)][A_F(e) >> 1u])[A_F(e) & 1u];
                        ml[e] = unpackFloat2x16(lb[A_H(e)][A_F(e) >> 1u])[A_F(e) & 1u];
                    }
                    [[unroll]] for (uint n = 0u; n < 3u; ++n) {
                        if (8u * n >= M) break;
                        c1[tt][n] = coopMatMulAddNV(mh, bh[n], c1[tt][n]);
                        c2[tt][n] = coopMatMulAddNV(mh, bl[n], c2[tt][n]);
                        c2[tt][n] = coopMatMulAddNV(ml, bh[n], c2[tt][n]);
                    }
#else
                    [[unroll]] for (uint e = 0u; e < 8u; ++e) {
                        vec2 h = unpackHalf2x16(hb[A_H(e)][A_F(e) >> 1u]), l = unpackHalf2x16(lb[A_H(e)][A_F(e) >> 1u]);
                        ea[(grp * TT + tt) * 256u + (gq + 8u * A_H(e)) * 16u + 2u * q + KK(A_F(e))] =
                            packHalf2x16(vec2(h[A_F(e) & 1u], l[A_F(e) & 1u]));
                    }
#endif
                }
#if !defined(CM_NV)
                barrier();
                [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint n = 0u; n < 3u; ++n) {
                    if (8u * n >= M) break;
                    [[unroll]] for (uint e = 0u; e < 4u; ++e) {           // C element e: (row, column)
                        uint row = gq + 8u * (e >> 1u), col = 2u * q + (e & 1u);
                        uint oa = (grp * TT + tt) * 256u + row * 16u, ob = (grp * 3u + n) * 128u + col;
                        for (uint k = 0u; k < 16u; ++k) {
                            vec2 xa = unpackHalf2x16(ea[oa + k]), fb = unpackHalf2x16(eb[ob + k * 8u]);
                            c1[tt][n][e] = fma(xa.x, fb.x, c1[tt][n][e]);
                            c2[tt][n][e] = fma(xa.y, fb.x, fma(xa.x, fb.y, c2[tt][n][e]));
                        }
                    }
                }
#endif
            }
        }
    }
    // epilogue: C1, C2 to shared memory ([token][24]), Σx² summed over the 4 lanes of a row
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) {
        uint r = (tl0 + 16u * tt) * 24u;
        [[unroll]] for (uint n = 0u; n < 3u; ++n) {
#if defined(CM_NV)
            MAT_C c = c1[tt][n] + c2[tt][n] * float(1.0 / LO);
            coopMatStoreNV(c, ct, r + 8u * n, 24u, false);
#else
            [[unroll]] for (uint e = 0u; e < 4u; ++e)
                ct[r + (gq + 8u * (e >> 1u)) * 24u + 8u * n + 2u * q + (e & 1u)] = c1[tt][n][e] + c2[tt][n][e] * (1.0 / LO);
#endif
        }
        [[unroll]] for (uint h = 0u; h < 2u; ++h) {
            float v = ssq[tt][h];
            v += subgroupShuffleXor(v, 1u);     // the 4 lanes of a row: aligned within any subgroup ≥ 4
            v += subgroupShuffleXor(v, 2u);
            if (q == 0u) sq[tl0 + 16u * tt + gq + 8u * h] = v;
        }
    }
    barrier();
    for (uint i = gl_LocalInvocationID.x; i < TW * (M + 1u); i += gl_WorkGroupSize.x) {
        uint tl = i / (M + 1u), j = i % (M + 1u), t = block * TW + tl;
        if (t >= p.T) continue;
        float v = j < M ? ct[tl * 24u + j] / X_SIGMA : sq[tl];
        out_[p.o_off + t * p.o_st + split * p.o_s2 + j] = v;
    }
}
