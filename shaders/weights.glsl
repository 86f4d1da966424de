// Weight reads by element index, whatever the weights' precision: binding W_BINDING (default 1)
// holds f32 (default),
// bf16 (-D W_BF16) or f16 (-D W_F16) values; 16-bit weights are read in pairs from uint words
// (element 2i in the low half: little-endian) and widened to f32, so every product accumulates
// in f32 as with f32 weights. W_AT(i): element i; W4_AT(j): elements 4j..4j+3 (with VEC4).
#ifndef W_BINDING
#define W_BINDING 1
#endif
#if defined(W_BF16) || defined(W_F16)
layout(binding = W_BINDING) readonly buffer W { uint w32[]; };
#if defined(VEC4)
layout(binding = W_BINDING) readonly buffer W4 { uvec2 w64[]; };
#endif
#if defined(W_BF16)
float w_half(uint h) { return uintBitsToFloat(h << 16); }
#else
float w_half(uint h) { return unpackHalf2x16(h).x; }
#endif
float W_AT(uint i) {
    uint v = w32[i >> 1];
    return w_half((i & 1u) != 0u ? v >> 16 : v & 0xFFFFu);
}
#if defined(VEC4)
vec4 W4_AT(uint j) {
    uvec2 v = w64[j];
    return vec4(w_half(v.x & 0xFFFFu), w_half(v.x >> 16), w_half(v.y & 0xFFFFu), w_half(v.y >> 16));
}
#endif
#else
layout(binding = W_BINDING) readonly buffer W { float w[]; };
#if defined(VEC4)
layout(binding = W_BINDING) readonly buffer W4 { vec4 w4[]; };
#endif
#define W_AT(i) w[i]
#define W4_AT(j) w4[j]
#endif
