#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | VEC4 ; - | FINAL
// HC_MIX / HC_MIX_PART, the per-token kernel (decode and few tokens): a site's flat RMS norm and
// mixes mat-mul, mix[t,j] = (x_t · fn[j]) / sqrt(mean(x_t²) + norm_eps) with x_t = X[t] flattened
// (4·D), reading each token's X once for all M mixes and its sum of squares.
// Layout: workgroup g → token g / G and split g % G of the D axis: chunks [split·slice,
// (split+1)·slice) of each of the 4 streams. A chunk is a vec4 with -D VEC4, else one float. The
// workgroup is 4 groups of WG/4 invocations, group s taking stream s: invocation i takes chunks
// i % (WG/4), + WG/4, ... of its split in stream i / (WG/4), loads x and each fn row's chunk once and
// keeps the M + 1 running sums in registers (hc_mixacc.glsl); then they are reduced across the
// workgroup (wg_reduce.glsl: subgroupAdd + one shared-memory step). One stream an invocation, as
// HC_POST_MIX: at decode this pass is a chain of latencies, and 4× the invocations with a quarter of
// the fn loads each finish it sooner.
//   default: partials[t, split, 0..M−1] = the split's dot products, [t, split, M] = its Σx² — the
//            layout the whole-site kernel (hc_site.comp) and hc_mix_reduce.comp finish;
//   FINAL:   (G = 1 only) mix[t, j] directly.
// Spec constants: 0 workgroup size (a multiple of 4), 1 M (mix rows: a multiple of 4, ≤ 24).
// Push: T, chunks per stream, slice (chunks per split), G, 1/(4·D), norm_eps, X (offset, token and
//   stream strides, in chunks), fn (offset, row stride, in chunks; fn[j, s·D + d] is chunk
//   s·chunks + c of row j), out (offset, token stride, split or row stride), tb (unused here).
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

#define WG_NV (M + 1u)
#define WG_NV_MAX 25
#include "wg_reduce.glsl"
#define FN(i) fn[i]
#include "hc_mixacc.glsl"

void main() {
    uint g = flat_group();
    uint t = g / p.G, split = g % p.G;
    uint c_end = min((split + 1u) * p.slice, p.chunks);
    MixAcc A = mixacc_zero();
    uint q = gl_WorkGroupSize.x / 4u, s = gl_LocalInvocationID.x / q;     // (WG a multiple of 4)
    if (t < p.T) {                             // workgroup-uniform: a folded grid's extra groups idle
        uint xb = p.x_off + t * p.x_st + s * p.x_ss;
        for (uint c = split * p.slice + gl_LocalInvocationID.x % q; c < c_end; c += q)
            mixacc_add(A, x[xb + c], p.f_off + s * p.chunks + c, p.f_sj, true);
    }
    mixacc_put(A);
    barrier();
    if (t >= p.T) return;
    for (uint k = gl_LocalInvocationID.x; k <= M; k += gl_WorkGroupSize.x) {   // invocation k stores value k
#if defined(FINAL)
        if (k < M) out_[p.o_off + t * p.o_st + k * p.o_s2] = wg_total(k) / sqrt(wg_total(M) * p.inv_k + p.norm_eps);
#else
        out_[p.o_off + t * p.o_st + split * p.o_s2 + k] = wg_total(k);
#endif
    }
}
