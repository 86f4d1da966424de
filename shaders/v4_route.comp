#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: SCORE_SQRTSOFTPLUS | SCORE_SIGMOID | SCORE_SOFTMAX ; - | HASH
// V4_ROUTE: DeepSeek-V4's router, one invocation per token t. Scores sc = sqrt(softplus(logit))
// (SCORE_SQRTSOFTPLUS), sigmoid (SCORE_SIGMOID) or softmax over experts (SCORE_SOFTMAX).
// Selection: HASH: the TOP_K ids tid2eid[ids[t]] (may repeat); else the TOP_K largest sc + bias
// (the correction bias ranks only; ties to the lower id). Weights: sc[id] / (Σ sc[picked] + 1e-20)
// · route_scale. Output route [T, TOP_K + 1, 2] = (expert id as an exact float, weight); the last
// route is the shared expert (id E, weight 1), so MUL_MAT_ID runs routed and shared experts together.
// Push: T, E, lg (off, s0), sel_off (bias offset or tid2eid offset), tid_s0, ids_off, out (off, s0,
// s1, s2), route_scale.
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

void main() {
    uint t = flat_index();
    if (t >= p.T) return;
    float mx = -3.402823466e38, den = 1.0;
#if defined(SCORE_SOFTMAX)
    for (uint e = 0; e < p.E; ++e) mx = max(mx, lg[p.l_off + t * p.l_s0 + e]);
    den = 0.0;
    for (uint e = 0; e < p.E; ++e) den += exp(lg[p.l_off + t * p.l_s0 + e] - mx);
#endif
    int pick[TOP_K];
    float wsum = 0.0;
    for (uint r = 0; r < TOP_K; ++r) {
#if defined(HASH)
        int e = tid[p.sel_off + uint(ids[p.ids_off + t]) * p.tid_s0 + r];
        pick[r] = (e >= 0 && uint(e) < p.E) ? e : -1;
#else
        int best = -1;
        float bv = 0.0;
        for (uint e = 0; e < p.E; ++e) {
            bool taken = false;
            for (uint q = 0; q < r; ++q) taken = taken || pick[q] == int(e);
            float v = score(t, e, mx, den) + bias[p.sel_off + e];
            if (!taken && (best < 0 || v > bv)) { best = int(e); bv = v; }
        }
        pick[r] = best;
#endif
        wsum += pick[r] >= 0 ? score(t, uint(pick[r]), mx, den) : 0.0;
    }
    float f = p.route_scale / (wsum + 1e-20);
    uint ob = p.o_off + t * p.o_s0;
    for (uint r = 0; r < TOP_K; ++r) {
        // an invalid id (a bad tid2eid entry) stays −1: MUL_MAT_ID then writes NaN for the token
        o[ob + r * p.o_s1] = float(pick[r]);
        o[ob + r * p.o_s1 + p.o_s2] = pick[r] >= 0 ? score(t, uint(pick[r]), mx, den) * f : 0.0;
    }
    o[ob + TOP_K * p.o_s1] = float(p.E);
    o[ob + TOP_K * p.o_s1 + p.o_s2] = 1.0;
}
