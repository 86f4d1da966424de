#version 450
#extension GL_GOOGLE_include_directive : require
// STORE_AT: dst[index[0] + i] = src[i] (i < n, i32 words; positions outside dst are skipped), then
// index[0] += advance. The building block of multi-step decode: a graph recorded K times back to
// back reads a device-side counter (the position) and stores each repetition's result at it, then
// advances it, so the repetitions differ without anything re-recorded or written by the host.
// Layout: ONE workgroup; invocation i copies element i (then i + WG, ...); a barrier orders every
// read of the index before invocation 0 advances it.
// Push: n, dst length, src (offset, stride), index offset, dst (offset, stride), advance (int).
#include "common.glsl"
layout(binding = 0) readonly buffer S { int src[]; };
layout(binding = 1) buffer I { int index_[]; };
layout(binding = 2) buffer D { int dst[]; };
layout(push_constant) uniform P {
    uint n, n_dst;
    uint s_off, s_s;
    uint i_off;
    uint d_off, d_s;
    int advance;
} p;

void main() {
    int base = index_[p.i_off];
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += gl_WorkGroupSize.x) {
        int at = base + int(i);
        if (at >= 0 && uint(at) < p.n_dst) dst[p.d_off + uint(at) * p.d_s] = src[p.s_off + i * p.s_s];
    }
    barrier();
    if (gl_LocalInvocationID.x == 0u && p.advance != 0) index_[p.i_off] = base + p.advance;
}
