#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | W_BF16 | W_F16
// GET_ROWS: d[n, j] = table[ids[n], j] for a strided table[V, D] (f32, or bf16 / f16 with
// W_BF16 / W_F16: weights.glsl, widened to f32) and ids[N] (i32).
// An id outside [0, V) reads nothing and writes NaN for its whole row.
// Layout: one invocation per output element, flat index n * D + j (consecutive lanes read
// consecutive columns of one row).
#include "common.glsl"
#define W_BINDING 0
#include "weights.glsl"
layout(binding = 1) readonly buffer I { int ids[]; };
layout(binding = 2) buffer D { float d[]; };
layout(push_constant) uniform P {
    uint n_rows, n_cols, n_vocab;
    uint t_off, t_s0, t_s1;
    uint i_off, i_s;
    uint d_off, d_s0, d_s1;
} p;

void main() {
    uint i = flat_index();
    if (i >= p.n_rows * p.n_cols) return;
    uint n = i / p.n_cols, j = i % p.n_cols;
    int id = ids[p.i_off + n * p.i_s];
    float v = uintBitsToFloat(0x7FC00000u);     // quiet NaN
    if (id >= 0 && uint(id) < p.n_vocab) v = W_AT(p.t_off + uint(id) * p.t_s0 + j * p.t_s1);
    d[p.d_off + n * p.d_s0 + j * p.d_s1] = v;
}
