// Per-token hyper-connection coefficient math shared by HC_COMB / HC_COEFS (hc_comb.comp) and the
// whole-site kernel (hc_site.comp), so the two paths compute gates and Sinkhorn identically.
// Needs GL_KHR_shader_subgroup_shuffle (the includer enables it).

#include "hc_gate.glsl"

// Sinkhorn, ROWS4 layout: 4 consecutive subgroup lanes hold one token's matrix, lane & 3 = src
// holding logits row l[src][dst 0..3] as a vec4. Softmax over dst and row sums are in-register,
// column sums are shuffleXor 1, 2 on the vec4. The exact order of HC_OPS.md: softmax + eps,
// 1 column normalisation, then n_iter − 1 × (rows, columns). Every lane of the subgroup must call
// it (the shuffles read the neighbours of a 4-lane group only).
vec4 hc_col_sum4(vec4 v) { v += subgroupShuffleXor(v, 1u); return v + subgroupShuffleXor(v, 2u); }
float hc_hsum(vec4 v) { return (v.x + v.y) + (v.z + v.w); }

vec4 hc_sinkhorn_rows4(vec4 l, float eps, uint n_iter) {
    vec4 e = exp(l - max(max(l.x, l.y), max(l.z, l.w)));
    vec4 c = e / hc_hsum(e) + eps;
    c /= hc_col_sum4(c) + eps;
    for (uint it = 1u; it < n_iter; ++it) {
        c /= hc_hsum(c) + eps;
        c /= hc_col_sum4(c) + eps;
    }
    return c;
}

// The same Sinkhorn with the whole matrix in one invocation (rows r0..r3 of logits, updated in place):
// row sums in registers, column sums as vec4 adds of the rows, so no shuffles on the iterations'
// dependent chain, and each normalisation multiplies by one reciprocal per sum (a few ulp from the
// quotients of hc_sinkhorn_rows4 and the unfused chain's DIV). The sums in hc_sinkhorn_rows4's order.
void hc_sinkhorn_lane(inout vec4 r0, inout vec4 r1, inout vec4 r2, inout vec4 r3, float eps, uint n_iter) {
    r0 = exp(r0 - max(max(r0.x, r0.y), max(r0.z, r0.w)));
    r1 = exp(r1 - max(max(r1.x, r1.y), max(r1.z, r1.w)));
    r2 = exp(r2 - max(max(r2.x, r2.y), max(r2.z, r2.w)));
    r3 = exp(r3 - max(max(r3.x, r3.y), max(r3.z, r3.w)));
    r0 = r0 * (1.0 / hc_hsum(r0)) + eps;
    r1 = r1 * (1.0 / hc_hsum(r1)) + eps;
    r2 = r2 * (1.0 / hc_hsum(r2)) + eps;
    r3 = r3 * (1.0 / hc_hsum(r3)) + eps;
    for (uint it = 0u; it < n_iter; ++it) {
        if (it > 0u) {
            r0 *= 1.0 / (hc_hsum(r0) + eps);
            r1 *= 1.0 / (hc_hsum(r1) + eps);
            r2 *= 1.0 / (hc_hsum(r2) + eps);
            r3 *= 1.0 / (hc_hsum(r3) + eps);
        }
        vec4 col = 1.0 / (((r0 + r1) + (r2 + r3)) + eps);
        r0 *= col;
        r1 *= col;
        r2 *= col;
        r3 *= col;
    }
}
