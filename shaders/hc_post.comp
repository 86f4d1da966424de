#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | VEC4 ; - | MIX_NEXT
// HC_POST: out[t,d,:] = f[t,:]·post[t,d] + Σ_s comb[t,s,d] · res[t,s,:]
//   (f [T,D], res [T,4,D], post [T,4], comb [T,4,4] = comb[t,src,dst], out [T,4,D]).
// Layout: each workgroup covers one slice of one token: group g → token g / groups_per_token,
// chunk (g % groups_per_token)·WG + local id. A chunk is a vec4 of D (-D VEC4, when D, offsets and
// strides are multiples of 4) or one float. Each invocation reads its chunk of f and of the 4
// source streams once and writes all 4 destinations (5 reads, 4 writes per chunk: the minimum).
// The 4 post and 16 comb values are workgroup-uniform loads (one token per workgroup), no shared
// memory + barrier. Sum order as the unfused chain: f·post, then + res_s·comb[s,d] for s = 0..3.
// Push: T, chunks per token, groups per token, offsets/strides (f, res, out in chunk units).
// -D MIX_NEXT (the layer boundary of a whole site, HC_POST_MIX): the same pass also starts the
//   next site — its mixes' partial sums over this workgroup's slice of the new streams, which
//   are still in registers: partials[t, slice, j] = Σ_{d, c in slice} out[t,d,c]·fn_next[j, d·D + c]
//   (j < M, spec constant 2) and [t, slice, M] = Σ out², reduced across the workgroup
//   (wg_reduce.glsl) — hc_mix_token.comp's partials layout, finished by hc_site.comp. Bindings 4 fn_next,
//   5 out, 6 partials; push adds fn_next (offset, row stride, chunks) and partials (offset, token
//   and split strides). Layout: one destination stream per invocation, WG/4 chunks per workgroup (WG a
//   multiple of 4); the workgroup's slice of WG/4 chunks is the split: groups per token = G.
#include "common.glsl"
// Chunks per invocation (spec constant 1): a workgroup covers WG·CPT chunks, each invocation
// CPT of them strided by WG (more independent loads in flight per invocation on GPUs).
layout(constant_id = 1) const uint CPT = 1;
#if defined(VEC4)
#define VEC vec4
float dot_v(vec4 a, vec4 b) { return dot(a, b); }
#else
#define VEC float
float dot_v(float a, float b) { return a * b; }
#endif
#include "hc_post.glsl"
layout(binding = 0) readonly buffer F { VEC f[]; };
layout(binding = 1) readonly buffer R { VEC res[]; };
layout(binding = 2) readonly buffer Post { float post[]; };
layout(binding = 3) readonly buffer Comb { float comb[]; };
#if defined(MIX_NEXT)
layout(constant_id = 2) const uint M = 24;     // the next fn's rows: a multiple of 4, ≤ 24
#define WG_NV (M + 1u)
#define WG_NV_MAX 25
#include "wg_reduce.glsl"
// restrict: the bindings never alias, so the fn loads may move above the stores of the new streams
layout(binding = 4) restrict readonly buffer Fn { VEC fn[]; };
#define FN(i) fn[i]
#define MIXACC_TRANSPOSE                       // HC_POST_MIX runs on the site path only: it has shuffles
#include "hc_mixacc.glsl"
layout(binding = 5) restrict writeonly buffer O { VEC o[]; };
layout(binding = 6) restrict writeonly buffer Part { float part[]; };
#else
layout(binding = 4) writeonly buffer O { VEC o[]; };
#endif
layout(push_constant) uniform P {
    uint T, n_chunks, groups_per_token;
    uint f_off, f_st;
    uint r_off, r_st, r_ss;
    uint p_off, p_st, p_sd;
    uint c_off, c_st, c_ss, c_sd;
    uint o_off, o_st, o_sd;
#if defined(MIX_NEXT)
    uint fn_off, fn_sj;
    uint q_off, q_st, q_sg;
#endif
} p;

void main() {
    uint g = flat_group();
    uint t = g / p.groups_per_token;
#if defined(MIX_NEXT)
    // One destination stream per invocation: the workgroup is 4 groups of WG/4 invocations, group d
    // making stream d of WG/4 chunks, so a token has 4× the invocations of HC_POST's layout and each
    // forms a quarter of the next mixes' products. At decode this pass is a chain of latencies, and
    // more, shorter invocations finish it sooner.
    MixAcc A = mixacc_zero();
    bool live = t < p.T;                       // no return before the workgroup reduction
    t = min(t, p.T - 1u);
    uint q = gl_WorkGroupSize.x / 4u, d = gl_LocalInvocationID.x / q;
    uint cd = p.c_off + t * p.c_st + d * p.c_sd;
    float pw = post[p.p_off + t * p.p_st + d * p.p_sd];
    vec4 cw = vec4(comb[cd], comb[cd + p.c_ss], comb[cd + 2u * p.c_ss], comb[cd + 3u * p.c_ss]);
    uint c0 = (g % p.groups_per_token) * q * CPT + gl_LocalInvocationID.x % q;
    [[unroll]] for (uint k = 0u; k < CPT; ++k) {
        uint c = c0 + k * q;
        if (!live || c >= p.n_chunks) break;
        uint rb = p.r_off + t * p.r_st + c;
        VEC r = post_stream(f[p.f_off + t * p.f_st + c], pw, cw, res[rb], res[rb + p.r_ss], res[rb + 2u * p.r_ss],
                            res[rb + 3u * p.r_ss]);
        o[p.o_off + t * p.o_st + c + d * p.o_sd] = r;
        mixacc_add(A, r, p.fn_off + d * p.n_chunks + c, p.fn_sj, true);
    }
    mixacc_put(A);
    barrier();
    uint slice = g % p.groups_per_token;
    for (uint k = gl_LocalInvocationID.x; k < WG_NV && live; k += gl_WorkGroupSize.x)
        part[p.q_off + t * p.q_st + slice * p.q_sg + k] = wg_total(k);
#else
    if (t >= p.T) return;                      // folded grids overshoot
    // All 20 coefficients into registers before any store: the output may alias the inputs as
    // far as the compiler knows, so loads after a store could not move above it.
    uint pb = p.p_off + t * p.p_st;
    uint cb = p.c_off + t * p.c_st;
    float pw[4];
    vec4 cw[4];                                // cw[d] = comb[t, 0..3, d]
    [[unroll]] for (uint d = 0u; d < 4u; ++d) {
        uint cd = cb + d * p.c_sd;
        pw[d] = post[pb + d * p.p_sd];
        cw[d] = vec4(comb[cd], comb[cd + p.c_ss], comb[cd + 2u * p.c_ss], comb[cd + 3u * p.c_ss]);
    }
    uint c0 = (g % p.groups_per_token) * gl_WorkGroupSize.x * CPT + gl_LocalInvocationID.x;
    [[unroll]] for (uint k = 0u; k < CPT; ++k) {
        uint c = c0 + k * gl_WorkGroupSize.x;
        if (c >= p.n_chunks) return;
        uint rb = p.r_off + t * p.r_st + c;
        VEC fv = f[p.f_off + t * p.f_st + c];
        VEC x0 = res[rb], x1 = res[rb + p.r_ss], x2 = res[rb + 2u * p.r_ss], x3 = res[rb + 3u * p.r_ss];
        VEC r[4];
        [[unroll]] for (uint d = 0u; d < 4u; ++d) r[d] = post_stream(fv, pw[d], cw[d], x0, x1, x2, x3);
        uint ob = p.o_off + t * p.o_st + c;
        [[unroll]] for (uint d = 0u; d < 4u; ++d) o[ob + d * p.o_sd] = r[d];
    }
#endif
}
