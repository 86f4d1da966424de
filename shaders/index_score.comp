#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: LANES=1 | LANES=2,4,8,16,32,64,128 | LANES=2,4,8,16,32,64,128 LANES_SUBGROUP_OPS
// INDEX_SCORE: the lightning indexer's scores of chunk token t (position p = pos[0] + t) against
// the compressed index keys k [n, hd]:
//   score[t, w] = scale · Σ_h wt[t, h] · ReLU(q[t, h]·k[w])    for w < (p + 1)/RATE (closed windows)
//   score[t, w] = −inf                                          otherwise (and for a bad position)
// Lanes: one cluster of LANES lanes (lanes.glsl) per (t, w); lane l takes channels l, l + LANES,
// ...; one cluster sum per head. Push: T, nh, hd, n, capacity, q (off, s0, s1), wt (off, s0),
// k (off, s0), out (off, s0), pos_off, scale.
#include "lanes.glsl"
layout(constant_id = 1) const uint RATE = 4;     // the compression rate m
layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer Wt { float wt[]; };
layout(binding = 2) readonly buffer K { float k[]; };
layout(binding = 3) readonly buffer Pos { int pos[]; };
layout(binding = 4) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, nh, hd, n, capacity;
    uint q_off, q_s0, q_s1, w_off, w_s0, k_off, k_s0, o_off, o_s0;
    uint pos_off;
    float scale;
} p;

void main() {
    uint item = cluster_id();
    if (item >= p.T * p.n) return;                      // whole cluster leaves together
    uint lane = cluster_lane();
    uint w = item % p.n, t = item / p.n;
    int pp = pos[p.pos_off] + int(t);
    float s = uintBitsToFloat(0xFF800000u);             // −inf: not selectable
    if (pp >= 0 && uint(pp) < p.capacity && w < (uint(pp) + 1) / RATE) {
        s = 0.0;
        uint kb = p.k_off + w * p.k_s0;
        for (uint h = 0; h < p.nh; ++h) {
            uint qb = p.q_off + t * p.q_s0 + h * p.q_s1;
            float d = 0.0;
            for (uint c = lane; c < p.hd; c += LANES) d += q[qb + c] * k[kb + c];
            s += wt[p.w_off + t * p.w_s0 + h] * max(cluster_sum(d), 0.0);
        }
        s *= p.scale;
    }
    if (lane == 0) o[p.o_off + t * p.o_s0 + w] = s;
}
