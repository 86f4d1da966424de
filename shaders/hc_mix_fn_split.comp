#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: VEC4
// HC_MIX_FN_SPLIT: fn [M, 4·D] split once per call into TCR's B elements (hc_mix_tcr.comp): fp16 hi
// and lo parts (hc_mix_split.glsl, σ = 1) as packHalf2x16 words, in the order each lane of
// hc_mix_tcr.comp loads them — one 16-byte word a lane, fn tile and 16-chunk step — following the
// device's element layout (spec constants 2–4, hc_mix_tcr_layout.glsl); rows past M are zeros.
// Spec constants: 0 workgroup size (128), 1 M (a multiple of 4, ≤ 24), 2–4 TCR_AH, TCR_AF, TCR_BF.
// Push: as hc_mix_token.comp (X unused; out in uvec4 words).
#include "hc_mix_common.glsl"
// restrict: bindings never alias within a dispatch, so loads may be hoisted and batched (latency)
layout(binding = 0) restrict readonly buffer X { VEC x[]; };
layout(binding = 1) restrict readonly buffer Fn { VEC fn[]; };
layout(binding = 2) restrict writeonly buffer Out { uvec4 out_u[]; };
layout(push_constant) uniform P {
    uint T, chunks, slice, G;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_s2;
    uint tb;                                   // (tokens per workgroup in the kernels of many tokens)
} p;

#if !defined(VEC4)
#error "TC stages whole vec4 chunks"
#endif
const uint BT = 64;                             // tokens per block
const uint KC = 16;                             // chunks (vec4) of one stream per step
const uint XS = 4u * KC + 8u;                   // halves between staged rows
#include "hc_mix_split.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require

#include "hc_mix_tcr_layout.glsl"

// fn as TCR's B elements, split into fp16 hi and lo once per call, so that
// TCR's lanes load them (one uvec4 a lane, fn tile and step) instead of splitting fn in every
// workgroup. Invocation i = ((step·4 + j)·3 + n)·32 + lane, step a 64-float step of the 4·D columns
// (stream step / (chunks / 16)): B element e of lane 4g + q is row k = g + 8·(B_F(e) >> 1), column
// 2q + (B_F(e) & 1) of fn tile n, i.e. float (g & 1) + 2·(B_F(e) >> 1) of chunk 4·(g / 2) + j of fn row
// 8n + 2q + (B_F(e) & 1) (zero past M). Push as the other variants: chunks, G = steps, fn (offset, row
// stride), out offset (in uvec4).
void main() {
    uint i = flat_index();
    if (i >= p.G * 384u) return;
    uint lane = i & 31u, n = (i >> 5u) % 3u, j = (i / 96u) & 3u, step = i / 384u;
    uint gq = lane >> 2u, q = lane & 3u;
    uint per = p.chunks / 16u, s = step / per;
    uint c = s * p.chunks + (step % per) * 16u + 4u * (gq >> 1u) + j;
    vec4 f[2];
    [[unroll]] for (uint r = 0u; r < 2u; ++r) {
        uint row = 8u * n + 2u * q + r;
        f[r] = row < M ? fn[p.f_off + row * p.f_sj + c] : vec4(0.0);
    }
    bool odd = (gq & 1u) == 1u;                 // w[2·(k is g + 8) + (column is odd)]
    vec4 w = odd ? vec4(f[0].y, f[1].y, f[0].w, f[1].w) : vec4(f[0].x, f[1].x, f[0].z, f[1].z);
    vec4 h, l;
    split16(w, 1.0, h, l);
    out_u[p.o_off + i] = uvec4(packHalf2x16(vec2(h[B_F(0u)], h[B_F(1u)])), packHalf2x16(vec2(h[B_F(2u)], h[B_F(3u)])),
                               packHalf2x16(vec2(l[B_F(0u)], l[B_F(1u)])), packHalf2x16(vec2(l[B_F(2u)], l[B_F(3u)])));
}
