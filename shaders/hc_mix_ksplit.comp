#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | VEC4 ; - | POST
// HC_MIX_PART for many tokens (KSPLIT): the mixes' partial sums as hc_mix_token.comp writes them.
// Layout: workgroup g → token block g / G (push tb tokens) and split g % G of S = 16 chunks per
// stream. The split's fn slice (M·4·S chunks) is staged once in shared memory and every token of the
// block streams through it: fn is read from memory once per block of tokens, and from shared memory
// (a broadcast across the block's tokens) inside. LPT (spec 2) consecutive subgroup lanes take one
// token (chunks lane, lane+LPT, ...), summed by shuffles; with TPL = 2 or 4 (spec 3) they take two or
// four tokens, each fn chunk read from shared memory once for all of them. With LPT = 1 every lane
// of a subgroup reads the same fn chunk: a broadcast. With RH = 2 (spec 4; M a multiple of 8) two
// groups of LPT lanes take the same tokens, each half of the rows: per fn chunk loaded, as many
// products, but each lane holds half the sums, so TPL can double for the same registers (4 tokens ×
// 12 rows: 3 products per operand loaded, against 1.85 with 2 × 24). Shared arrays have
// compile-time sizes: 24·4·S chunks, 24 KiB with vec4. Each token's X is read once.
// -D POST (HC_POST_MIX for many tokens: a layer boundary at prefill): the streams are not read from X
//   but made by the post, X_new[t,d,:] = f[t,:]·post[t,d] + Σ_s comb[t,s,d]·res[t,s,:] (hc_post.glsl,
//   as hc_post.comp), written out, and their partials computed from the registers: the next site's
//   mixes cost no read of X_new. Bindings 0 f, 1 fn (the next site's), 2 partials, 3 res, 4 post,
//   5 comb, 6 X_new; TPL ≤ 2.
// Spec constants: 0 workgroup size, 1 M (a multiple of 4, ≤ 24), 2 LPT (lanes per token), 3 TPL
//   (tokens per lane group, 1, 2 or 4), 4 RH (row groups, 1 or 2).
// Push: T, chunks per stream, slice (chunks per split), G, 1/(4·D), norm_eps, X (offset, token and
//   stream strides, in chunks), fn (offset, row stride, in chunks), out (offset, token stride, split
//   stride), tb (tokens per workgroup); POST then f (offset, token stride), post (offset, token and
//   stream strides), comb (offset, token, source and destination strides), X_new (offset, token and
//   stream strides), X being the residual; offsets and strides of f, X, X_new and fn in chunks.
#include "hc_mix_common.glsl"
// restrict: bindings never alias within a dispatch, so loads may be hoisted and batched (latency)
#if defined(POST)
layout(binding = 0) restrict readonly buffer Fsub { VEC fsub[]; };
layout(binding = 3) restrict readonly buffer X { VEC x[]; };            // the residual streams
layout(binding = 4) restrict readonly buffer PostW { float postw[]; };
layout(binding = 5) restrict readonly buffer CombW { float combw[]; };
layout(binding = 6) restrict writeonly buffer Xnew { VEC xnew[]; };
#else
layout(binding = 0) restrict readonly buffer X { VEC x[]; };
#endif
layout(binding = 1) restrict readonly buffer Fn { VEC fn[]; };
layout(binding = 2) restrict writeonly buffer Out { float out_[]; };
layout(push_constant) uniform P {
    uint T, chunks, slice, G;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_s2;
    uint tb;                                   // tokens per workgroup
#if defined(POST)
    uint s_off, s_st;                          // f (the sublayer's output), in chunks
    uint pw_off, pw_st, pw_sd, cw_off, cw_st, cw_ss, cw_sd;
    uint n_off, n_st, n_sd;                    // X_new, in chunks
#endif
} p;

#extension GL_KHR_shader_subgroup_shuffle : require
const uint S = 16;                              // chunks per split and stream (hc.mix_kernels.KSPLIT_S)
layout(constant_id = 2) const uint LPT = 4;     // lanes per token (a power of two ≤ the subgroup)
layout(constant_id = 3) const uint TPL = 1;     // tokens per group of LPT lanes: 1, 2 or 4
layout(constant_id = 4) const uint RH = 1;      // row groups: RH groups of LPT lanes share tokens, M / RH rows each
const uint MR = M / RH;                         // rows a lane forms (a multiple of 4)
shared VEC fs[24 * 4 * S];                      // the split's fn slice: fs[(j·4 + stream)·S + c], j < M
#define FN(i) fs[i]
#define MIXACC_ROWS MR
#include "hc_mixacc.glsl"

// The sums of a token's LPT lanes (shuffles within the group), on every lane of it.
void lanes_sum(inout MixAcc A) {
    for (uint m = 1u; m < LPT; m <<= 1u) {
        A.a0 += subgroupShuffleXor(A.a0, m); A.a1 += subgroupShuffleXor(A.a1, m);
        A.a2 += subgroupShuffleXor(A.a2, m); A.a3 += subgroupShuffleXor(A.a3, m);
        A.a4 += subgroupShuffleXor(A.a4, m); A.a5 += subgroupShuffleXor(A.a5, m);
        A.ss += subgroupShuffleXor(A.ss, m);
    }
}

#if defined(POST)
#include "hc_post.glsl"
struct PostCoef { vec4 pw; mat4 cw; };          // cw[d] = comb[t, 0..3, d]

PostCoef post_coef(uint t) {
    PostCoef P;
    uint pb = p.pw_off + t * p.pw_st, cb = p.cw_off + t * p.cw_st;
    [[unroll]] for (uint d = 0u; d < 4u; ++d) {
        uint cd = cb + d * p.cw_sd;
        P.pw[d] = postw[pb + d * p.pw_sd];
        P.cw[d] = vec4(combw[cd], combw[cd + p.cw_ss], combw[cd + 2u * p.cw_ss], combw[cd + 3u * p.cw_ss]);
    }
    return P;
}

// Token t's new streams at chunk cc from its residual chunks v (replaced by them), stored if `store`.
void post_streams(uint t, uint cc, PostCoef P, inout VEC v[4], bool store) {
    VEC fv = fsub[p.s_off + t * p.s_st + cc];
    VEC r[4];
    [[unroll]] for (uint d = 0u; d < 4u; ++d) r[d] = post_stream(fv, P.pw[d], P.cw[d], v[0], v[1], v[2], v[3]);
    if (store) [[unroll]] for (uint d = 0u; d < 4u; ++d) xnew[p.n_off + t * p.n_st + d * p.n_sd + cc] = r[d];
    v = r;
}
#endif

// rows rh·MR .. rh·MR + MR − 1 of token t, and (row group 0) its Σx²
void put_partials(MixAcc A, uint t, uint split, uint rh) {
    uint ob = p.o_off + t * p.o_st + split * p.o_s2;
    for (uint k = 0u; k < MR; ++k) out_[ob + rh * MR + k] = mixacc_at(A, k);
    if (rh == 0u) out_[ob + M] = A.ss;
}

void main() {
    uint g = flat_group();
    uint block = g / p.G, split = g % p.G;
    uint c_begin = split * S;
    for (uint i = gl_LocalInvocationID.x; i < M * 4u * S; i += gl_WorkGroupSize.x) {
        uint c = i % S, js = i / S;
        fs[i] = c_begin + c < p.chunks ? fn[p.f_off + (js / 4u) * p.f_sj + (js % 4u) * p.chunks + c_begin + c] : VEC(0.0);
    }
    barrier();
    // a token group's RH·LPT lanes are consecutive lanes of one subgroup (full subgroups, WG a multiple
    // of RH·LPT): row group rh of LPT lanes forms rows rh·MR .. rh·MR + MR − 1 (fn rows MR·4·S apart)
    uint pos = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    uint cluster = pos / (LPT * RH), rh = (pos / LPT) % RH, lane = pos % LPT;
    uint row0 = rh * MR * 4u * S;
    uint n_c = min(S, p.chunks - min(c_begin, p.chunks));
    uint t_end = min((block + 1u) * p.tb, p.T);
    for (uint t0 = block * p.tb; t0 < t_end; t0 += TPL * (gl_WorkGroupSize.x / (LPT * RH))) {   // uniform loop
        uint ta = t0 + TPL * cluster;
        // lanes past the block compute on a real token, store nothing
        uint xt[4];
        [[unroll]] for (uint i = 0u; i < 4u; ++i) xt[i] = p.x_off + min(ta + min(i, TPL - 1u), p.T - 1u) * p.x_st + c_begin;
        // per chunk the streams' x loads first, so that their latencies overlap
        MixAcc A = mixacc_zero(), B = mixacc_zero(), C = mixacc_zero(), E = mixacc_zero();
#if defined(POST)
        uint tpa = min(ta, p.T - 1u), tpb = min(ta + 1u, p.T - 1u);
        PostCoef PA = post_coef(tpa), PB = post_coef(tpb);
#endif
        for (uint c = lane; c < n_c; c += LPT) {
            VEC va[4], vb[4], vc[4], ve[4];
            [[unroll]] for (uint s = 0u; s < 4u; ++s) {
                va[s] = x[xt[0] + s * p.x_ss + c];
                if (TPL > 1u) vb[s] = x[xt[1] + s * p.x_ss + c];
                if (TPL > 2u) { vc[s] = x[xt[2] + s * p.x_ss + c]; ve[s] = x[xt[3] + s * p.x_ss + c]; }
            }
#if defined(POST)
            post_streams(tpa, c_begin + c, PA, va, rh == 0u && ta < t_end);     // (every row group makes them)
            if (TPL > 1u) post_streams(tpb, c_begin + c, PB, vb, rh == 0u && ta + 1u < t_end);
#endif
            [[unroll]] for (uint s = 0u; s < 4u; ++s) {
                if (TPL > 2u) mixacc_add4(A, B, C, E, va[s], vb[s], vc[s], ve[s], row0 + s * S + c, 4u * S);
                else if (TPL > 1u) mixacc_add2(A, B, va[s], vb[s], row0 + s * S + c, 4u * S);
                else mixacc_add(A, va[s], row0 + s * S + c, 4u * S, true);
            }
        }
        lanes_sum(A);
        if (TPL > 1u) lanes_sum(B);
        if (TPL > 2u) { lanes_sum(C); lanes_sum(E); }
        if (lane == 0u) {
            if (ta < t_end) put_partials(A, ta, split, rh);
            if (TPL > 1u && ta + 1u < t_end) put_partials(B, ta + 1u, split, rh);
            if (TPL > 2u && ta + 2u < t_end) put_partials(C, ta + 2u, split, rh);
            if (TPL > 2u && ta + 3u < t_end) put_partials(E, ta + 3u, split, rh);
        }
    }
}
