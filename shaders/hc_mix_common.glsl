// Shared by the mixes kernels (hc_mix_*.comp): the mix rows M (spec constant 1) and the chunk type
// VEC (a vec4 with -D VEC4, else one float) with its dot product.
#include "common.glsl"
layout(constant_id = 1) const uint M = 24;     // mix rows: a multiple of 4, at most 24

#if defined(VEC4)
#define VEC vec4
float dot_v(vec4 a, vec4 b) { return dot(a, b); }
#else
#define VEC float
float dot_v(float a, float b) { return a * b; }
#endif
