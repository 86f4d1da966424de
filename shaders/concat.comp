#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: N_INPUTS=2,3,4
// CONCAT of N_INPUTS (2..4, -D) strided 4-D views along padded axis AXIS (specialization constant 1)
// into a strided 4-D view d.
// Layout: one invocation per output element, flat index over d's padded shape; the input that
// holds it is found from the cumulative axis bounds b1..b3 (bounds of absent inputs are ~0u).
#include "common.glsl"
layout(constant_id = 1) const uint AXIS = 0;
layout(binding = 0) readonly buffer X0 { float x0[]; };
layout(binding = 1) readonly buffer X1 { float x1[]; };
#if N_INPUTS > 2
layout(binding = 2) readonly buffer X2 { float x2[]; };
#endif
#if N_INPUTS > 3
layout(binding = 3) readonly buffer X3 { float x3[]; };
#endif
layout(binding = N_INPUTS) buffer D { float d[]; };
layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    uint b1, b2, b3;
    uint src[20];           // per input: offset, stride0..3
} p;

float load(uint k, uvec4 c) {
    uint i = at4(c, p.src[5 * k], p.src[5 * k + 1], p.src[5 * k + 2], p.src[5 * k + 3], p.src[5 * k + 4]);
    switch (k) {
    case 0: return x0[i];
#if N_INPUTS > 2
    case 2: return x2[i];
#endif
#if N_INPUTS > 3
    case 3: return x3[i];
#endif
    default: return x1[i];
    }
}

void main() {
    uint i = flat_index();
    if (i >= p.ne0 * p.ne1 * p.ne2 * p.ne3) return;
    uvec4 c = unravel4(i, p.ne0, p.ne1, p.ne2, p.ne3);
    uvec4 cd = c;
    uint a = c[AXIS];
    uint k = uint(a >= p.b1) + uint(a >= p.b2) + uint(a >= p.b3);
    c[AXIS] = a - (k == 0 ? 0 : k == 1 ? p.b1 : k == 2 ? p.b2 : p.b3);
    d[at4(cd, p.d_off, p.d_s0, p.d_s1, p.d_s2, p.d_s3)] = load(k, c);
}
