#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: -
// MQA_COMBINE: merges MQA_ATTENTION's SPLITS partial results part [T, H, SPLITS, hd + 2] (acc[hd],
// max, sum per part) with the sink: out[t, h, c] = Σ_s e^(max_s − M)·acc_s[c] / (e^(sink − M) +
// Σ_s e^(max_s − M)·sum_s), M = max(sink, max_s). Lanes: one invocation per (t, h, c).
// Push: T, H, hd, splits, part_off, out (off, s0, s1), sink_off.
#include "common.glsl"
layout(binding = 0) readonly buffer Pt { float part[]; };
layout(binding = 1) readonly buffer Sk { float sinks[]; };
layout(binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint T, H, hd, splits, part_off, o_off, o_s0, o_s1, sink_off; } p;

void main() {
    uint i = flat_index();
    if (i >= p.T * p.H * p.hd) return;
    uint c = i % p.hd, th = i / p.hd;
    uint h = th % p.H;
    uint b = p.part_off + th * p.splits * (p.hd + 2);
    float sink = sinks[p.sink_off + h];
    float M = sink;
    for (uint s = 0; s < p.splits; ++s) M = max(M, part[b + s * (p.hd + 2) + p.hd]);
    float den = exp(sink - M), num = 0.0;
    for (uint s = 0; s < p.splits; ++s) {
        uint r = b + s * (p.hd + 2);
        float f = exp(part[r + p.hd] - M);              // an empty part: max = LOWEST, f = 0
        den += f * part[r + p.hd + 1];
        num += f * part[r + c];
    }
    o[p.o_off + (th / p.H) * p.o_s0 + h * p.o_s1 + c] = num / den;
}
