#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: LANES=1 | LANES=2,4,8,16,32,64,128 | LANES=2,4,8,16,32,64,128 LANES_SUBGROUP_OPS
// SAMPLE: a token per row of logits [T, V], on the device. cfg = (temperature, top_k) (f32 buffer),
// state = (seed, counter) (i32 buffer). The top_k largest finite logits (ties: the lower id) are
// found by top_k passes of a cluster argmax; temperature ≤ 0 or top_k = 1 is greedy (the first);
// otherwise candidate j has weight exp((v_j − v_0)/temperature) and the draw u ∈ [0, 1) of row r is
// a PCG hash of (seed, counter + r). After the draws the counter advances by T (one workgroup,
// so a barrier orders every read of the state before that write). A row without any finite logit
// gets token −1.
// Layout: ONE workgroup; clusters of LANES lanes (lanes.glsl) take rows r = cluster, cluster +
// clusters, ...; lane l scans ids l, l+LANES, ... Candidates live in per-lane arrays (MAX_TOP_K).
#include "lanes.glsl"
layout(constant_id = 1) const int MAX_TOP_K = 64;   // candidates per lane array
layout(binding = 0) readonly buffer L { float logits[]; };
layout(binding = 1) readonly buffer C { float cfg[]; };
layout(binding = 2) buffer S { int state[]; };
layout(binding = 3) writeonly buffer O { int tokens[]; };
layout(push_constant) uniform P {
    uint T, V;
    uint l_off, l_s0, l_s1;
    uint cfg_off, st_off;
    uint o_off, o_s0;
} p;

#define NEG_INF uintBitsToFloat(0xFF800000u)

uint pcg(uint v) {
    uint s = v * 747796405u + 2891336453u;
    uint word = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (word >> 22u) ^ word;
}

void main() {
    float temperature = cfg[p.cfg_off];
    int top_k = clamp(int(cfg[p.cfg_off + 1]), 1, MAX_TOP_K);
    if (!(temperature > 0.0)) top_k = 1;
    uint seed = uint(state[p.st_off]), counter = uint(state[p.st_off + 1]);
    uint clusters = gl_WorkGroupSize.x / LANES;
    uint lane = cluster_lane();
    for (uint row = cluster_id(); row < p.T; row += clusters) {      // uniform per cluster
        uint lb = p.l_off + row * p.l_s0;
        float vals[MAX_TOP_K];
        int ids[MAX_TOP_K];
        int n = 0;
        float pv = 0.0;
        uint pi = 0;
        for (int r = 0; r < top_k; ++r) {
            float bv = NEG_INF;
            uint bi = 0xFFFFFFFFu;
            for (uint j = lane; j < p.V; j += LANES) {
                float v = logits[lb + j * p.l_s1];
                if (isnan(v) || isinf(v)) continue;
                bool below = r == 0 || v < pv || (v == pv && j > pi);     // after the previous pick
                if (below && (v > bv || (v == bv && j < bi))) { bv = v; bi = j; }
            }
            float m = cluster_max(bv);
            if (m == NEG_INF) break;                                     // no candidate left
            pi = uint(-cluster_max(bv == m ? -float(bi) : NEG_INF));      // lowest id holding m
            pv = m;
            vals[n] = m;
            ids[n] = int(pi);
            ++n;
        }
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
}
