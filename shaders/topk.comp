#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: -
// TOPK: idx[t, r] = the entry of rank r among the finite scores of row t (descending score, ties
// to the lower index), r < K; slots past the number of finite scores get −1. Exact for any K (the
// indexer's index_topk, e.g. 512): entry w's rank is the count of entries ahead of it, O(n²) per row.
// Lanes: one workgroup per row; invocation l ranks entries l, l + WG, ...; the −1 fill comes first,
// then a barrier, then the ranked writes. Push: T, n, K, s (off, s0), idx (off, s0).
#include "common.glsl"
layout(binding = 0) readonly buffer S { float sc[]; };
layout(binding = 1) buffer I { int idx[]; };
layout(push_constant) uniform P { uint T, n, K, s_off, s_s0, i_off, i_s0; } p;

bool finite(float v) { return !isinf(v) && !isnan(v); }

void main() {
    uint t = flat_group();
    if (t >= p.T) return;                               // uniform per workgroup
    uint l = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    uint sb = p.s_off + t * p.s_s0, ib = p.i_off + t * p.i_s0;
    for (uint r = l; r < p.K; r += wg) idx[ib + r] = -1;
    memoryBarrierBuffer();
    barrier();
    for (uint w = l; w < p.n; w += wg) {
        float v = sc[sb + w];
        if (!finite(v)) continue;
        uint rank = 0;
        for (uint u = 0; u < p.n && rank < p.K; ++u) {
            float x = sc[sb + u];
            if (finite(x) && (x > v || (x == v && u < w))) ++rank;
        }
        if (rank < p.K) idx[ib + rank] = int(w);
    }
}
