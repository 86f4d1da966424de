#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
//! variants: - | VEC4
// HC_MIX (whole-site fusion, decode-sized T): the site's flat RMS norm and mixes mat-mul in one
// dispatch, mix[t,j] = (x_t · fn[j]) / sqrt(mean(x_t²) + norm_eps), x_t = X[t] flattened (4·D).
// Layout: one workgroup per (token, mix row): group g → t = g / m, j = g % m. Each invocation
// accumulates the dot and the sum of squares over chunks local id, +WG, ... of each of the 4
// streams (a chunk is a vec4 with -D VEC4, else one float); then subgroupAdd and one shared-memory
// step across the workgroup's subgroups (a single barrier, so no early return before it). Every
// one of a token's m workgroups recomputes the sum of squares: X is read m times, from cache,
// instead of a second dependent dispatch. Workgroup size (spec 0) ≤ 256.
// Push: T, m, chunks per stream, 1/(4·D), norm_eps, X (offset, token and stream strides), fn
// (offset, row stride; fn[j, s·D + d] is chunk s·chunks + c of row j), out (offset, strides).
#include "common.glsl"
#if defined(VEC4)
#define VEC vec4
float dot_v(vec4 a, vec4 b) { return dot(a, b); }
#else
#define VEC float
float dot_v(float a, float b) { return a * b; }
#endif
layout(binding = 0) readonly buffer X { VEC x[]; };
layout(binding = 1) readonly buffer Fn { VEC fn[]; };
layout(binding = 2) writeonly buffer Mix { float mix_out[]; };
layout(push_constant) uniform P {
    uint T, m, chunks;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_sj;
} p;

shared vec2 partial[256];       // (dot, sum of squares) per subgroup

void main() {
    uint g = flat_group();
    uint t = g / p.m, j = g % p.m;
    bool live = t < p.T;        // folded grids overshoot
    float d = 0.0, ss = 0.0;
    if (live) {
        for (uint s = 0u; s < 4u; ++s) {
            uint xb = p.x_off + t * p.x_st + s * p.x_ss;
            uint fb = p.f_off + j * p.f_sj + s * p.chunks;
            for (uint c = gl_LocalInvocationID.x; c < p.chunks; c += gl_WorkGroupSize.x) {
                VEC xv = x[xb + c];
                d += dot_v(xv, fn[fb + c]);
                ss += dot_v(xv, xv);
            }
        }
    }
    d = subgroupAdd(d);
    ss = subgroupAdd(ss);
    if (subgroupElect()) partial[gl_SubgroupID] = vec2(d, ss);
    barrier();
    if (gl_LocalInvocationID.x == 0u && live) {
        vec2 sum = vec2(0.0);
        for (uint i = 0u; i < gl_NumSubgroups; ++i) sum += partial[i];
        mix_out[p.o_off + t * p.o_st + j * p.o_sj] = sum.x / sqrt(sum.y * p.inv_k + p.norm_eps);
    }
}
