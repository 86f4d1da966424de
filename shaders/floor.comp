#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: OP_STEP | OP_COPY ; - | GRID_STRIDE
//! variants: OP_FLOAT | OP_READ
// Device-floor kernels (dsv4_vk/cli/floor.py): the cheapest useful dispatch, a plain copy and what the
// arithmetic does at the bottom of its range.
// Variants (-D):
//   OP_STEP  d[dst] = d[src] + 1: a one-invocation dispatch (launch with workgroup size 1, grid 1).
//            Chained with src = i, dst = i + 1 each dispatch depends on the one before, and the
//            final value (= chain length) proves every dispatch ran in order.
//   OP_COPY  dst[i] = src[i] over n4 vec4s, one vec4 per invocation (16-byte loads and stores
//            are what a bandwidth-bound kernel would use); grid folded into y (common.glsl).
//            -D GRID_STRIDE: a fixed grid whose invocations loop over the data instead.
//   OP_READ  reads n4 vec4s from s at vec4 s_off, one per invocation (grid folded into y), and writes
//            nothing but where a sum equals the push constant `never` (a NaN from the host: never
//            equal), so no load is optimised away: the fastest read of a matrix's bytes, what a
//            decode GEMV over them could at best take (its fill and drain included).
//   OP_FLOAT what the arithmetic does at the bottom of f32's and fp16's range with no float-controls
//            execution mode (as every kernel here runs): one invocation, the operands read from the
//            buffer (nothing folds at compile time), each result written beside them:
//              d[8]  = d[0] · d[1]   2^−126 · 0.5: a subnormal result (2^−127, or 0 where flushed)
//              d[9]  = d[2] · d[3]   2^−140 · 2^24: a subnormal operand (2^−116, or 0 where read as 0)
//              d[10] = d[0] + d[2]   2^−126 + 2^−140 (exact, or 2^−126 where the operand is read as 0)
//              d[11] = fp16(d[4])    2^−20 rounded to fp16 by packHalf2x16 (an fp16 subnormal, or 0)
//              d[12] = f32(half)     unpackHalf2x16 of d[5]'s bits, 1: fp16's smallest subnormal, 2^−24 (or 0)
//            Indices from off (push: off, 0 here).
#include "common.glsl"
#if defined(OP_STEP)
layout(binding = 0) buffer D { float d[]; };
layout(push_constant) uniform P { uint src, dst; } p;
void main() { d[p.dst] = d[p.src] + 1.0; }
#elif defined(OP_COPY)
layout(binding = 0) readonly buffer S { vec4 s[]; };
layout(binding = 1) writeonly buffer D { vec4 d[]; };
layout(push_constant) uniform P { uint n4; } p;
void main() {
#if defined(GRID_STRIDE)    // a fixed grid loops over the data (a CUDA-style grid-stride copy)
    uint step = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint i = flat_index(); i < p.n4; i += step) d[i] = s[i];
#else
    uint i = flat_index();
    if (i < p.n4) d[i] = s[i];
#endif
}
#elif defined(OP_READ)
layout(binding = 0) readonly buffer S { vec4 s[]; };
layout(binding = 1) writeonly buffer D { float d[]; };
layout(push_constant) uniform P { uint n4, s_off; float never; } p;
void main() {
    uint i = flat_index();
    if (i < p.n4) {
        vec4 v = s[p.s_off + i];
        if (v.x + v.y + v.z + v.w == p.never) d[0] = 1.0;
    }
}
#elif defined(OP_FLOAT)
layout(binding = 0) buffer D { float d[]; };
layout(push_constant) uniform P { uint off; } p;
void main() {
    uint o = p.off;
    d[o + 8u] = d[o] * d[o + 1u];
    d[o + 9u] = d[o + 2u] * d[o + 3u];
    d[o + 10u] = d[o] + d[o + 2u];
    d[o + 11u] = unpackHalf2x16(packHalf2x16(vec2(d[o + 4u], 0.0))).x;
    d[o + 12u] = unpackHalf2x16(floatBitsToUint(d[o + 5u])).x;
}
#else
#error "define OP_STEP, OP_COPY, OP_READ or OP_FLOAT"
#endif
