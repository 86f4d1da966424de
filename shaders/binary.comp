#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: OP_ADD | OP_MUL | OP_DIV
// Elementwise binary op d = a OP b over 4-D strided views (broadcasting = stride 0).
// Layout: one invocation per output element, flat index over the padded 4-D output shape;
// workgroup size = specialization constant 0; grid folded into y (common.glsl).
// Variants (-D): OP_ADD, OP_MUL, OP_DIV.
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer B { float b[]; };
layout(binding = 2) buffer D { float d[]; };
layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint a_off, a_s0, a_s1, a_s2, a_s3;
    uint b_off, b_s0, b_s1, b_s2, b_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
} p;

void main() {
    uint i = flat_index();
    if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
    uvec4 c = unravel4(i, p.ne0, p.ne1, p.ne2, p.ne3);
    float x = a[at4(c, p.a_off, p.a_s0, p.a_s1, p.a_s2, p.a_s3)];
    float y = b[at4(c, p.b_off, p.b_s0, p.b_s1, p.b_s2, p.b_s3)];
#if defined(OP_ADD)
    float r = x + y;
#elif defined(OP_MUL)
    float r = x * y;
#elif defined(OP_DIV)
    float r = x / y;
#else
#error "define OP_ADD, OP_MUL or OP_DIV"
#endif
    d[at4(c, p.d_off, p.d_s0, p.d_s1, p.d_s2, p.d_s3)] = r;
}
