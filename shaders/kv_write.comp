#version 450
#extension GL_GOOGLE_include_directive : require
// KV_WRITE: cache[p, s, h, :] = x[t, s, h, :] at p = pos[0] + t, the position read from a device
// buffer (a decode step replays the same command buffer at every position). Slots s < `rotate`
// are RoPE-rotated first (the keys; the values are copied): pair (x[2i], x[2i+1]) at position p by
// the angle whose cos/sin are tables cos_t/sin_t [capacity, hd/2].
// Rows with p outside [0, capacity) are not written (a padded prefill chunk may run past the end).
// Layout: one invocation per (t, s, h, pair i), flat index with i fastest; strided x and cache views.
#include "common.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer Cos { float cos_t[]; };
layout(binding = 3) readonly buffer Sin { float sin_t[]; };
layout(binding = 4) writeonly buffer C { float cache[]; };
layout(push_constant) uniform P {
    uint T, S, H, half_dim;
    uint x_off, x_s0, x_s1, x_s2, x_s3;
    uint c_off, c_s0, c_s1, c_s2, c_s3;
    uint capacity, rotate, pos_off, cos_off, sin_off, tab_s0;
} p;

void main() {
    uint i = flat_index();
    if (i >= p.T * p.S * p.H * p.half_dim) return;
    uvec4 c = unravel4(i, p.T, p.S, p.H, p.half_dim);     // (t, s, h, pair)
    int pp = pos[p.pos_off] + int(c.x);
    if (pp < 0 || uint(pp) >= p.capacity) return;
    uint xb = p.x_off + c.x * p.x_s0 + c.y * p.x_s1 + c.z * p.x_s2 + 2 * c.w * p.x_s3;
    float a = x[xb], b = x[xb + p.x_s3];
    if (c.y < p.rotate) {
        float cs = cos_t[p.cos_off + uint(pp) * p.tab_s0 + c.w];
        float sn = sin_t[p.sin_off + uint(pp) * p.tab_s0 + c.w];
        float ra = a * cs - b * sn;
        b = a * sn + b * cs;
        a = ra;
    }
    uint cb = p.c_off + uint(pp) * p.c_s0 + c.y * p.c_s1 + c.z * p.c_s2 + 2 * c.w * p.c_s3;
    cache[cb] = a;
    cache[cb + p.c_s3] = b;
}
