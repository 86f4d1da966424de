#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: LANES=1 | LANES=2,4,8,16,32,64,128 | LANES=2,4,8,16,32,64,128 LANES_SUBGROUP_OPS ; - | MODE_HCA | MODE_CSA
// MQA_ATTENTION: DeepSeek-V4's attention, one shared key = value head for all H query heads.
// For chunk token t at p = pos[0] + t and head h the key list is
//   raw rows j of kv with p − WINDOW < j ≤ p (the sliding window; kv [kv_rows, hd] is a ring,
//   position j in row j % kv_rows), then
//   MODE_HCA: entries w < min((p + 1)/RATE, n_ent) of ent [*, hd] (the closed windows), or
//   MODE_CSA: entries idx[t, s], s < K, skipping −1 (the indexer's top-k);
// out[t, h] = Σ_keys softmax([scale·q·k ..., sink_h]) · k, the sink's probability dropped.
// SPLITS > 1 (decode with long key lists): the list is cut into SPLITS contiguous parts, one
// cluster each, writing (max, sum, acc[hd]) to out viewed as [T, H, SPLITS, hd + 2] (the sink is
// left to MQA_COMBINE, which merges the parts).
// Lanes: one cluster of LANES lanes (lanes.glsl) per (t, h, split); lane l holds channels
// l + LANES·m, m < PER_LANE; online softmax in f32, one cluster sum per key, no shared memory.
// KEYS keys at a time (spec constant 5): their loads, dot products and cluster sums are issued
// together, so that their memory latencies overlap (a decode step is a chain of them), then the
// online softmax takes them one by one in key order — the same arithmetic as one key at a time.
// A position outside [0, capacity) gives NaN.
// Push: T, H, hd, capacity, n_ent, K, q (off, s0, s1), kv_rows, kv (off, s0), ent (off, s0), idx (off, s0),
// out (off, s0, s1), pos_off, sink_off, scale.
#include "lanes.glsl"
layout(constant_id = 1) const uint PER_LANE = 1; // ceil(hd / LANES): channels per lane
layout(constant_id = 2) const uint SPLITS = 1;   // parts of each key list (decode)
layout(constant_id = 3) const uint WINDOW = 1;   // sliding_window
layout(constant_id = 4) const uint RATE = 1;     // the compression rate m (MODE_HCA)
layout(constant_id = 5) const uint KEYS = 1;     // keys loaded and reduced together
layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer KV { float kv[]; };
layout(binding = 2) readonly buffer E { float ent[]; };
layout(binding = 3) readonly buffer I { int idx[]; };
layout(binding = 4) readonly buffer Pos { int pos[]; };
layout(binding = 5) readonly buffer Sk { float sinks[]; };
layout(binding = 6) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, H, hd, capacity, n_ent, K;
    uint q_off, q_s0, q_s1;
    uint kv_rows, kv_off, kv_s0, e_off, e_s0, i_off, i_s0;
    uint o_off, o_s0, o_s1;
    uint pos_off, sink_off;
    float scale;
} p;

const float LOWEST = -3.402823466e38;
float qv[PER_LANE], acc[PER_LANE];
float mx, l;

void add_key(float s, float vals[PER_LANE]) {
    float mn = max(mx, s);
    float corr = exp(mx - mn), e = exp(s - mn);
    l = l * corr + e;
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) acc[m] = acc[m] * corr + e * vals[m];
    mx = mn;
}

void main() {
    uint item = cluster_id();
    if (item >= p.T * p.H * SPLITS) return;             // whole cluster leaves together
    uint lane = cluster_lane();
    uint split = item % SPLITS, th = item / SPLITS;
    uint t = th / p.H, h = th % p.H;
    int pp = pos[p.pos_off] + int(t);
    uint ob = p.o_off + t * p.o_s0 + h * p.o_s1 + split * (p.hd + 2);
    if (pp < 0 || uint(pp) >= p.capacity) {             // uniform per cluster
        for (uint c = lane; c < p.hd + (SPLITS > 1 ? 2 : 0); c += LANES) o[ob + c] = uintBitsToFloat(0x7FC00000u);
        return;
    }
    uint qb = p.q_off + t * p.q_s0 + h * p.q_s1;
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = lane + LANES * m;
        qv[m] = c < p.hd ? q[qb + c] * p.scale : 0.0;
        acc[m] = 0.0;
    }
    if (SPLITS > 1) { mx = LOWEST; l = 0.0; }
    else { mx = sinks[p.sink_off + h]; l = 1.0; }       // the sink: logit only, no value
    uint j0 = uint(max(pp - int(WINDOW) + 1, 0));
    uint n_raw = uint(pp) + 1 - j0;
#if defined(MODE_HCA)
    uint n_c = min((uint(pp) + 1) / RATE, p.n_ent);
#elif defined(MODE_CSA)
    uint n_c = p.K;
#else
    uint n_c = 0;
#endif
    uint n = n_raw + n_c;
    uint per = (n + SPLITS - 1) / SPLITS;
    uint s0 = min(split * per, n), s1 = min(s0 + per, n);
    for (uint s = s0; s < s1; s += KEYS) {
        float vals[KEYS][PER_LANE];
        float d[KEYS];
        bool ok[KEYS];
        [[unroll]] for (uint k = 0; k < KEYS; ++k) {
            uint sk = s + k;
            ok[k] = sk < s1;                              // uniform per cluster, as every test here
            bool raw = sk < n_raw;
            uint b = 0u;
            if (ok[k] && raw) {
                b = p.kv_off + ((j0 + sk) % p.kv_rows) * p.kv_s0;
            } else if (ok[k]) {
#if defined(MODE_CSA)
                int w = idx[p.i_off + t * p.i_s0 + (sk - n_raw)];
                ok[k] = w >= 0 && uint(w) < p.n_ent;      // −1: no entry
                b = p.e_off + uint(max(w, 0)) * p.e_s0;
#else
                b = p.e_off + (sk - n_raw) * p.e_s0;
#endif
            }
            d[k] = 0.0;
            [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
                uint c = lane + LANES * m;
                float v = 0.0;
                if (ok[k] && c < p.hd) v = raw ? kv[b + c] : ent[b + c];
                vals[k][m] = v;
                d[k] += qv[m] * v;
            }
        }
        [[unroll]] for (uint k = 0; k < KEYS; ++k) d[k] = cluster_sum(d[k]);   // every lane, every k
        [[unroll]] for (uint k = 0; k < KEYS; ++k)
            if (ok[k]) add_key(d[k], vals[k]);
    }
    float inv = SPLITS > 1 ? 1.0 : 1.0 / l;             // parts stay unnormalised for MQA_COMBINE
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = lane + LANES * m;
        if (c < p.hd) o[ob + c] = acc[m] * inv;
    }
    if (SPLITS > 1 && lane == 0) { o[ob + p.hd] = mx; o[ob + p.hd + 1] = l; }
}
