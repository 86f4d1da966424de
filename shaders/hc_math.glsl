// Per-token hyper-connection coefficient math shared by HC_COMB / HC_COEFS (hc_comb.comp) and the
// whole-site kernel (hc_site.comp), so the two paths compute gates and Sinkhorn identically.
// Needs GL_KHR_shader_subgroup_shuffle (the includer enables it).

#include "hc_gate.glsl"

// Sinkhorn, ROWS4 layout: 4 consecutive subgroup lanes hold one token's matrix, lane & 3 = src
// holding logits row l[src][dst 0..3] as a vec4. Softmax over dst and row sums are in-register,
// column sums are the vec4's of lanes src ^ 1, 2, 3 fetched at once — three independent shuffles,
// one shuffle latency on the iterations' dependent chain instead of a butterfly's two, and the same
// sums bit for bit (each lane adds its pair, then the other pair, as the butterfly did).
// The exact order of docs/hc_math.md (HC_COMB): softmax + eps, 1 column normalisation, then
// n_iter − 1 × (rows, columns). Every lane of the subgroup must call it (the shuffles read the
// neighbours of a 4-lane group only).
vec4 hc_col_sum4(vec4 v) {
    vec4 a = subgroupShuffleXor(v, 1u), b = subgroupShuffleXor(v, 2u), c = subgroupShuffleXor(v, 3u);
    return (v + a) + (b + c);
}
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
