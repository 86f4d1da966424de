#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: VEC4
// The element layout of the device's cooperative matrices (VK_NV_cooperative_matrix, 16 × 16 and
// 16 × 8 fp16, 16 × 8 fp32): one subgroup of 32 lanes loads matrices whose entries are their own flat
// indices and writes, per lane, which entry each of its elements is — A's [32 × 8], B's [32 × 4], C's
// [32 × 4], then the element counts (8, 4, 4 as 80404). hc.tcr.tcr_layout turns it into TCR's spec
// constants, or a reason TCR cannot run on the device. One dispatch of one workgroup of 32.
// Bindings: 0, 1 unused, 2 the output (520 floats). No push constants.
#include "hc_mix_common.glsl"
// restrict: bindings never alias within a dispatch, so loads may be hoisted and batched (latency)
layout(binding = 0) restrict readonly buffer X { VEC x[]; };
layout(binding = 1) restrict readonly buffer Fn { VEC fn[]; };
layout(binding = 2) restrict writeonly buffer Out { float out_[]; };
layout(push_constant) uniform P {
    uint T, chunks, slice, G;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_s2;
    uint tb;                                   // (tokens per workgroup in the kernels of many tokens)
} p;

#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

// The device's element layout of the 16 × 16 A, 16 × 8 B and 16 × 8 C matrices TCR uses, for
// hc.tcr.tcr_layout: one subgroup of 32 loads matrices whose entry (r, c) is its flat index and
// writes lane l's element e at out[l·8 + e] (A), 256 + l·4 + e (B), 384 + l·4 + e (C).
shared float16_t pa[256], pb[128];
shared float pc[128];
void main() {
    uint l = gl_LocalInvocationID.x;
    for (uint i = l; i < 256u; i += 32u) pa[i] = float16_t(float(i));
    for (uint i = l; i < 128u; i += 32u) { pb[i] = float16_t(float(i)); pc[i] = float(i); }
    barrier();
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b;
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> c;
    coopMatLoadNV(a, pa, 0u, 16u, false);
    coopMatLoadNV(b, pb, 0u, 8u, false);
    coopMatLoadNV(c, pc, 0u, 8u, false);
    for (uint e = 0u; e < 8u; ++e) out_[l * 8u + e] = e < uint(a.length()) ? float(a[e]) : -1.0;
    for (uint e = 0u; e < 4u; ++e) out_[256u + l * 4u + e] = e < uint(b.length()) ? float(b[e]) : -1.0;
    for (uint e = 0u; e < 4u; ++e) out_[384u + l * 4u + e] = e < uint(c.length()) ? c[e] : -1.0;
    if (l == 0u) out_[512] = float(a.length() * 10000 + b.length() * 100 + c.length());
}
