// Weight reads by element index, whatever the weights' precision: binding W_BINDING (default 1)
// holds f32 (default),
// bf16 (-D W_BF16) or f16 (-D W_F16) values; 16-bit weights are read in pairs from uint words
// (element 2i in the low half: little-endian) and widened to f32, so every product accumulates
// in f32 as with f32 weights. W_AT(i): element i; W4_AT(j): elements 4j..4j+3 (with VEC4);
// W8_AT(j, lo, hi): elements 8j..8j+7 (16-bit weights with -D W8).
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
vec4 w_halves4(uvec2 v) { return vec4(w_half(v.x & 0xFFFFu), w_half(v.x >> 16), w_half(v.y & 0xFFFFu), w_half(v.y >> 16)); }
vec4 W4_AT(uint j) { return w_halves4(w64[j]); }
#endif
#if defined(W8)
// -D W8 (with VEC4): elements 8j..8j+7 in one 16-byte load, the halves as two vec4
layout(binding = W_BINDING) readonly buffer W128 { uvec4 w128[]; };
void W8_AT(uint j, out vec4 lo, out vec4 hi) {
    uvec4 v = w128[j];
    lo = w_halves4(v.xy);
    hi = w_halves4(v.zw);
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
