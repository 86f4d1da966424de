#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | VEC4 ; - | GATE
// HC_PRE: u[t,:] = Σ_s w[t,s] · x[t,s,:]   (x [T,4,D], w [T,4], u [T,D]).
// Layout: each workgroup covers one slice of one token: group g → token g / groups_per_token,
// chunk (g % groups_per_token)·WG + local id. A chunk is a vec4 of D (-D VEC4, when D, offsets and
// strides are multiples of 4) or one float. The 4 weights are workgroup-uniform loads (one token
// per workgroup: a broadcast/scalar load, no shared memory + barrier, which lavapipe runs slowly).
// The sum keeps the unfused chain's order ((w0·x0 + w1·x1) + w2·x2) + w3·x3.
// Push: T, chunks per token, groups per token, offsets/strides (x, u in chunk units; w in floats).
// -D GATE (HC_PRE_GATE, the three-op site): w holds the pre mixes and the weights are their
//   gates, w = sigmoid(mix·scale[0] + base[0..3]) + eps (hc_gate.glsl, as HC_COEFS forms
//   them), so that the collapse needs only the mixes and runs beside HC_COEFS instead of after it.
//   Bindings 3 scale, 4 base; push adds scale's offset, base's offset and stride, eps.
#include "common.glsl"
#if defined(GATE)
#include "hc_gate.glsl"
#endif
// Chunks per invocation (spec constant 1): a workgroup covers WG·CPT chunks, each invocation
// CPT of them strided by WG (more independent loads in flight per invocation on GPUs).
layout(constant_id = 1) const uint CPT = 1;
#if defined(VEC4)
#define VEC vec4
#else
#define VEC float
#endif
layout(binding = 0) readonly buffer X { VEC x[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) writeonly buffer U { VEC u[]; };
#if defined(GATE)
layout(binding = 3) readonly buffer Scale { float scale[]; };
layout(binding = 4) readonly buffer Base { float base[]; };
#endif
layout(push_constant) uniform P {
    uint T, n_chunks, groups_per_token;
    uint x_off, x_st, x_ss;
    uint w_off, w_st, w_ss;
    uint u_off, u_st;
#if defined(GATE)
    uint s_off, b_off, b_s;
    float eps;
#endif
} p;

// weight s of the token whose weights start at wb
float weight(uint wb, uint s) {
#if defined(GATE)
    return hc_gate(w[wb + s * p.w_ss], scale[p.s_off], base[p.b_off + s * p.b_s], true, p.eps);
#else
    return w[wb + s * p.w_ss];
#endif
}

void main() {
    uint g = flat_group();
    uint t = g / p.groups_per_token;
    if (t >= p.T) return;                      // folded grids overshoot
    uint c0 = (g % p.groups_per_token) * gl_WorkGroupSize.x * CPT + gl_LocalInvocationID.x;
    uint wb = p.w_off + t * p.w_st;
    vec4 wt = vec4(weight(wb, 0u), weight(wb, 1u), weight(wb, 2u), weight(wb, 3u));
    [[unroll]] for (uint k = 0u; k < CPT; ++k) {
        uint c = c0 + k * gl_WorkGroupSize.x;
        if (c >= p.n_chunks) return;
        uint xb = p.x_off + t * p.x_st + c;
        VEC r = wt.x * x[xb];
        r += wt.y * x[xb + p.x_ss];
        r += wt.z * x[xb + 2u * p.x_ss];
        r += wt.w * x[xb + 3u * p.x_ss];
        u[p.u_off + t * p.u_st + c] = r;
    }
}
