#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: SCORE_SQRTSOFTPLUS | SCORE_SIGMOID | SCORE_SOFTMAX ; - | HASH ; - | SERIAL
//! variants: SCORE_SQRTSOFTPLUS | SCORE_SIGMOID | SCORE_SOFTMAX ; RANK
#if !defined(SERIAL)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// V4_ROUTE: DeepSeek-V4's router. Scores sc = sqrt(softplus(logit)) (SCORE_SQRTSOFTPLUS), sigmoid
// (SCORE_SIGMOID) or softmax over experts (SCORE_SOFTMAX).
// Selection: HASH: the TOP_K ids tid2eid[ids[t]] (may repeat); else the TOP_K largest sc + bias
// (the correction bias ranks only; ties to the lower id; NaN after everything, as a stable
// descending sort). Weights: sc[id] / (Σ sc[picked] + 1e-20) · route_scale. Output route
// [T, TOP_K + 1, 2] = (expert id as an exact float, weight); the last route is the shared expert
// (id E, weight 1), so MUL_MAT_ID runs routed and shared experts together.
// Layout: one workgroup per token (at decode the router is one token: a single invocation scanning
// E experts TOP_K times was a serial chain). Invocation i owns experts i, i + WG, ...; each round
// every invocation proposes its best expert not yet taken, a shuffle butterfly picks the subgroup's
// best, and the subgroups' bests meet in shared memory (one barrier); the winner is the same
// everywhere. Scores are recomputed per round (a few per invocation), never stored. Invocation 0
// sums the weights in pick order and writes the routes. With SCORE_SOFTMAX, max and Σexp are
// workgroup reductions first.
// -D RANK (at most RANK_MAX experts, one per invocation): every invocation scores its expert once,
// the scores meet in shared memory (one barrier), and each invocation counts the experts that rank
// before its own: an expert whose rank is below TOP_K is pick `rank` (the order is strict, so the
// ranks are distinct). One pass over the scores instead of TOP_K rounds of a butterfly and two
// barriers each — a decode step's router is a chain of latencies, not of work — and the picks'
// weights are read from the shared scores rather than loaded and computed again.
// -D SERIAL (devices without subgroup arithmetic and shuffles): one invocation per token scans the
// experts TOP_K times (the same picks; softmax's Σexp summed in expert order).
// Spec constants: 0 workgroup size, 1 TOP_K. Push: T, E, lg (off, s0), sel_off (bias offset or
// tid2eid offset), tid_s0, ids_off, out (off, s0, s1, s2), route_scale.
#include "common.glsl"
layout(constant_id = 1) const uint TOP_K = 1;    // num_experts_per_tok
layout(binding = 0) readonly buffer L { float lg[]; };
#if defined(HASH)
layout(binding = 1) readonly buffer Tid { int tid[]; };
layout(binding = 2) readonly buffer Ids { int ids[]; };
layout(binding = 3) writeonly buffer O { float o[]; };
#else
layout(binding = 1) readonly buffer B { float bias[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
#endif
layout(push_constant) uniform P {
    uint T, E, l_off, l_s0, sel_off, tid_s0, ids_off, o_off, o_s0, o_s1, o_s2;
    float route_scale;
} p;

#if !defined(SERIAL)
shared float red_v[64];          // per subgroup (≤ 64 of them): best value / running reduction
shared int red_e[64];            // per subgroup: best expert
shared int picks[64];            // the experts taken so far (TOP_K ≤ 64)
#endif
#if defined(RANK)
const uint RANK_MAX = 256;       // experts (the host checks; ≤ the workgroup)
shared float rank_v[RANK_MAX];   // score + bias of every expert
shared float rank_s[RANK_MAX];   // its score (the picks' weights read it back: no second load)
#endif

float score(uint t, uint e, float mx, float den) {
    float x = lg[p.l_off + t * p.l_s0 + e];
#if defined(SCORE_SQRTSOFTPLUS)
    return sqrt(max(x, 0.0) + log(1.0 + exp(-abs(x))));     // softplus without overflow
#elif defined(SCORE_SIGMOID)
    return 1.0 / (1.0 + exp(-x));
#else
    return exp(x - mx) / den;
#endif
}

#if defined(HASH)
// Route r of token t from the hash table: tid2eid[ids[t], r], −1 when it is no expert.
int hash_pick(uint t, uint r) {
    int e = tid[p.sel_off + uint(ids[p.ids_off + t]) * p.tid_s0 + r];
    return (e >= 0 && uint(e) < p.E) ? e : -1;
}
#endif

// Whether candidate (v, e) ranks before (w, f): a number before NaN, the larger value, then the
// lower id; e < 0 is no candidate.
bool before(float v, int e, float w, int f) {
    if (e < 0) return false;
    if (f < 0) return true;
    bool nv = isnan(v), nw = isnan(w);
    if (nv != nw) return nw;
    if (!nv && v != w) return v > w;
    return e < f;
}

#if defined(SCORE_SOFTMAX) && !defined(SERIAL)
// Max, then Σ exp(x − max), over the token's experts: subgroup steps, then the subgroups in order.
void softmax_stats(uint t, out float mx, out float den) {
    uint lid = gl_LocalInvocationID.x;
    float m = -3.402823466e38;
    for (uint e = lid; e < p.E; e += gl_WorkGroupSize.x) m = max(m, lg[p.l_off + t * p.l_s0 + e]);
    m = subgroupMax(m);
    if (subgroupElect()) red_v[gl_SubgroupID] = m;
    barrier();
    mx = red_v[0];
    for (uint i = 1u; i < gl_NumSubgroups; ++i) mx = max(mx, red_v[i]);
    barrier();
    float s = 0.0;
    for (uint e = lid; e < p.E; e += gl_WorkGroupSize.x) s += exp(lg[p.l_off + t * p.l_s0 + e] - mx);
    s = subgroupAdd(s);
    if (subgroupElect()) red_v[gl_SubgroupID] = s;
    barrier();
    den = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) den += red_v[i];
    barrier();
}
#endif

#if defined(SERIAL)
void main() {
    uint t = flat_index();
    if (t >= p.T) return;
    float mx = -3.402823466e38, den = 1.0;
#if defined(SCORE_SOFTMAX)
    for (uint e = 0u; e < p.E; ++e) mx = max(mx, lg[p.l_off + t * p.l_s0 + e]);
    den = 0.0;
    for (uint e = 0u; e < p.E; ++e) den += exp(lg[p.l_off + t * p.l_s0 + e] - mx);
#endif
    int pick[TOP_K];
    for (uint r = 0u; r < TOP_K; ++r) {
#if defined(HASH)
        pick[r] = hash_pick(t, r);
#else
        float bv = 0.0;
        int be = -1;
        for (uint e = 0u; e < p.E; ++e) {
            bool taken = false;
            for (uint q = 0u; q < r; ++q) taken = taken || pick[q] == int(e);
            float v = score(t, e, mx, den) + bias[p.sel_off + e];
            if (!taken && before(v, int(e), bv, be)) { bv = v; be = int(e); }
        }
        pick[r] = be;
#endif
    }
#else
void main() {
    uint t = flat_group();
    if (t >= p.T) return;                      // uniform per workgroup: barriers below stay legal
    uint lid = gl_LocalInvocationID.x;
    float mx = -3.402823466e38, den = 1.0;
#if defined(SCORE_SOFTMAX)
    softmax_stats(t, mx, den);
#endif
#if defined(RANK)
    if (lid < TOP_K) picks[lid] = -1;          // (E < TOP_K: routes past E stay no expert)
    float own = 0.0;
    if (lid < p.E) {
        float sc = score(t, lid, mx, den);
        own = sc + bias[p.sel_off + lid];
        rank_v[lid] = own;
        rank_s[lid] = sc;
    }
    barrier();
    if (lid < p.E) {
        uint rank = 0u, f = 0u;
        for (; f + 4u <= p.E; f += 4u) {       // 4 shared loads issued together
            float v0 = rank_v[f], v1 = rank_v[f + 1u], v2 = rank_v[f + 2u], v3 = rank_v[f + 3u];
            rank += (before(v0, int(f), own, int(lid)) ? 1u : 0u) + (before(v1, int(f + 1u), own, int(lid)) ? 1u : 0u)
                  + (before(v2, int(f + 2u), own, int(lid)) ? 1u : 0u) + (before(v3, int(f + 3u), own, int(lid)) ? 1u : 0u);
        }
        for (; f < p.E; ++f) rank += before(rank_v[f], int(f), own, int(lid)) ? 1u : 0u;
        if (rank < TOP_K) picks[rank] = int(lid);
    }
    barrier();
#elif !defined(HASH)
    for (uint r = 0u; r < TOP_K; ++r) {
        float bv = 0.0;
        int be = -1;
        for (uint e = lid; e < p.E; e += gl_WorkGroupSize.x) {
            bool taken = false;
            for (uint q = 0u; q < r; ++q) taken = taken || picks[q] == int(e);
            float v = score(t, e, mx, den) + bias[p.sel_off + e];
            if (!taken && before(v, int(e), bv, be)) { bv = v; be = int(e); }
        }
        for (uint d = 1u; d < gl_SubgroupSize; d <<= 1) {
            float w = subgroupShuffleXor(bv, d);
            int f = subgroupShuffleXor(be, d);
            if (before(w, f, bv, be)) { bv = w; be = f; }
        }
        if (subgroupElect()) { red_v[gl_SubgroupID] = bv; red_e[gl_SubgroupID] = be; }
        barrier();
        if (lid == 0u) {
            for (uint i = 1u; i < gl_NumSubgroups; ++i)
                if (before(red_v[i], red_e[i], bv, be)) { bv = red_v[i]; be = red_e[i]; }
            picks[r] = be;
        }
        barrier();
    }
#endif
    if (lid != 0u) return;
    int pick[TOP_K];                           // (unrolled loops: constant indices, registers)
    [[unroll]] for (uint r = 0u; r < TOP_K; ++r) {
#if defined(HASH)
        pick[r] = hash_pick(t, r);
#else
        pick[r] = picks[r];
#endif
    }
#endif
    float wsum = 0.0, w[TOP_K];
    [[unroll]] for (uint r = 0u; r < TOP_K; ++r) {
#if defined(RANK)
        w[r] = pick[r] >= 0 ? rank_s[pick[r]] : 0.0;
#else
        w[r] = pick[r] >= 0 ? score(t, uint(pick[r]), mx, den) : 0.0;
#endif
        wsum += w[r];
    }
    float f = p.route_scale / (wsum + 1e-20);
    uint ob = p.o_off + t * p.o_s0;
    [[unroll]] for (uint r = 0u; r < TOP_K; ++r) {
        // an invalid id (a bad tid2eid entry) stays −1: MUL_MAT_ID then writes NaN for the token
        o[ob + r * p.o_s1] = float(pick[r]);
        o[ob + r * p.o_s1 + p.o_s2] = pick[r] >= 0 ? w[r] * f : 0.0;
    }
    o[ob + TOP_K * p.o_s1] = float(p.E);
    o[ob + TOP_K * p.o_s1 + p.o_s2] = 1.0;
}
