#version 450
#extension GL_GOOGLE_include_directive : require
// HC_MIX_REDUCE: the second pass of the mixes, one invocation per (t, j): Σ over the G partials
// [T, G, M + 1] (as hc_mix_token.comp and its siblings write them), then the norm:
// mix[t, j] = Σ dot / sqrt(Σ Σx² / (4·D) + norm_eps).
// Spec constants: 0 workgroup size, 1 M (a multiple of 4, ≤ 24).
// Push: T, G, 1/(4·D), norm_eps, partials (offset, token and split strides), out (offset, token and
//   row strides).
#include "hc_mix_common.glsl"

layout(binding = 0) restrict readonly buffer Part { float part[]; };
layout(binding = 1) restrict writeonly buffer Mix { float mix_out[]; };
layout(push_constant) uniform P {
    uint T, G;
    float inv_k, norm_eps;
    uint p_off, p_st, p_sg;
    uint o_off, o_st, o_sj;
} p;

void main() {
    uint i = flat_index();
    if (i >= p.T * M) return;
    uint t = i / M, j = i % M;
    uint b = p.p_off + t * p.p_st;
    // RG splits' loads issued before any is added, into RG independent chains: the partials of a
    // token are few (T·G·(M + 1) floats) and the invocations few, so the time is the number of
    // dependent load trips (fewer than with 4 loads a trip on the H200)
    const uint RG = 16u;
    vec4 d[RG / 4u], ss[RG / 4u];
    [[unroll]] for (uint q = 0u; q < RG / 4u; ++q) { d[q] = vec4(0.0); ss[q] = vec4(0.0); }
    uint g = 0u;
    for (; g + RG <= p.G; g += RG) {
        float dv[RG], sv[RG];
        [[unroll]] for (uint q = 0u; q < RG; ++q) {
            uint o = b + (g + q) * p.p_sg;
            dv[q] = part[o + j];
            sv[q] = part[o + M];
        }
        [[unroll]] for (uint q = 0u; q < RG / 4u; ++q) {
            d[q] += vec4(dv[4u * q], dv[4u * q + 1u], dv[4u * q + 2u], dv[4u * q + 3u]);
            ss[q] += vec4(sv[4u * q], sv[4u * q + 1u], sv[4u * q + 2u], sv[4u * q + 3u]);
        }
    }
    for (; g + 4u <= p.G; g += 4u) {           // the rest: 4 a trip, then one (constant indices only:
        uvec4 o = b + (g + uvec4(0u, 1u, 2u, 3u)) * p.p_sg;      // an array indexed in a loop may live
        d[0] += vec4(part[o.x + j], part[o.y + j], part[o.z + j], part[o.w + j]);    // in local memory)
        ss[0] += vec4(part[o.x + M], part[o.y + M], part[o.z + M], part[o.w + M]);
    }
    for (; g < p.G; ++g) {
        d[0].x += part[b + g * p.p_sg + j];
        ss[0].x += part[b + g * p.p_sg + M];
    }
    vec4 dt = (d[0] + d[1]) + (d[2] + d[3]), st = (ss[0] + ss[1]) + (ss[2] + ss[3]);
    mix_out[p.o_off + t * p.o_st + j * p.o_sj] = ((dt.x + dt.y) + (dt.z + dt.w)) /
        sqrt(((st.x + st.y) + (st.z + st.w)) * p.inv_k + p.norm_eps);
}
