#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; - | PARTIAL | CANDIDATES
// SAMPLE: a token per row of logits [T, V], on the device. cfg = (temperature, top_k) (f32 buffer),
// state = (seed, counter) (i32 buffer). The top_k largest finite logits (ties: the lower id) are
// found by top_k passes of a cluster argmax; temperature ≤ 0 or top_k = 1 is greedy (the first);
// otherwise candidate j has weight exp((v_j − v_0)/temperature) and the draw u ∈ [0, 1) of row r is
// a PCG hash of (seed, counter + r). After the draws the counter advances by T (one workgroup,
// so a barrier orders every read of the state before that write). A row without any finite logit
// gets token −1.
// Two stages for long rows (a vocabulary of 10^5 scanned by one cluster is latency-bound):
//   -D PARTIAL     one cluster per (row, chunk of `chunk` logits) writes the chunk's top_k candidates
//                  as (value, id as an exact float) pairs, MAX_TOP_K slots per chunk, unused (−inf, −1);
//   -D CANDIDATES  the draw over those pairs: the same selection with the pair's id for ties, so
//                  the union of the chunks' top_k holds the row's top_k and the token is the same.
// Layout: clusters of LANES lanes (lanes.glsl); the draw runs in ONE workgroup whose clusters take
// rows r = cluster, cluster + clusters, ...; lane l scans entries l, l+LANES, ... Candidates live in
// per-lane arrays (MAX_TOP_K).
// Push block: T, V (entries per row: logits, or chunks × MAX_TOP_K pairs), row view (offset, row and
// entry strides), cfg and state offsets, output offset and row stride, chunk (PARTIAL).
#include "lanes.glsl"
layout(constant_id = 1) const int MAX_TOP_K = 64;   // candidates per lane array
layout(binding = 0) readonly buffer L { float logits[]; };
layout(binding = 1) readonly buffer C { float cfg[]; };
#if defined(PARTIAL)
layout(binding = 2) writeonly buffer O { float cand[]; };
#else
layout(binding = 2) buffer S { int state[]; };
layout(binding = 3) writeonly buffer O { int tokens[]; };
#endif
layout(push_constant) uniform P {
    uint T, V;
    uint l_off, l_s0, l_s1;
    uint cfg_off, st_off;
    uint o_off, o_s0;
    uint chunk;
} p;

#define NEG_INF uintBitsToFloat(0xFF800000u)

uint pcg(uint v) {
    uint s = v * 747796405u + 2891336453u;
    uint word = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (word >> 22u) ^ word;
}

// entry j of a row: its value and the vocabulary id it stands for
#if defined(CANDIDATES)
// Entry j of the draw is slot j % cand_k of chunk j / cand_k: a chunk's candidates are in pick order,
// so only its first top_k can be among the row's top_k (greedy reads one pair per chunk, not 64).
uint cand_k = 1u;
#define PAIR(j) (((j) / cand_k) * uint(MAX_TOP_K) + (j) % cand_k)
#define VALUE(lb, j) logits[(lb) + 2u * PAIR(j) * p.l_s1]
#define ID(lb, j) uint(logits[(lb) + (2u * PAIR(j) + 1u) * p.l_s1])
#else
#define VALUE(lb, j) logits[(lb) + (j) * p.l_s1]
#define ID(lb, j) (j)
#endif

#define SCAN 8u

// Entry (v, id) against the best so far (bv, bi) of pick r: finite, after the previous pick (pv, pi)
// in the order (value descending, id ascending), and better than the best.
void consider(float v, uint id, int r, float pv, uint pi, inout float bv, inout uint bi) {
    if (isnan(v) || isinf(v)) return;
    bool below = r == 0 || v < pv || (v == pv && id > pi);         // after the previous pick
    if (below && (v > bv || (v == bv && id < bi))) { bv = v; bi = id; }
}

// The top_k largest finite values among entries [lo, hi) of the row at lb, in order (ties: lower id).
int select_top(uint lb, uint lo, uint hi, int top_k, inout float vals[MAX_TOP_K], inout int ids[MAX_TOP_K]) {
    uint lane = cluster_lane();
    int n = 0;
    float pv = 0.0;
    uint pi = 0;
    for (int r = 0; r < top_k; ++r) {
        float bv = NEG_INF;
        uint bi = 0xFFFFFFFFu;
        // SCAN entries per lane loaded before any is compared: a loop of one load per step waits a
        // memory latency per step, SCAN
        // loads in flight divide that wait. The pick does not depend on the order entries are seen.
        uint j = lo + lane;
        for (; j + (SCAN - 1u) * LANES < hi; j += SCAN * LANES) {
            float v[SCAN];
            uint id[SCAN];
            [[unroll]] for (uint u = 0u; u < SCAN; ++u) {
                v[u] = VALUE(lb, j + u * LANES);
                id[u] = ID(lb, j + u * LANES);
            }
            [[unroll]] for (uint u = 0u; u < SCAN; ++u) consider(v[u], id[u], r, pv, pi, bv, bi);
        }
        for (; j < hi; j += LANES) consider(VALUE(lb, j), ID(lb, j), r, pv, pi, bv, bi);
        float m = cluster_max(bv);
        if (m == NEG_INF) break;                                     // no candidate left
        pi = uint(-cluster_max(bv == m ? -float(bi) : NEG_INF));      // lowest id holding m
        pv = m;
        vals[n] = m;
        ids[n] = int(pi);
        ++n;
    }
    return n;
}

void main() {
    float temperature = cfg[p.cfg_off];
    int top_k = clamp(int(cfg[p.cfg_off + 1]), 1, MAX_TOP_K);
    if (!(temperature > 0.0)) top_k = 1;
    float vals[MAX_TOP_K];
    int ids[MAX_TOP_K];
#if defined(PARTIAL)
    uint chunks = (p.V + p.chunk - 1) / p.chunk;
    uint item = cluster_id();                                        // (row, chunk), uniform per cluster
    if (item >= p.T * chunks) return;
    uint row = item / chunks, c = item % chunks;
    uint lo = c * p.chunk;
    int n = select_top(p.l_off + row * p.l_s0, lo, min(lo + p.chunk, p.V), top_k, vals, ids);
    uint ob = p.o_off + row * p.o_s0 + c * uint(MAX_TOP_K) * 2u;
    for (int j = int(cluster_lane()); j < MAX_TOP_K; j += int(LANES)) {
        cand[ob + 2u * uint(j)] = j < n ? vals[j] : NEG_INF;
        cand[ob + 2u * uint(j) + 1u] = j < n ? float(ids[j]) : -1.0;      // ids < 2^24: exact floats
    }
#else
    uint seed = uint(state[p.st_off]), counter = uint(state[p.st_off + 1]);
    uint clusters = gl_WorkGroupSize.x / LANES;
    uint lane = cluster_lane();
    for (uint row = cluster_id(); row < p.T; row += clusters) {      // uniform per cluster
#if defined(CANDIDATES)
        cand_k = uint(top_k);
        int n = select_top(p.l_off + row * p.l_s0, 0u, p.V / uint(MAX_TOP_K) * cand_k, top_k, vals, ids);
#else
        int n = select_top(p.l_off + row * p.l_s0, 0u, p.V, top_k, vals, ids);
#endif
        int token = n > 0 ? ids[0] : -1;
        if (n > 1) {
            float total = 0.0;
            for (int j = 0; j < n; ++j) total += exp((vals[j] - vals[0]) / temperature);
            float u = float(pcg(seed ^ pcg(counter + row)) >> 8) * (1.0 / 16777216.0);
            float target = u * total, cum = 0.0;
            token = ids[n - 1];
            for (int j = 0; j < n; ++j) {
                cum += exp((vals[j] - vals[0]) / temperature);
                if (target < cum) { token = ids[j]; break; }
            }
        }
        if (lane == 0) tokens[p.o_off + row * p.o_s0] = token;
    }
    barrier();
    if (gl_LocalInvocationID.x == 0) state[p.st_off + 1] = int(counter + p.T);
#endif
}
