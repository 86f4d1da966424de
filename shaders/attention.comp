#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; - | ROPE_Q
// ATTENTION over a KV cache: out[t, h, :] = Σ_{j < n} softmax_j(scale · q̃[t, h]·k[j, h]) · v[j, h]
// with p = pos[0] + t read from a device buffer, n = p + 1 (causal: the chunk's own keys were
// written to the cache by KV_WRITE before this dispatch) and q̃ = RoPE(q) at position p (-D ROPE_Q).
// A token with p outside [0, capacity) gets NaN (it has no valid cache row).
// Layout: one cluster of LANES lanes (lanes.glsl) per (t, h). Lane l holds the RoPE pairs
// i = l + LANES·m, m < PAIRS (dims 2i, 2i+1) of q̃ and of the running output, so each key costs one
// cluster sum; online softmax (running max and sum) in f32, no shared memory.
#include "lanes.glsl"
layout(constant_id = 1) const uint PAIRS = 1;   // ceil(head_dim / 2 / LANES): pairs per lane
layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
layout(binding = 2) readonly buffer Cos { float cos_t[]; };
layout(binding = 3) readonly buffer Sin { float sin_t[]; };
layout(binding = 4) readonly buffer K { float k[]; };
layout(binding = 5) readonly buffer V { float v[]; };
layout(binding = 6) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, H, half_dim, capacity;
    uint q_off, q_s0, q_s1, q_s2;
    uint k_off, k_s0, k_s1, k_s2;
    uint v_off, v_s0, v_s1, v_s2;
    uint o_off, o_s0, o_s1, o_s2;
    uint pos_off, cos_off, sin_off, tab_s0;
    float scale;
} p;

const float LOWEST = -3.402823466e38;

void main() {
    uint item = cluster_id();
    if (item >= p.T * p.H) return;                      // whole cluster leaves together
    uint lane = cluster_lane();
    uint t = item / p.H, h = item % p.H;
    int pp = pos[p.pos_off] + int(t);
    uint ob = p.o_off + t * p.o_s0 + h * p.o_s1;
    if (pp < 0 || uint(pp) >= p.capacity) {             // uniform per cluster
        for (uint i = lane; i < p.half_dim; i += LANES) {
            o[ob + 2 * i * p.o_s2] = uintBitsToFloat(0x7FC00000u);
            o[ob + (2 * i + 1) * p.o_s2] = uintBitsToFloat(0x7FC00000u);
        }
        return;
    }
    uint qb = p.q_off + t * p.q_s0 + h * p.q_s1;
    vec2 qr[PAIRS], acc[PAIRS];
    [[unroll]] for (uint m = 0; m < PAIRS; ++m) {
        uint i = lane + LANES * m;
        qr[m] = vec2(0.0);
        acc[m] = vec2(0.0);
        if (i < p.half_dim) {
            vec2 a = vec2(q[qb + 2 * i * p.q_s2], q[qb + (2 * i + 1) * p.q_s2]);
#if defined(ROPE_Q)
            float cs = cos_t[p.cos_off + uint(pp) * p.tab_s0 + i];
            float sn = sin_t[p.sin_off + uint(pp) * p.tab_s0 + i];
            a = vec2(a.x * cs - a.y * sn, a.x * sn + a.y * cs);
#endif
            qr[m] = a * p.scale;
        }
    }
    float mx = LOWEST, l = 0.0;
    uint n = uint(pp) + 1;
    for (uint j = 0; j < n; ++j) {
        uint kb = p.k_off + j * p.k_s0 + h * p.k_s1;
        float d = 0.0;
        [[unroll]] for (uint m = 0; m < PAIRS; ++m) {
            uint i = lane + LANES * m;
            if (i < p.half_dim) d += dot(qr[m], vec2(k[kb + 2 * i * p.k_s2], k[kb + (2 * i + 1) * p.k_s2]));
        }
        float s = cluster_sum(d);
        float mn = max(mx, s);
        float corr = exp(mx - mn), e = exp(s - mn);
        l = l * corr + e;
        uint vb = p.v_off + j * p.v_s0 + h * p.v_s1;
        [[unroll]] for (uint m = 0; m < PAIRS; ++m) {
            uint i = lane + LANES * m;
            vec2 vv = i < p.half_dim ? vec2(v[vb + 2 * i * p.v_s2], v[vb + (2 * i + 1) * p.v_s2]) : vec2(0.0);
            acc[m] = acc[m] * corr + e * vv;
        }
        mx = mn;
    }
    float inv = 1.0 / l;
    [[unroll]] for (uint m = 0; m < PAIRS; ++m) {
        uint i = lane + LANES * m;
        if (i < p.half_dim) {
            o[ob + 2 * i * p.o_s2] = acc[m].x * inv;
            o[ob + (2 * i + 1) * p.o_s2] = acc[m].y * inv;
        }
    }
}
