#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS
//! variants: LANES_WORKGROUP
// Softmax over the last axis of a 4-D strided view: d[r, j] = exp(s·x[r, j] − m) / Σ_j exp(s·x[r, j] − m),
// m = max_j s·x[r, j]. Output any strided view (in place allowed: each lane rereads then writes
// only its own elements).
// Layout: one cluster of LANES lanes per row (lanes.glsl; -D LANES_WORKGROUP: the whole workgroup,
// for few long rows); lane l takes columns l, l+LANES, ...
// Pass 1 keeps a running (max, Σexp) per lane (online softmax), merged across the cluster;
// pass 2 writes. The running max starts at −FLT_MAX, not −inf, so a fully −inf row gives 0/0 = NaN
// like the reference instead of NaN from inf − inf in the merge.
#include "lanes.glsl"
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) buffer D { float d[]; };
layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint x_off, x_s0, x_s1, x_s2, x_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    float scale;
} p;

const float LOWEST = -3.402823466e38;

void main() {
    uint row = cluster_id();
    if (row >= p.ne0 * p.ne1 * p.ne2) return;           // whole cluster leaves together
    uint lane = cluster_lane();
    uvec4 c = uvec4(unravel4(row, 1, p.ne0, p.ne1, p.ne2).yzw, 0);
    uint xb = at4(c, p.x_off, p.x_s0, p.x_s1, p.x_s2, 0);
    uint db = at4(c, p.d_off, p.d_s0, p.d_s1, p.d_s2, 0);
    float m = LOWEST, s = 0.0;
    for (uint j = lane; j < p.ne3; j += LANES) {
        float v = x[xb + j * p.x_s3] * p.scale;
        if (v > m) { s *= exp(m - v); m = v; }
        s += exp(v - m);
    }
    float mr = cluster_max(m);
    float inv = 1.0 / cluster_sum(s * exp(m - mr));
    for (uint j = lane; j < p.ne3; j += LANES) d[db + j * p.d_s3] = exp(x[xb + j * p.x_s3] * p.scale - mr) * inv;
}
