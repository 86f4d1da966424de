// A site's pre side from its mixes' partial sums — their reduction, the gates, the Sinkhorn and the
// coefficients — shared by HC_SITE (hc_site.comp) and HC_POST_SITE's tail (hc_post.comp -D SITE_NEXT),
// so that both form them identically. The includer defines M (24: a site; 4: the head collapse) and
// WG_NV and VEC, includes wg_reduce.glsl, hc_mixacc.glsl and hc_math.glsl, and declares the float buffers
// part (the partials [T, G, M + 1], entry M is Σx²), scale, base and coefs.

struct SiteGates { float scale_pre, scale_post, scale_comb, base_post; vec4 base_pre, base_comb; };

// The gate parameters: uniform loads, except that lane src = lane & 3 of each 4-lane group takes its
// comb row's bases and its post gate's (the ROWS4 Sinkhorn's layout). The head (M = 4) has scale[1]
// and base[4] only.
SiteGates site_gates(uint s_off, uint s_s, uint b_off, uint b_s) {
    uint src = gl_SubgroupInvocationID & 3u;
    SiteGates q = SiteGates(scale[s_off], 0.0, 0.0, 0.0,
                            vec4(base[b_off], base[b_off + b_s], base[b_off + 2u * b_s], base[b_off + 3u * b_s]),
                            vec4(0.0));
    if (M == 24u) {
        q.scale_post = scale[s_off + s_s];
        q.scale_comb = scale[s_off + 2u * s_s];
        uint bl = b_off + (8u + 4u * src) * b_s;
        q.base_comb = vec4(base[bl], base[bl + b_s], base[bl + 2u * b_s], base[bl + 3u * b_s]);
        q.base_post = base[b_off + (4u + src) * b_s];
    }
    return q;
}

// One token's G partials summed over the workgroup (split i at index b + i·sg): afterwards
// wg_total(k) is mix k's dot product (k < 4 only, unless all_mixes) and wg_total(M) is Σx².
void site_sum_partials(uint b, uint G, uint sg, bool all_mixes) {
    MixAcc A = mixacc_zero();
    for (uint i = gl_LocalInvocationID.x; i < G; i += gl_WorkGroupSize.x) {
        uint pb = b + i * sg;
        A.a0 += vec4(part[pb], part[pb + 1u], part[pb + 2u], part[pb + 3u]);
        A.ss += part[pb + M];
        if (all_mixes) {
            if (M > 4u) A.a1 += vec4(part[pb + 4u], part[pb + 5u], part[pb + 6u], part[pb + 7u]);
            if (M > 8u) A.a2 += vec4(part[pb + 8u], part[pb + 9u], part[pb + 10u], part[pb + 11u]);
            if (M > 12u) A.a3 += vec4(part[pb + 12u], part[pb + 13u], part[pb + 14u], part[pb + 15u]);
            if (M > 16u) A.a4 += vec4(part[pb + 16u], part[pb + 17u], part[pb + 18u], part[pb + 19u]);
            if (M > 20u) A.a5 += vec4(part[pb + 20u], part[pb + 21u], part[pb + 22u], part[pb + 23u]);
        }
    }
    mixacc_put(A);
    barrier();
}

// After site_sum_partials: r = 1 / sqrt(Σx² / (4·D) + norm_eps), mix j = its dot product · r.
float site_rms_inv(float inv_k, float norm_eps) { return 1.0 / sqrt(wg_total(M) * inv_k + norm_eps); }
float site_mix(uint j, float r) { return wg_total(j) * r; }

vec4 site_pre_gates(SiteGates q, float r, float eps) {
    vec4 pre;
    [[unroll]] for (uint s = 0u; s < 4u; ++s) pre[s] = hc_gate(site_mix(s, r), q.scale_pre, q.base_pre[s], true, eps);
    return pre;
}

// The collapse of one chunk, in the unfused chain's order ((w0·x0 + w1·x1) + w2·x2) + w3·x3 (the includer
// defines VEC: float or vec4).
VEC site_collapse(vec4 pre, VEC x0, VEC x1, VEC x2, VEC x3) {
    VEC v = pre[0] * x0;
    v += pre[1] * x1;
    v += pre[2] * x2;
    return v + pre[3] * x3;
}

// The token's coefficients at coefs[cb + j·c_sj] — M = 24: pre | post | comb (HC_COEFS's layout: the
// comb from the ROWS4 Sinkhorn on lanes 0..3); M = 4: the pre gates. Called by a whole subgroup
// (the shuffles see all lanes); live: whether the token exists (a folded grid's overshoot does not).
void site_coefs(SiteGates q, vec4 pre, float r, float eps, uint n_iter, uint cb, uint c_sj, bool live) {
    uint lane = gl_SubgroupInvocationID, src = lane & 3u;
    if (M == 24u) {
        uint k0 = 8u + 4u * src;
        vec4 l = vec4(site_mix(k0, r), site_mix(k0 + 1u, r), site_mix(k0 + 2u, r), site_mix(k0 + 3u, r))
                 * q.scale_comb + q.base_comb;
        vec4 c = hc_sinkhorn_rows4(l, eps, n_iter);
        if (live && lane < 4u) {
            coefs[cb + src * c_sj] = pre[src];
            coefs[cb + (4u + src) * c_sj] = hc_gate(site_mix(4u + src, r), q.scale_post, q.base_post, false, eps);
            [[unroll]] for (uint d = 0u; d < 4u; ++d) coefs[cb + (8u + 4u * src + d) * c_sj] = c[d];
        }
    } else if (live && lane < 4u) {
        coefs[cb + src * c_sj] = pre[src];
    }
}
