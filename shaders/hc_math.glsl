// Per-token hyper-connection coefficient math shared by HC_COMB / HC_COEFS (hc_comb.comp) and the
// whole-site kernel (hc_site.comp), so the two paths compute gates and Sinkhorn identically.
// Needs GL_KHR_shader_subgroup_shuffle (the includer enables it).

#include "hc_gate.glsl"

// Sinkhorn, ROWS4 layout: 4 consecutive subgroup lanes hold one token's matrix, lane & 3 = src
// holding logits row l[src][dst 0..3] as a vec4, and get back its row of the result. The exact
// order of docs/hc_math.md (HC_COMB): c0 = softmax over dst + eps, 1 column normalisation, then
// n_iter − 1 × (rows, columns). Every normalisation scales whole rows or whole columns, so the
// iterations run on two scale vectors, c = diag(r)·c0·diag(s): a row step is r_i ← r_i / (r_i·(c0 s)_i
// + eps), a column step s_j ← s_j / (s_j·(rᵀc0)_j + eps), the same quotients as dividing c itself.
// Each lane holds all of c0 (three shuffles, once), so the 2·n_iter dependent steps are FMAs and
// divisions, no shuffle: on the H200 a shuffle's latency was most of an iteration (the decode site
// back to back: results/h200/ablate_site_sink_h200.txt, without shuffles 7.7 against 8.3 µs).
// Lane k of a group holds rows src, src^1, src^2, src^3 as R0..R3; the column sums pair rows
// (src, src^1) and (src^2, src^3), so every lane adds the same products in the same order and the
// 4 lanes keep bit-identical s (precise: no contraction into FMAs, whose rounding would depend on
// which of a pair is the addend). Every lane of the subgroup must call it.
float hc_hsum(vec4 v) { return (v.x + v.y) + (v.z + v.w); }

vec4 hc_sinkhorn_rows4(vec4 l, float eps, uint n_iter) {
    vec4 e = exp(l - max(max(l.x, l.y), max(l.z, l.w)));
    vec4 R0 = e / hc_hsum(e) + eps;
    vec4 R1 = subgroupShuffleXor(R0, 1u), R2 = subgroupShuffleXor(R0, 2u), R3 = subgroupShuffleXor(R0, 3u);
    precise vec4 t = (R0 + R1) + (R2 + R3);
    vec4 s = 1.0 / (t + eps), r = vec4(1.0);
    for (uint it = 1u; it < n_iter; ++it) {
        vec4 d = vec4(dot(R0, s), dot(R1, s), dot(R2, s), dot(R3, s));
        r /= r * d + eps;
        precise vec4 tc = (R0 * r.x + R1 * r.y) + (R2 * r.z + R3 * r.w);
        s /= s * tc + eps;
    }
    return R0 * r.x * s;
}
