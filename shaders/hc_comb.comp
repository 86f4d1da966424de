#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
//! variants: SG16 | ROWS4 ; - | COEFS
// HC_COMB: per token, comb = Sinkhorn(softmax_dst(mix[8:24]·scale[2] + base[8:24]) + eps), the
// exact order of docs/hc_math.md: 1 column normalisation, then n_iter−1 × (rows, columns). Every
// iteration stays in registers; reductions are subgroup shuffles; no shared memory, no barrier.
//
// Variants (-D):
//   SG16  — one token's 4×4 in 16 consecutive lanes, k = lane & 15 = dst + 4·src. Row sums
//           (over dst) are shuffleXor 1, 2; column sums (over src) shuffleXor 4, 8. Needs a full
//           subgroup of ≥ 16 lanes (the host guarantees it; a smaller one would shuffle garbage,
//           so the kernel writes NaN instead). Workgroup (spec 0) = 4·subgroup size.
//   ROWS4 — 4 lanes per token, lane & 3 = src holds row c[src][0..3] as a vec4 (hc_math.glsl,
//           shared with the whole-site kernel). Softmax and row sums are in-register; column sums
//           are the vec4 rows of lanes src ^ 1, 2, 3 (three shuffles at once). Works at any subgroup
//           size ≥ 4 (multiple of 4).
//           Workgroup (spec 0) = 64.
// Lane → token: (gl_SubgroupID·gl_SubgroupSize + lane) / lanes-per-token, so a token's lanes are
// always inside one subgroup. Lanes past the last token compute on zero logits (every lane takes
// part in every shuffle: no early return) and do not store.
// -D COEFS (with either variant; whole-site fusion): the output is coefs [T,24] laid out like the
//   mixes — pre gates 0..3 = sigmoid(mix·scale[0] + base) + eps, post gates 4..7 =
//   2·sigmoid(mix·scale[1] + base), comb 8..23 — so one dispatch replaces comb and 8 gate nodes.
// Push: T, n_iter, eps, element offsets and strides of mixes[T,24], scale[3], base[24], comb[T,4,4]
// (with COEFS: the comb part of coefs), then offset and stride of the gates (COEFS only).
#include "common.glsl"
#include "hc_math.glsl"
layout(binding = 0) readonly buffer Mix { float mixes[]; };
layout(binding = 1) readonly buffer Scale { float scale[]; };
layout(binding = 2) readonly buffer Base { float base[]; };
layout(binding = 3) writeonly buffer Comb { float comb[]; };
layout(push_constant) uniform P {
    uint T, n_iter;
    float eps;
    uint m_off, m_st, m_sj;
    uint s_off, s_s;
    uint b_off, b_s;
    uint c_off, c_st, c_ss, c_sd;
    uint g_off, g_sj;
} p;

#define QNAN uintBitsToFloat(0x7FC00000u)

float logit(uint t, uint k) {   // comb logit of flat index k = dst + 4·src
    return mixes[p.m_off + t * p.m_st + (8u + k) * p.m_sj] * scale[p.s_off + 2u * p.s_s]
         + base[p.b_off + (8u + k) * p.b_s];
}

// gate j of token t: pre (j < 4) or post (4 ≤ j < 8), the unfused chain's formulas
float gate(uint t, uint j) {
    return hc_gate(mixes[p.m_off + t * p.m_st + j * p.m_sj], scale[p.s_off + (j >> 2) * p.s_s],
                   base[p.b_off + j * p.b_s], j < 4u, p.eps);
}

void store_gate(uint t, uint j) {
#if defined(COEFS)
    comb[p.g_off + t * p.c_st + j * p.g_sj] = gate(t, j);
#endif
}

#if defined(SG16)
float row_sum(float v) { v += subgroupShuffleXor(v, 1u); return v + subgroupShuffleXor(v, 2u); }
float col_sum(float v) { v += subgroupShuffleXor(v, 4u); return v + subgroupShuffleXor(v, 8u); }

void main() {
    uint lane = gl_SubgroupInvocationID;
    uint slot = gl_SubgroupID * gl_SubgroupSize + lane;
    uint t = flat_group() * (gl_WorkGroupSize.x / 16u) + slot / 16u;
    uint k = slot & 15u;    // = lane & 15 at ≥ 16 lanes; below, every element still gets its NaN
    bool live = t < p.T;
    float l = live ? logit(t, k) : 0.0;
    float m = max(l, subgroupShuffleXor(l, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    float e = exp(l - m);
    float c = e / row_sum(e) + p.eps;
    c /= col_sum(c) + p.eps;
    for (uint it = 1u; it < p.n_iter; ++it) {
        c /= row_sum(c) + p.eps;
        c /= col_sum(c) + p.eps;
    }
    if (gl_SubgroupSize < 16u) c = QNAN;    // never silent garbage
    if (live) comb[p.c_off + t * p.c_st + (k >> 2) * p.c_ss + (k & 3u) * p.c_sd] = c;
    if (live && k < 8u) store_gate(t, k);
}

#elif defined(ROWS4)
void main() {
    uint lane = gl_SubgroupInvocationID;
    uint slot = gl_SubgroupID * gl_SubgroupSize + lane;
    uint t = flat_group() * (gl_WorkGroupSize.x / 4u) + slot / 4u;
    uint src = lane & 3u;
    bool live = t < p.T;
    vec4 l = vec4(0.0);
    if (live) l = vec4(logit(t, 4u * src), logit(t, 4u * src + 1u), logit(t, 4u * src + 2u), logit(t, 4u * src + 3u));
    vec4 c = hc_sinkhorn_rows4(l, p.eps, p.n_iter);
    if (gl_SubgroupSize < 4u) c = vec4(QNAN);
    if (live) {
        uint o = p.c_off + t * p.c_st + src * p.c_ss;
        comb[o] = c.x;
        comb[o + p.c_sd] = c.y;
        comb[o + 2u * p.c_sd] = c.z;
        comb[o + 3u * p.c_sd] = c.w;
        store_gate(t, src);
        store_gate(t, src + 4u);
    }
}
#else
#error "define SG16 or ROWS4"
#endif
