// One destination stream of HC_POST at one chunk: f·post[d] + Σ_s comb[s, d]·res_s, summed in the
// unfused chain's order (f·post first, then the sources 0..3). Shared by hc_post.comp and HC_POST_MIX's
// KSPLIT form in hc_mix_ksplit.comp, so that both make the same new streams. The includer defines VEC.
VEC post_stream(VEC fv, float pw, vec4 cw, VEC x0, VEC x1, VEC x2, VEC x3) {
    VEC r = fv * pw;
    r += x0 * cw.x;
    r += x1 * cw.y;
    r += x2 * cw.z;
    r += x3 * cw.w;
    return r;
}
