#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: -
// STORE_ROWS: dst[(pos[0] + t) % rows, :] = x[t, :] for every chunk row t whose position is in
// [0, capacity): dst [rows, n] is a ring of the last `rows` positions (rows = capacity: no wrap).
// In place: the decode cache rows, written on the device inside the replayed command buffer.
// Lanes: one invocation per element (t, c). Push: T, n, capacity, rows, x (off, s0), dst (off, s0), pos_off.
#include "common.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) buffer D { float d[]; };
layout(push_constant) uniform P { uint T, n, capacity, rows, x_off, x_s0, d_off, d_s0, pos_off; } p;

void main() {
    uint i = flat_index();
    if (i >= p.T * p.n) return;
    uint c = i % p.n, t = i / p.n;
    int row = pos[p.pos_off] + int(t);
    if (row >= 0 && uint(row) < p.capacity) d[p.d_off + (uint(row) % p.rows) * p.d_s0 + c] = x[p.x_off + t * p.x_s0 + c];
}
