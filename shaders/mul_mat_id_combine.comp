#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | HAS_ADD
// MUL_MAT_ID mode="sum" after its grouped kernel (mul_mat_id_grouped.comp): per token the routes'
// products y [T, R, N] weighted and summed in route order, as the per-route kernel sums them:
//   out[t, n] = Σ_r weight[t, r] · y[t, r, n]  (+ add[t, n] with HAS_ADD)
// over the routes whose expert this dispatch holds (experts id_base .. id_base + E − 1 of n_ids;
// p.shared_id = 1: also the shared expert n_ids − 1); a route to another part adds 0, an invalid
// id makes the output NaN. A fixed order, no atomics: deterministic.
// Layout: one invocation per output element, n fastest. Push block: T, R, N, E, id_base, n_ids,
// shared_id; r_off, r_s0, r_s1, r_s2 (route [T, R, 2]); y_off, y_s0, y_s1 (y[t, r, n] at y_off +
// t·y_s0 + r·y_s1 + n); d_off, d_s0, d_s1; a_off, a_s0, a_s1.
#include "common.glsl"
layout(binding = 0) readonly buffer Y { float y[]; };
layout(binding = 1) readonly buffer R { float route[]; };
#if defined(HAS_ADD)
layout(binding = 2) readonly buffer A { float addend[]; };
layout(binding = 3) writeonly buffer D { float d[]; };
#else
layout(binding = 2) writeonly buffer D { float d[]; };
#endif
layout(push_constant) uniform P {
    uint T, R, N, E, id_base, n_ids, shared_id;
    uint r_off, r_s0, r_s1, r_s2;
    uint y_off, y_s0, y_s1;
    uint d_off, d_s0, d_s1;
    uint a_off, a_s0, a_s1;
} p;

void main() {
    uint q = flat_index();
    if (q >= p.T * p.N) return;
    uint t = q / p.N, n = q - t * p.N;
    float acc = 0.0;
    bool ok = true;
    for (uint r = 0; r < p.R; ++r) {
        uint rb = p.r_off + t * p.r_s0 + r * p.r_s1;
        float f = route[rb];
        if (!(f >= 0.0 && f < float(p.n_ids) && f == floor(f))) { ok = false; continue; }
        uint id = uint(f);
        bool here = (p.shared_id != 0u && id == p.n_ids - 1u) || (id >= p.id_base && id - p.id_base < p.E);
        if (here) acc += route[rb + p.r_s2] * y[p.y_off + t * p.y_s0 + r * p.y_s1 + n];
    }
#if defined(HAS_ADD)
    acc += addend[p.a_off + t * p.a_s0 + n * p.a_s1];
#endif
    d[p.d_off + t * p.d_s0 + n * p.d_s1] = ok ? acc : uintBitsToFloat(0x7FC00000u);
}
