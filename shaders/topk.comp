#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: -
// TOPK: idx[t, r] = the entry of rank r among the finite scores of row t (descending score, ties
// to the lower index), r < K; slots past the number of finite scores get −1. Exact for any K (the
// indexer's index_topk, e.g. 512): entry w's rank is the count of entries ahead of it, O(n²) per row.
// Lanes: one workgroup per row; invocation l ranks entries l, l + WG, ..., BATCH of them at a
// time, against the row staged TILE scores at a time into shared memory (every rank count reads
// shared memory, not a global load per comparison: at decode the row is one token's and the O(n²)
// scan was a chain of memory latencies). The −1 fill comes first, then a barrier, then the ranked
// writes. Push: T, n, K, s (off, s0), idx (off, s0).
#include "common.glsl"
layout(binding = 0) readonly buffer S { float sc[]; };
layout(binding = 1) buffer I { int idx[]; };
layout(push_constant) uniform P { uint T, n, K, s_off, s_s0, i_off, i_s0; } p;

const uint TILE = 1024u;
const uint BATCH = 4u;
shared float tile[TILE];

bool finite(float v) { return !isinf(v) && !isnan(v); }
#define NEG_INF uintBitsToFloat(0xFF800000u)

// 1 when entry u (score x) ranks ahead of entry w (score v): a higher score, or the same and a lower index
uint ahead(float x, uint u, float v, uint w) { return (x > v || (x == v && u < w)) ? 1u : 0u; }

void main() {
    uint t = flat_group();
    if (t >= p.T) return;                               // uniform per workgroup
    uint l = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    uint sb = p.s_off + t * p.s_s0, ib = p.i_off + t * p.i_s0;
    for (uint r = l; r < p.K; r += wg) idx[ib + r] = -1;
    memoryBarrierBuffer();
    barrier();
    uint per = (p.n + wg - 1u) / wg;                    // entries per invocation (uniform)
    for (uint j0 = 0u; j0 < per; j0 += BATCH) {
        uint w[BATCH], rank[BATCH];
        float v[BATCH];
        bool live[BATCH];
        [[unroll]] for (uint k = 0u; k < BATCH; ++k) {
            w[k] = l + (j0 + k) * wg;
            v[k] = w[k] < p.n ? sc[sb + w[k]] : 0.0;
            live[k] = w[k] < p.n && finite(v[k]);
            rank[k] = 0u;
        }
        for (uint base = 0u; base < p.n; base += TILE) {
            uint cnt = min(TILE, p.n - base);
            barrier();                                  // the last tile's readers are done
            // staged with every non-finite score as −inf, which is ahead of no finite entry: the scan
            // below needs no branch, and its steps are independent (a branch per entry made each
            // step wait for the last)
            for (uint i = l; i < cnt; i += wg) {
                float x = sc[sb + base + i];
                tile[i] = finite(x) ? x : NEG_INF;
            }
            barrier();
            uint i = 0u;
            for (; i + 4u <= cnt; i += 4u) {            // four entries a step: their loads together
                vec4 x = vec4(tile[i], tile[i + 1u], tile[i + 2u], tile[i + 3u]);
                [[unroll]] for (uint k = 0u; k < BATCH; ++k)
                    [[unroll]] for (uint e = 0u; e < 4u; ++e) rank[k] += ahead(x[e], base + i + e, v[k], w[k]);
            }
            for (; i < cnt; ++i)
                [[unroll]] for (uint k = 0u; k < BATCH; ++k) rank[k] += ahead(tile[i], base + i, v[k], w[k]);
        }
        [[unroll]] for (uint k = 0u; k < BATCH; ++k)
            if (live[k] && rank[k] < p.K) idx[ib + rank[k]] = int(w[k]);
    }
}
