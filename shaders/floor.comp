#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: OP_STEP | OP_COPY ; - | GRID_STRIDE
// Device-floor kernels (dsv4_vk/cli/floor.py): the cheapest useful dispatch and a plain copy.
// Variants (-D):
//   OP_STEP  d[dst] = d[src] + 1: a one-invocation dispatch (launch with workgroup size 1, grid 1).
//            Chained with src = i, dst = i + 1 each dispatch depends on the one before, and the
//            final value (= chain length) proves every dispatch ran in order.
//   OP_COPY  dst[i] = src[i] over n4 vec4s, one vec4 per invocation (16-byte loads and stores
//            are what a bandwidth-bound kernel would use); grid folded into y (common.glsl).
//            -D GRID_STRIDE: a fixed grid whose invocations loop over the data instead.
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
#else
#error "define OP_STEP or OP_COPY"
#endif
