#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
//! variants: - | VEC4
// HC_SITE: the rest of a site's pre side in one dispatch, from the mixes' partial sums (hc_mix.comp
// partials, or the previous site's HC_POST with -D MIX_NEXT): mixes = Σ partial dots / sqrt(Σ Σx² /
// (4·D) + norm_eps); gates; Sinkhorn; u[t,:] = Σ_s pre[t,s]·X[t,s,:].
// Layout: workgroup g → token t = g / groups_per_token and slice g % groups_per_token of D (as
// hc_pre.comp: WG·CPT chunks, a chunk a vec4 with -D VEC4 else one float). Every workgroup
// reduces its token's G partials (invocation i sums partials i, i+WG, ...; then wg_reduce.glsl)
// and computes the 4 pre gates itself, so no second dispatch and no cross-workgroup traffic; the
// token's slice-0 workgroup also writes the coefficients: with M = 24 (a site) coefs[t, 0..23] =
// pre gates | post gates | comb (HC_COEFS's layout; lanes 0..3 of subgroup 0 run the ROWS4
// Sinkhorn of hc_math.glsl, so any subgroup size ≥ 4 works), with M = 4 (the head collapse) the 4
// pre gates. The collapse keeps the unfused chain's order ((w0·x0 + w1·x1) + w2·x2) + w3·x3. The
// reduction, gates, Sinkhorn and coefficients are hc_site.glsl's, shared with HC_POST_SITE.
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
#include "hc_site.glsl"
layout(push_constant) uniform P {
    uint T, n_chunks, groups_per_token, G, n_iter;
    float inv_k, norm_eps, eps;
    uint p_off, p_st, p_sg;
    uint x_off, x_st, x_ss;
    uint s_off, s_s, b_off, b_s;
    uint u_off, u_st;
    uint c_off, c_st, c_sj;
} p;

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
    SiteGates q = site_gates(p.s_off, p.s_s, p.b_off, p.b_s);
    site_sum_partials(p.p_off + tc * p.p_st, p.G, p.p_sg, all_mixes);
    float r = site_rms_inv(p.inv_k, p.norm_eps);
    vec4 pre = site_pre_gates(q, r, p.eps);

    // the collapse first: its stores are on their way while the slice-0 workgroup's Sinkhorn runs
    // (at decode the coefficients are this dispatch's critical path; H200, T = 1, D = 4096: 6.1
    // against 6.9 µs with the Sinkhorn first, results/h200/site_decode_collapse_first.txt)
    if (live) {
        [[unroll]] for (uint k = 0u; k < CPT; ++k) {
            uint c = c0 + k * gl_WorkGroupSize.x;
            if (c < p.n_chunks)
                u[p.u_off + t * p.u_st + c] = site_collapse(pre, xs[4u * k], xs[4u * k + 1u], xs[4u * k + 2u],
                                                            xs[4u * k + 3u]);
        }
    }
    if (slice == 0u && gl_SubgroupID == 0u)   // uniform per subgroup: the shuffles see all lanes
        site_coefs(q, pre, r, p.eps, p.n_iter, p.c_off + tc * p.c_st, p.c_sj, live);
}
