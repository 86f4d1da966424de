#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: ROUTER_SOFTMAX | ROUTER_SIGMOID
// MOE_ROUTE: per token, the TOP_K experts with the largest router logits (ties: the lower id) and
// their weights, then N_SHARED shared experts (ids E .. E+N_SHARED−1, weight 1):
//   out[t, r, 0] = expert id (an exact float), out[t, r, 1] = weight.
// Routed weight = score · route_scale, score = softmax over all E logits (-D ROUTER_SOFTMAX) or
// sigmoid(logit) (-D ROUTER_SIGMOID), divided by the sum of the TOP_K scores when p.norm != 0.
// Scores are monotonic in the logits, so the choice is made on the logits. A NaN logit is never
// picked; a token without TOP_K pickable logits gets id −1 and NaN weights in the missing slots.
// Layout: one invocation per token (E is small: TOP_K passes over E logits).
#include "common.glsl"
layout(constant_id = 1) const uint TOP_K = 1;
layout(constant_id = 2) const uint N_SHARED = 0;
layout(binding = 0) readonly buffer L { float logits[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, E;
    uint l_off, l_s0, l_s1;
    uint o_off, o_s0, o_s1, o_s2;
    uint norm;
    float route_scale;
} p;

float score(float x, float mx, float inv_sum) {
#if defined(ROUTER_SOFTMAX)
    return exp(x - mx) * inv_sum;
#elif defined(ROUTER_SIGMOID)
    return 1.0 / (1.0 + exp(-x));
#else
#error "define ROUTER_SOFTMAX or ROUTER_SIGMOID"
#endif
}

void main() {
    uint t = flat_index();
    if (t >= p.T) return;
    uint lb = p.l_off + t * p.l_s0;
    float mx = -3.402823466e38, sum = 0.0;
#if defined(ROUTER_SOFTMAX)
    for (uint e = 0; e < p.E; ++e) mx = max(mx, logits[lb + e * p.l_s1]);
    for (uint e = 0; e < p.E; ++e) sum += exp(logits[lb + e * p.l_s1] - mx);
#endif
    float inv_sum = 1.0 / sum;
    int ids[TOP_K];
    float w[TOP_K];
    float prev = 0.0, total = 0.0;
    int prev_id = -1;
    [[unroll]] for (uint r = 0; r < TOP_K; ++r) {
        int best = -1;
        float bv = 0.0;
        for (uint e = 0; e < p.E; ++e) {
            float x = logits[lb + e * p.l_s1];
            // strictly after the previous pick in the order (logit desc, id asc); none after a failed pass
            bool below = r == 0 || (prev_id >= 0 && (x < prev || (x == prev && int(e) > prev_id)));
            if (!isnan(x) && below && (best < 0 || x > bv)) { best = int(e); bv = x; }
        }
        ids[r] = best;
        w[r] = best >= 0 ? score(bv, mx, inv_sum) : uintBitsToFloat(0x7FC00000u);
        total += w[r];
        prev = bv;
        prev_id = best;
    }
    float f = p.route_scale / (p.norm != 0 ? total : 1.0);
    uint ob = p.o_off + t * p.o_s0;
    [[unroll]] for (uint r = 0; r < TOP_K; ++r) {
        o[ob + r * p.o_s1] = float(ids[r]);
        o[ob + r * p.o_s1 + p.o_s2] = w[r] * f;
    }
    [[unroll]] for (uint s = 0; s < N_SHARED; ++s) {
        o[ob + (TOP_K + s) * p.o_s1] = float(p.E + s);
        o[ob + (TOP_K + s) * p.o_s1 + p.o_s2] = 1.0;
    }
}
