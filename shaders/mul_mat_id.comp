#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: LANES=1 | LANES=2,4,8,16,32,64,128 | LANES=2,4,8,16,32,64,128 LANES_SUBGROUP_OPS ; MODE_SWIGLU | MODE_SUM ; - | VEC4 ; - | HAS_ADD ; - | W_BF16 | W_F16
// MUL_MAT_ID: matrix products with the experts the router chose, route[t, r] = (id, weight)
// (MOE_ROUTE's output; ids are exact floats), weights w [E, N, K] stacked per expert:
//   MODE_SWIGLU  x [T, 1 or R, K] (stride 0 over r: the same token row for every route), w [E, 2F, K]:
//                out[t, r, f] = silu(w[id, f]·x[t, r]) · (w[id, F + f]·x[t, r])     gate/up + SwiGLU
//                with the clamp of DeepSeek-V4's SwiGLU: silu(min(gate, limit)) · clamp(up, −limit,
//                limit) (push constant; +inf: no clamp)
//   MODE_SUM     x [T, R, K], w [E, N, K]:
//                out[t, n] = Σ_r weight[t, r] · (w[id_r, n]·x[t, r])  (+ add[t, n] with HAS_ADD)
// Only the chosen experts' rows are read. An id outside [0, E) writes NaN: no out-of-bounds read.
// Layout: one cluster of LANES lanes per output element (lanes.glsl), lane l takes k = l, l+LANES,
// ...; the output column (f or n) varies fastest across clusters, so neighbouring clusters read
// neighbouring weight rows of the same expert. W_BF16 / W_F16: 16-bit weights (weights.glsl). VEC4: K % 4 == 0 and every row 16-byte aligned.
#include "lanes.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 2) readonly buffer R { float route[]; };
#if defined(HAS_ADD)
layout(binding = 3) readonly buffer A { float addend[]; };
layout(binding = 4) writeonly buffer D { float d[]; };
#else
layout(binding = 3) writeonly buffer D { float d[]; };
#endif
#if defined(VEC4)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#endif
#include "weights.glsl"
layout(push_constant) uniform P {
    uint T, R, N, K, E;                 // N: output columns (F for MODE_SWIGLU)
    uint x_off, x_s0, x_s1;
    uint w_off, w_s0, w_s1;
    uint r_off, r_s0, r_s1, r_s2;
    uint d_off, d_s0, d_s1, d_s2;       // MODE_SUM: d[t, n] at d_off + t·d_s0 + n·d_s1
    uint a_off, a_s0, a_s1;
    float limit;                        // MODE_SWIGLU's clamp (+inf: none)
} p;

#define NAN uintBitsToFloat(0x7FC00000u)

// This lane's share of the dot product of x row xb with w row wb (k contiguous in both).
float partial_dot(uint xb, uint wb, uint lane) {
    float acc = 0.0;
    uint k = lane;
#if defined(VEC4)
    for (; k < p.K / 4; k += LANES) acc += dot(x4[xb / 4 + k], W4_AT(wb / 4 + k));
    k = (p.K / 4) * 4 + lane;
#endif
    for (; k < p.K; k += LANES) acc += x[xb + k] * W_AT(wb + k);
    return acc;
}

// Expert id of route (t, r), or −1 when it is not a valid id.
int expert(uint t, uint r) {
    float f = route[p.r_off + t * p.r_s0 + r * p.r_s1];
    return (f >= 0.0 && f < float(p.E) && f == floor(f)) ? int(f) : -1;
}

void main() {
    uint item = cluster_id();
    uint lane = cluster_lane();
#if defined(MODE_SWIGLU)
    if (item >= p.T * p.R * p.N) return;                // whole cluster leaves together
    uint f = item % p.N, tr = item / p.N;
    uint r = tr % p.R, t = tr / p.R;
    int id = expert(t, r);
    float v = NAN;
    if (id >= 0) {                                      // uniform per cluster
        uint xb = p.x_off + t * p.x_s0 + r * p.x_s1;
        uint wb = p.w_off + uint(id) * p.w_s0;
        float g = cluster_sum(partial_dot(xb, wb + f * p.w_s1, lane));
        float u = cluster_sum(partial_dot(xb, wb + (p.N + f) * p.w_s1, lane));
        g = min(g, p.limit);
        u = clamp(u, -p.limit, p.limit);
        v = g / (1.0 + exp(-g)) * u;
    }
    if (lane == 0) d[p.d_off + t * p.d_s0 + r * p.d_s1 + f * p.d_s2] = v;
#elif defined(MODE_SUM)
    if (item >= p.T * p.N) return;
    uint n = item % p.N, t = item / p.N;
    float acc = 0.0;
    bool ok = true;
    for (uint r = 0; r < p.R; ++r) {
        int id = expert(t, r);
        if (id < 0) { ok = false; continue; }
        float wt = route[p.r_off + t * p.r_s0 + r * p.r_s1 + p.r_s2];
        uint xb = p.x_off + t * p.x_s0 + r * p.x_s1;
        acc += wt * partial_dot(xb, p.w_off + uint(id) * p.w_s0 + n * p.w_s1, lane);
    }
    float s = cluster_sum(acc);
#if defined(HAS_ADD)
    s += addend[p.a_off + t * p.a_s0 + n * p.a_s1];
#endif
    if (lane == 0) d[p.d_off + t * p.d_s0 + n * p.d_s1] = ok ? s : NAN;
#else
#error "define MODE_SWIGLU or MODE_SUM"
#endif
}
