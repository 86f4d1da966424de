#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
//! variants: - | VEC4
// HC_SITE: the rest of a site's pre side in one dispatch, from the mixes' partial sums (hc_mix_token.comp
// partials, or the previous site's HC_POST with -D MIX_NEXT): mixes = Σ partial dots / sqrt(Σ Σx² /
// (4·D) + norm_eps); gates; Sinkhorn; u[t,:] = Σ_s pre[t,s]·X[t,s,:].
// Layout: workgroup g → token t = g / groups_per_token and slice g % groups_per_token of D (as
// hc_pre.comp: WG·CPT chunks, a chunk a vec4 with -D VEC4 else one float). Every workgroup
// reduces its token's G partials (invocation i sums partials i, i+WG, ...; then wg_reduce.glsl)
// and computes the 4 pre gates itself, so no second dispatch and no cross-workgroup traffic; the
// token's slice-0 workgroup also writes the coefficients: with M = 24 (a site) coefs[t, 0..23] =
// pre gates | post gates | comb (HC_COEFS's layout; lanes 0..3 of subgroup 0 run the ROWS4
// Sinkhorn of hc_math.glsl, so any subgroup size ≥ 4 works), with M = 4 (the head collapse) the 4
// pre gates. The collapse keeps the unfused chain's order ((w0·x0 + w1·x1) + w2·x2) + w3·x3.
// Spec constants: 0 workgroup size, 1 CPT (chunks per invocation), 2 M (24 or 4).
// Push: T, chunks per stream, groups per token, G, n_iter, 1/(4·D), norm_eps, hc_eps, partials
//   (offset, token and split strides; entry M is Σx²), X (offset, token and stream strides, chunks),
//   scale (offset, stride), base (offset, stride), u (offset, token stride, chunks), coefs (offset,
//   token and entry strides).
#include "common.glsl"
layout(constant_id = 1) const uint CPT = 1;
layout(constant_id = 2) const uint M = 24;
#define WG_NV (M + 1u)
#define WG_NV_MAX 25
#include "wg_reduce.glsl"
#define MIXACC_TRANSPOSE                       // the site path has shuffles (ROWS4 Sinkhorn)
#include "hc_mixacc.glsl"
#include "hc_math.glsl"
#if defined(VEC4)
#define VEC vec4
#else
#define VEC float
#endif
layout(binding = 0) restrict readonly buffer Part { float part[]; };
layout(binding = 1) restrict readonly buffer X { VEC x[]; };
layout(binding = 2) restrict readonly buffer Scale { float scale[]; };
layout(binding = 3) restrict readonly buffer Base { float base[]; };
layout(binding = 4) restrict writeonly buffer Coefs { float coefs[]; };
layout(binding = 5) restrict writeonly buffer U { VEC u[]; };
layout(push_constant) uniform P {
    uint T, n_chunks, groups_per_token, G, n_iter;
    float inv_k, norm_eps, eps;
    uint p_off, p_st, p_sg;
    uint x_off, x_st, x_ss;
    uint s_off, s_s, b_off, b_s;
    uint u_off, u_st;
    uint c_off, c_st, c_sj;
} p;

float mix_of(uint j, float r) { return wg_total(j) * r; }

void main() {
    uint g = flat_group();
    uint t = g / p.groups_per_token, slice = g % p.groups_per_token;
    bool live = t < p.T;                       // folded grids overshoot; no return before the barrier
    uint tc = min(t, p.T - 1u);
    // only the slice-0 workgroup needs all M mixes (coefficients); the others the pre gates' and Σx²
    bool all_mixes = slice == 0u;
    // The loads that do not depend on the mixes go first — this invocation's X chunks (clamped to
    // the row: a chunk past it is loaded but never stored) and the gate parameters — so that their
    // memory latency overlaps the partials' reduction instead of following its barrier (at decode
    // this kernel is a chain of latencies, not of bandwidth).
    uint c0 = slice * gl_WorkGroupSize.x * CPT + gl_LocalInvocationID.x;
    VEC xs[4u * CPT];
    [[unroll]] for (uint k = 0u; k < CPT; ++k) {
        uint xb = p.x_off + tc * p.x_st + min(c0 + k * gl_WorkGroupSize.x, p.n_chunks - 1u);
        [[unroll]] for (uint s = 0u; s < 4u; ++s) xs[4u * k + s] = x[xb + s * p.x_ss];
    }
    uint src = gl_SubgroupInvocationID & 3u;
    float scale_pre = scale[p.s_off];
    vec4 base_pre = vec4(base[p.b_off], base[p.b_off + p.b_s], base[p.b_off + 2u * p.b_s], base[p.b_off + 3u * p.b_s]);
    float scale_post = 0.0, scale_comb = 0.0, base_post = 0.0;
    vec4 base_comb = vec4(0.0);
    if (M == 24u) {                            // a site's (the head has scale[1], base[4] only)
        scale_post = scale[p.s_off + p.s_s];
        scale_comb = scale[p.s_off + 2u * p.s_s];
        uint bl = p.b_off + (8u + 4u * src) * p.b_s;       // (used by lanes 0..3 of the Sinkhorn subgroup)
        base_comb = vec4(base[bl], base[bl + p.b_s], base[bl + 2u * p.b_s], base[bl + 3u * p.b_s]);
        base_post = base[p.b_off + (4u + src) * p.b_s];
    }
    MixAcc A = mixacc_zero();
    for (uint i = gl_LocalInvocationID.x; i < p.G; i += gl_WorkGroupSize.x) {
        uint b = p.p_off + tc * p.p_st + i * p.p_sg;
        A.a0 += vec4(part[b], part[b + 1u], part[b + 2u], part[b + 3u]);
        A.ss += part[b + M];
        if (all_mixes) {
            if (M > 4u) A.a1 += vec4(part[b + 4u], part[b + 5u], part[b + 6u], part[b + 7u]);
            if (M > 8u) A.a2 += vec4(part[b + 8u], part[b + 9u], part[b + 10u], part[b + 11u]);
            if (M > 12u) A.a3 += vec4(part[b + 12u], part[b + 13u], part[b + 14u], part[b + 15u]);
            if (M > 16u) A.a4 += vec4(part[b + 16u], part[b + 17u], part[b + 18u], part[b + 19u]);
            if (M > 20u) A.a5 += vec4(part[b + 20u], part[b + 21u], part[b + 22u], part[b + 23u]);
        }
    }
    mixacc_put(A);
    barrier();
    float r = 1.0 / sqrt(wg_total(M) * p.inv_k + p.norm_eps);
    vec4 pre;
    [[unroll]] for (uint s = 0u; s < 4u; ++s)
        pre[s] = hc_gate(mix_of(s, r), scale_pre, base_pre[s], true, p.eps);

    // the collapse first: its stores are on their way while the slice-0 workgroup's Sinkhorn runs
    // (at decode the coefficients are this dispatch's critical path)
    if (live) {
        [[unroll]] for (uint k = 0u; k < CPT; ++k) {
            uint c = c0 + k * gl_WorkGroupSize.x;
            if (c < p.n_chunks) {
                VEC v = pre[0] * xs[4u * k];
                v += pre[1] * xs[4u * k + 1u];
                v += pre[2] * xs[4u * k + 2u];
                v += pre[3] * xs[4u * k + 3u];
                u[p.u_off + t * p.u_st + c] = v;
            }
        }
    }
    if (slice == 0u && gl_SubgroupID == 0u) {  // uniform per subgroup: the shuffles see all lanes
        uint lane = gl_SubgroupInvocationID;
        uint cb = p.c_off + tc * p.c_st;
        if (M == 24u) {
            uint k0 = 8u + 4u * src;
            vec4 l = vec4(mix_of(k0, r), mix_of(k0 + 1u, r), mix_of(k0 + 2u, r), mix_of(k0 + 3u, r)) * scale_comb
                     + base_comb;
            vec4 c = hc_sinkhorn_rows4(l, p.eps, p.n_iter);
            if (live && lane < 4u) {
                coefs[cb + src * p.c_sj] = pre[src];
                coefs[cb + (4u + src) * p.c_sj] = hc_gate(mix_of(4u + src, r), scale_post, base_post, false, p.eps);
                [[unroll]] for (uint d = 0u; d < 4u; ++d) coefs[cb + (8u + 4u * src + d) * p.c_sj] = c[d];
            }
        } else if (live && lane < 4u) {
            coefs[cb + src * p.c_sj] = pre[src];
        }
    }
}
