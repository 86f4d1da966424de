#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | ROPE
// MQA_COMBINE: merges MQA_ATTENTION's SPLITS partial results part [T, H, SPLITS, hd + 2] (acc[hd],
// max, sum per part) with the sink: out[t, h, c] = Σ_s e^(max_s − M)·acc_s[c] / (e^(sink − M) +
// Σ_s e^(max_s − M)·sum_s), M = max(sink, max_s). Lanes: one invocation per (t, h, c).
// -D ROPE: then the output's trailing 2·half channels de-rotated as ROPE inverse=True does at
// position pos[0] + t (V carries RoPE): an invocation also merges its channel's pair partner.
// SPLITS (spec constant 1) is the parts' count: the loops over them unroll, so an invocation's loads
// of every part are issued together (with a push-constant count they were a chain of memory
// latencies: one step per part).
// The merge itself: mqa_merge.glsl (shared with mqa_attention.comp's one-dispatch form -D MERGE).
// Push: T, H, hd, splits, part_off, out (off, s0, s1), sink_off[, half, capacity, pos_off, cos_off,
// sin_off, tab_s0].
#include "common.glsl"
layout(binding = 0) readonly buffer Pt { float part[]; };
layout(binding = 1) readonly buffer Sk { float sinks[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
#if defined(ROPE)
layout(binding = 3) readonly buffer Pos { int pos[]; };
layout(binding = 4) readonly buffer Cos { float cos_t[]; };
layout(binding = 5) readonly buffer Sin { float sin_t[]; };
#include "rope.glsl"
#endif
layout(push_constant) uniform P {
    uint T, H, hd, splits, part_off, o_off, o_s0, o_s1, sink_off;
#if defined(ROPE)
    uint half_rd, capacity, pos_off, cos_off, sin_off, tab_s0;
#endif
} p;
layout(constant_id = 1) const uint SPLITS = 1;

float merge_max(uint r) { return part[r + p.hd]; }
float merge_sum(uint r) { return part[r + p.hd + 1u]; }
float merge_acc(uint r, uint c) { return part[r + c]; }
#define MERGE_T float
#define MERGE_STEP SPLITS
#define MERGE_STATS_STEP SPLITS
#define MERGE_N 1
#include "mqa_merge.glsl"

void main() {
    uint i = flat_index();
    if (i >= p.T * p.H * p.hd) return;
    uint c = i % p.hd, th = i / p.hd;
    uint h = th % p.H, t = th / p.H;
    uint b = p.part_off + th * SPLITS * (p.hd + 2);
    vec2 md = merge_scale(b, p.hd + 2u, sinks[p.sink_off + h]);
    float v[1];
    merge_channels(b, p.hd + 2u, md, c, 0u, v);
#if defined(ROPE)
    uint first = p.hd - 2u * p.half_rd;                 // even: pairs (c, c ^ 1)
    uint cp = c >= first ? c ^ 1u : c;                  // the pair partner, merged beside c
    float vp[1];
    merge_channels(b, p.hd + 2u, md, cp, 0u, vp);
    v[0] = rope_channel(v[0], vp[0], c, first, pos[p.pos_off] + int(t), p.capacity, p.cos_off, p.sin_off, p.tab_s0,
                        true);                          // the inverse rotation
#endif
    o[p.o_off + t * p.o_s0 + h * p.o_s1 + c] = v[0];
}
