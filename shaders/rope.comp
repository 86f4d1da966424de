#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | INVERSE
// ROPE: out[t, h, :] = x[t, h, :] with its trailing 2·half channels rotated by interleaved pairs
// (c, c+1) at position p = pos[0] + t (tables cos/sin [capacity, half]; -D INVERSE: angle −p, the
// de-rotation of an attention output). The leading n − 2·half channels are copied.
// Lanes: one invocation per channel pair (t, h, i), i < n/2. A position outside [0, capacity) gives NaN.
// Push: T, H, n2 (= n/2), half, capacity, x (off, s0, s1), out (off, s0, s1), pos_off, cos_off,
// sin_off, tab_s0.
#include "common.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer Cos { float cos_t[]; };
layout(binding = 3) readonly buffer Sin { float sin_t[]; };
layout(binding = 4) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, H, n2, half_rd, capacity;
    uint x_off, x_s0, x_s1;
    uint o_off, o_s0, o_s1;
    uint pos_off, cos_off, sin_off, tab_s0;
} p;
#include "rope.glsl"
#if defined(INVERSE)
const bool INVERSE_ROT = true;
#else
const bool INVERSE_ROT = false;
#endif

void main() {
    uint i = flat_index();
    if (i >= p.T * p.H * p.n2) return;
    uint c = i % p.n2, th = i / p.n2;
    uint h = th % p.H, t = th / p.H;
    uint xb = p.x_off + t * p.x_s0 + h * p.x_s1 + 2 * c;
    uint ob = p.o_off + t * p.o_s0 + h * p.o_s1 + 2 * c;
    vec2 a = vec2(x[xb], x[xb + 1]);
    uint first = 2u * (p.n2 - p.half_rd);               // the first rotated channel
    int pp = pos[p.pos_off] + int(t);
    o[ob] = rope_channel(a.x, a.y, 2u * c, first, pp, p.capacity, p.cos_off, p.sin_off, p.tab_s0, INVERSE_ROT);
    o[ob + 1] = rope_channel(a.y, a.x, 2u * c + 1u, first, pp, p.capacity, p.cos_off, p.sin_off, p.tab_s0, INVERSE_ROT);
}
