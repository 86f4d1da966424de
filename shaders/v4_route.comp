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
// Scoring, the order, the hash picks, softmax's statistics, the ranking and the routes' stores are
// v4_route.glsl's, shared with the fused gate (v4_gate.comp).
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
#define ROUTE_LOGIT(t, e) lg[p.l_off + (t) * p.l_s0 + (e)]
#include "v4_route.glsl"

#if defined(SERIAL)
void main() {
    uint t = flat_index();
    if (t >= p.T) return;
    float mx = -3.402823466e38, den = 1.0;
#if defined(SCORE_SOFTMAX)
    for (uint e = 0u; e < p.E; ++e) mx = max(mx, ROUTE_LOGIT(t, e));
    den = 0.0;
    for (uint e = 0u; e < p.E; ++e) den += exp(ROUTE_LOGIT(t, e) - mx);
#endif
    for (uint r = 0u; r < TOP_K; ++r) {
#if defined(HASH)
        route_pick[r] = hash_pick(t, r);
#else
        float bv = 0.0;
        int be = -1;
        for (uint e = 0u; e < p.E; ++e) {
            bool taken = false;
            for (uint q = 0u; q < r; ++q) taken = taken || route_pick[q] == int(e);
            float v = score(t, e, mx, den) + bias[p.sel_off + e];
            if (!taken && before(v, int(e), bv, be)) { bv = v; be = int(e); }
        }
        route_pick[r] = be;
#endif
    }
    store_routes(t, mx, den);
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
    rank_select(t, mx, den);
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
    [[unroll]] for (uint r = 0u; r < TOP_K; ++r) {
#if defined(HASH)
        route_pick[r] = hash_pick(t, r);
#else
        route_pick[r] = picks[r];
#endif
    }
    store_routes(t, mx, den);
}
#endif
