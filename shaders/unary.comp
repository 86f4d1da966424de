#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: OP_FILL | OP_SCALE | OP_SIGMOID | OP_EXP | OP_COPY
// Elementwise unary op d = f(a) over 4-D strided views; FILL has no input.
// Layout: one invocation per output element, flat index over the padded 4-D output shape;
// workgroup size = specialization constant 0; grid folded into y (common.glsl).
// Variants (-D): OP_SCALE (a*s + t), OP_SIGMOID, OP_EXP, OP_COPY (CONT), OP_FILL (d = s).
#include "common.glsl"
layout(local_size_x_id = 0) in;
#if !defined(OP_FILL)
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) buffer D { float d[]; };
#else
layout(binding = 0) buffer D { float d[]; };
#endif
layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s0, a_s1, a_s2, a_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    float s, t;
} p;

void main() {
    uint i = flat_index();
    if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
    uvec4 c = unravel4(i, p.ne0, p.ne1, p.ne2, p.ne3);
#if defined(OP_FILL)
    float r = p.s;
#else
    float x = a[at4(c, p.a_off, p.a_s0, p.a_s1, p.a_s2, p.a_s3)];
#if defined(OP_SCALE)
    float r = x * p.s + p.t;
#elif defined(OP_SIGMOID)
    float r = 1.0 / (1.0 + exp(-x));
#elif defined(OP_EXP)
    float r = exp(x);
#elif defined(OP_COPY)
    float r = x;
#else
#error "define OP_SCALE, OP_SIGMOID, OP_EXP, OP_COPY or OP_FILL"
#endif
#endif
    d[at4(c, p.d_off, p.d_s0, p.d_s1, p.d_s2, p.d_s3)] = r;
}
