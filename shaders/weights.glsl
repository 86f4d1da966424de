// Weight reads whatever the weights' storage, binding W_BINDING (default 1). Callers address a
// weight row by wb, the index of its first element in the bound tensor's own units (elements for
// float weights, 32-bit words for quantised ones), and k along the row:
//   W1_ROW(wb, k)  element k (float weights: at wb + k·W_S3, W_S3 defined by the shader);
//   W4_ROW(wb, j)  elements 4j..4j+3 as a vec4 (with VEC4: k contiguous, rows 16-byte aligned for
//                  float weights, K % 4 == 0 for quantised ones).
// Every value is widened to f32 in registers, so every product accumulates in f32.
//   (default)  f32;
//   W_BF16 / W_F16  16-bit values read in pairs from uint words (element 2i in the low half);
//   W_FP8      DeepSeek's FP8 linears: E4M3 bytes (4 a word, element 4i in the low byte), one E8M0
//              scale byte per 128 × 128 block (w = q · 2^(s − 127));
//   W_FP4      DeepSeek's routed experts: E2M1 nibbles (8 a word, element 2i in the low nibble of
//              its byte), one E8M0 scale byte per 32 consecutive inputs of a row.
// -D SHARED_FP8 adds a second, FP8 weight (S4_ROW / S1_ROW; see the end of the file).
// Quantised rows are whole words (a row of K codes padded to q_kw words); the scale bytes of the
// whole tensor are packed 4 a word at binding W_SCALE_BINDING, grid per matrix of q_rows rows:
// ceil(q_rows / BR) × q_sc (BR = 128 for FP8, 1 for FP4), matrices one after the other. The
// shader's push block has q_kw, q_rows, q_srows (= ceil(q_rows / BR)) and q_sc, and is declared
// before this file is included. E4M3 / E2M1 codes become halves by moving their bits into a
// half's sign, exponent and mantissa (exact, subnormals included: e.g. E4M3 0.eee.mmm → half
// 0.0eeee.mmm0000000 = the code's value · 2^−8); that power of two goes into the scale.
#ifndef W_BINDING
#define W_BINDING 1
#endif
#if defined(W_FP8) || defined(W_FP4) || defined(SHARED_FP8)
float q_e8m0(uint b) { return b == 0u ? uintBitsToFloat(0x00400000u) : uintBitsToFloat(b << 23); }
// The E8M0 scale of byte i % 4 of a word of packed scale bytes (the word i / 4 of the scales): a
// load and its decode apart, for kernels that load a step ahead
float q_e8m0_of(uint word, uint i) { return q_e8m0((word >> ((i & 3u) << 3)) & 0xFFu); }
// E4M3 bytes 0, 1 of v as a half pair (sign to bit 15, exponent and mantissa to bits 7..13): the
// values · 2^−8
uint q_fp8_pair(uint v) {
    return ((v & 0x80u) << 8) | ((v & 0x7Fu) << 7) | ((v & 0x8000u) << 16) | ((v & 0x7F00u) << 15);
}
vec4 q_fp8x4(uint v) { return vec4(unpackHalf2x16(q_fp8_pair(v)), unpackHalf2x16(q_fp8_pair(v >> 16))); }
// E2M1 nibbles 0, 1 of v as a half pair (sign to bit 15, exponent and mantissa to bits 9..11): the
// values · 2^−14
uint q_fp4_pair(uint v) {
    return ((v & 0x8u) << 12) | ((v & 0x7u) << 9) | ((v & 0x80u) << 24) | ((v & 0x70u) << 21);
}
vec4 q_fp4x4(uint v) { return vec4(unpackHalf2x16(q_fp4_pair(v)), unpackHalf2x16(q_fp4_pair(v >> 8))); }
// A whole word of codes in fewer operations (the staged kernels, -D X_SHARED): the same exact halves
// as above, in k order. E4M3: codes 16 bits apart become a half pair with one shift and mask for
// their exponents and mantissas and one for their signs. E2M1: first each byte's low (e) and high
// (o) nibble laid out as a half's high byte wants it (exponent and mantissa at bits 1..3, sign at
// 7), then a pair of such bytes 16 bits apart is one mask (bytes 1, 3) or a shift and a mask
// (bytes 0, 2) away from a half pair: 13 operations a word rather than 15.
vec4 q_fp8_word(uint v) {               // E4M3 bytes 0..3 · 2^−8
    vec2 a = unpackHalf2x16(((v << 7) & 0x3F803F80u) | ((v << 8) & 0x80008000u));      // bytes 0, 2
    vec2 b = unpackHalf2x16(((v >> 1) & 0x3F803F80u) | (v & 0x80008000u));             // bytes 1, 3
    return vec4(a.x, b.x, a.y, b.y);
}
void q_fp4_word(uint v, out vec4 lo, out vec4 hi) {    // E2M1 nibbles 0..3, 4..7 · 2^−14
    uint e = ((v << 1) & 0x0E0E0E0Eu) | ((v << 4) & 0x80808080u);      // nibbles 0, 2, 4, 6
    uint o = ((v >> 3) & 0x0E0E0E0Eu) | (v & 0x80808080u);             // nibbles 1, 3, 5, 7
    vec2 a = unpackHalf2x16((e << 8) & 0x8E008E00u);                   // nibbles 0, 4
    vec2 b = unpackHalf2x16((o << 8) & 0x8E008E00u);                   // 1, 5
    vec2 c = unpackHalf2x16(e & 0x8E008E00u);                          // 2, 6
    vec2 d = unpackHalf2x16(o & 0x8E008E00u);                          // 3, 7
    lo = vec4(a.x, b.x, c.x, d.x);
    hi = vec4(a.y, b.y, c.y, d.y);
}
// The scale byte index of element k of the row at word wb of a tensor with kw words a row, a grid
// per `rows` rows of srows × sc (blocks of br × bc); the row and grid divisions are loop-invariant.
uint q_sindex(uint wb, uint k, uint kw, uint rows, uint srows, uint sc, uint br, uint bc) {
    uint row = wb / kw;
    uint m = row / rows;
    return (m * srows + (row - m * rows) / br) * sc + k / bc;
}
#endif
#if defined(W_FP8) || defined(W_FP4)
#define W_QUANT 1
layout(binding = W_BINDING) readonly buffer W { uint wq[]; };
layout(binding = W_SCALE_BINDING) readonly buffer WScale { uint wscale[]; };
#if defined(W_FP8)
const uint Q_BR = 128u, Q_BC = 128u;
const float Q_UNIT = 256.0;             // half(code bits) · 2^8 = the E4M3 value
#else
const uint Q_BR = 1u, Q_BC = 32u;
const float Q_UNIT = 16384.0;           // half(code bits) · 2^14 = the E2M1 value
#endif
float q_scale_at(uint i) { return q_e8m0_of(wscale[i >> 2], i) * Q_UNIT; }
float q_scale(uint wb, uint k) { return q_scale_at(q_sindex(wb, k, p.q_kw, p.q_rows, p.q_srows, p.q_sc, Q_BR, Q_BC)); }
// 16-byte steps (rows of whole uvec4s, 16-byte aligned: FP8 K % 16 == 0, FP4 K % 32 == 0): uvec4
// j of the row at word wb, wq4[wb / 4 + j], holds Q_XV · 4 weights, the x vec4s Q_XV·j .. +Q_XV−1,
// under one scale byte, q_scale_at(q_scale_row(wb) + j · Q_XV · 4 / Q_BC).
layout(binding = W_BINDING) readonly buffer WQ4 { uvec4 wq4[]; };
#if defined(W_FP8)
const uint Q_XV = 4u;
#else
const uint Q_XV = 8u;
#endif
uint q_scale_row(uint wb) {             // the first scale byte of the row's grid row
    uint row = wb / p.q_kw, m = row / p.q_rows;
    return (m * p.q_srows + (row - m * p.q_rows) / Q_BR) * p.q_sc;
}
float q_wide_dot(uvec4 v, vec4 xv[Q_XV]) {     // Σ x · code value (unscaled)
#if defined(W_FP8)
    return dot(xv[0], q_fp8x4(v.x)) + dot(xv[1], q_fp8x4(v.y)) + dot(xv[2], q_fp8x4(v.z)) + dot(xv[3], q_fp8x4(v.w));
#else
    return dot(xv[0], q_fp4x4(v.x)) + dot(xv[1], q_fp4x4(v.x >> 16)) + dot(xv[2], q_fp4x4(v.y)) +
           dot(xv[3], q_fp4x4(v.y >> 16)) + dot(xv[4], q_fp4x4(v.z)) + dot(xv[5], q_fp4x4(v.z >> 16)) +
           dot(xv[6], q_fp4x4(v.w)) + dot(xv[7], q_fp4x4(v.w >> 16));
#endif
}
// The same sum, decoded with q_fp8_word / q_fp4_word and accumulated by fused multiply-adds in two
// chains (the staged kernels, -D X_SHARED)
float q_wide_dot_fast(uvec4 v, vec4 xv[Q_XV]) {
    float a = 0.0, b = 0.0;
    [[unroll]] for (uint c = 0; c < 4u; ++c) {
#if defined(W_FP8)
        vec4 w = q_fp8_word(v[c]), x = xv[c];
        a = fma(x.x, w.x, fma(x.y, w.y, a));
        b = fma(x.z, w.z, fma(x.w, w.w, b));
#else
        vec4 lo, hi;
        q_fp4_word(v[c], lo, hi);
        vec4 x = xv[2u * c], y = xv[2u * c + 1u];
        a = fma(x.x, lo.x, fma(x.y, lo.y, fma(x.z, lo.z, fma(x.w, lo.w, a))));
        b = fma(y.x, hi.x, fma(y.y, hi.y, fma(y.z, hi.z, fma(y.w, hi.w, b))));
#endif
    }
    return a + b;
}
#if defined(W_FP8)
vec4 W4_ROW(uint wb, uint j) { return q_fp8x4(wq[wb + j]) * q_scale(wb, 4u * j); }
float W1_ROW(uint wb, uint k) {
    return unpackHalf2x16(q_fp8_pair((wq[wb + (k >> 2)] >> ((k & 3u) << 3)) & 0xFFu)).x * q_scale(wb, k);
}
#else
vec4 W4_ROW(uint wb, uint j) { return q_fp4x4(wq[wb + (j >> 1)] >> ((j & 1u) << 4)) * q_scale(wb, 4u * j); }
float W1_ROW(uint wb, uint k) {
    return unpackHalf2x16(q_fp4_pair((wq[wb + (k >> 3)] >> ((k & 7u) << 2)) & 0xFu)).x * q_scale(wb, k);
}
#endif
#else
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
vec4 w_half4(uvec2 v) {                 // four 16-bit values, element 4j in the low half of v.x
    return vec4(w_half(v.x & 0xFFFFu), w_half(v.x >> 16), w_half(v.y & 0xFFFFu), w_half(v.y >> 16));
}
vec4 W4_AT(uint j) { return w_half4(w64[j]); }
#endif
#else
layout(binding = W_BINDING) readonly buffer W { float w[]; };
#if defined(VEC4)
layout(binding = W_BINDING) readonly buffer W4 { vec4 w4[]; };
#endif
#define W_AT(i) w[i]
#define W4_AT(j) w4[j]
#endif
#define W1_ROW(wb, k) W_AT((wb) + (k) * W_S3)
#define W4_ROW(wb, j) W4_AT((wb) / 4 + (j))
#endif
#if defined(SHARED_FP8)
// -D SHARED_FP8 (MUL_MAT_ID): one more expert, the shared one, in FP8 beside other experts: its
// codes at binding WS_BINDING (S_KW = ceil(K / 4) words a row), its scale bytes at
// WS_SCALE_BINDING (a grid per p.s_rows rows), read by S4_ROW / S1_ROW as W4_ROW / W1_ROW read the
// others.
layout(binding = WS_BINDING) readonly buffer WShared { uint wsq[]; };
layout(binding = WS_SCALE_BINDING) readonly buffer WSharedScale { uint wsscale[]; };
#define S_KW ((p.K + 3u) / 4u)
float s_scale(uint wb, uint k) {
    uint i = q_sindex(wb, k, S_KW, p.s_rows, (p.s_rows + 127u) / 128u, (p.K + 127u) / 128u, 128u, 128u);
    return q_e8m0_of(wsscale[i >> 2], i) * 256.0;
}
vec4 S4_ROW(uint wb, uint j) { return q_fp8x4(wsq[wb + j]) * s_scale(wb, 4u * j); }
float S1_ROW(uint wb, uint k) {
    return unpackHalf2x16(q_fp8_pair((wsq[wb + (k >> 2)] >> ((k & 3u) << 3)) & 0xFFu)).x * s_scale(wb, k);
}
#endif
