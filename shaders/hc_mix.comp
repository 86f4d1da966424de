#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | VEC4 ; - | FINAL | KSPLIT | TILE | KSPLIT POST
//! variants: REDUCE
// HC_MIX family: a site's flat RMS norm and mixes mat-mul, mix[t,j] = (x_t · fn[j]) / sqrt(mean(x_t²)
// + norm_eps) with x_t = X[t] flattened (4·D), reading each token's X once for all M mixes and its
// sum of squares.
//
// Layout (default and -D FINAL; decode and few tokens): workgroup g → token g / G and split g % G of
// the D axis: chunks [split·slice, (split+1)·slice) of each of the 4 streams. A chunk is a vec4 with
// -D VEC4, else one float. Invocation i takes chunks i, i+WG, ... of its split, loads x and each fn
// row's chunk once and keeps the M + 1 running sums in registers (hc_mixacc.glsl); then they are
// reduced across the workgroup (wg_reduce.glsl: subgroupAdd + one shared-memory step).
//   default: partials[t, split, 0..M−1] = the split's dot products, [t, split, M] = its Σx² — the
//            layout the whole-site kernel (hc_site.comp) and -D REDUCE finish;
//   FINAL:   (G = 1 only) mix[t, j] directly.
// -D KSPLIT (many tokens; partials): workgroup g → token block g / G (push tb tokens) and split g % G
//   of S = 16 chunks per stream. The split's fn slice (M·4·S chunks) is staged once in shared
//   memory and every token of the block streams through it: fn is read from memory once per block
//   of tokens, and from shared memory (a broadcast across the block's tokens) inside. LPT (spec 2)
//   consecutive subgroup lanes take one token (chunks lane, lane+LPT, ...), summed by shuffles;
//   with TPL = 2 or 4 (spec 3) they take two or four tokens, each fn chunk read from shared memory
//   once for all of them (TPL = 2: 1.39× faster than 1 at T = 4096 on the H200). With LPT = 1
//   every lane of a subgroup reads the same fn chunk: a broadcast.
//   (Shared arrays have literal sizes here: 24·4·16 chunks, 24 KiB with vec4.)
//   Each token's X is read once.
// -D KSPLIT -D POST (HC_POST_MIX for many tokens: a layer boundary at prefill): the streams are not
//   read from X but made by the post, X_new[t,d,:] = f[t,:]·post[t,d] + Σ_s comb[t,s,d]·res[t,s,:]
//   (hc_post.glsl, as hc_post.comp), written out, and their partials computed from the registers: the
//   next site's mixes cost no read of X_new. Bindings 0 f, 1 fn (the next site's), 2 partials,
//   3 res, 4 post, 5 comb, 6 X_new; TPL ≤ 2.
// -D TILE (many tokens; partials): the mixes as a register-blocked mat-mul. Workgroup g → token
//   block g / G of 64 tokens and split g % G of SC chunks per stream (push slice). Its 64
//   invocations are 16 token groups × 4 row groups: invocation (tg, rg) = (id % 16, id / 16) keeps
//   the sums of tokens tg + 16·i (i < 4) with fn rows rg + 4·r (r < M/4) and Σx² in registers. The
//   split is walked in steps of 8 chunks of one stream: the block's x (64 tokens × 8 chunks, 128
//   contiguous bytes per token with vec4) and fn (M rows × 8 chunks) are staged in shared memory
//   with whole-line loads, then each invocation takes per chunk 4 x and M/4 fn values from shared
//   memory for 4·M/4 products (componentwise into VEC accumulators, summed at the end): x and fn
//   are each read from memory once per block and the products outnumber the shared-memory loads
//   ~10 to 1. Partials as the default layout.
// -D REDUCE: the second pass, one invocation per (t, j): Σ over the G partials, then the
//   norm: mix[t, j] = Σ dot / sqrt(Σ Σx² / (4·D) + norm_eps).
// Spec constants: 0 workgroup size (TILE: 64), 1 M (mix rows: a multiple of 4, ≤ 24); KSPLIT also 2 LPT (lanes
//   per token) and 3 TPL (tokens per lane group, 1, 2 or 4).
// Push (tile kernels): T, chunks per stream, slice (chunks per split), G, 1/(4·D), norm_eps,
//   X (offset, token and stream strides, in chunks), fn (offset, row stride, in chunks; fn[j, s·D + d]
//   is chunk s·chunks + c of row j), out (offset, token stride, split or row stride), tokens per
//   block (KSPLIT); KSPLIT POST then f (offset, token stride), post (offset, token and stream
//   strides), comb (offset, token, source and destination strides), X_new (offset, token and stream
//   strides), X being the residual; offsets and strides of f, X, X_new and fn in chunks.
// Push (REDUCE): T, G, 1/(4·D), norm_eps, partials (offset, token and split strides), out (offset,
//   token and row strides).
#include "common.glsl"
layout(constant_id = 1) const uint M = 24;     // mix rows: a multiple of 4, at most 24

#if defined(REDUCE)
layout(binding = 0) restrict readonly buffer Part { float part[]; };
layout(binding = 1) restrict writeonly buffer Mix { float mix_out[]; };
layout(push_constant) uniform P {
    uint T, G;
    float inv_k, norm_eps;
    uint p_off, p_st, p_sg;
    uint o_off, o_st, o_sj;
} p;

void main() {
    uint i = flat_index();
    if (i >= p.T * M) return;
    uint t = i / M, j = i % M;
    uint b = p.p_off + t * p.p_st;
    vec4 d = vec4(0.0), ss = vec4(0.0);        // 4 independent chains: loads overlap, not one per trip
    uint g = 0u;
    for (; g + 4u <= p.G; g += 4u) {
        uvec4 o = b + (g + uvec4(0u, 1u, 2u, 3u)) * p.p_sg;
        d += vec4(part[o.x + j], part[o.y + j], part[o.z + j], part[o.w + j]);
        ss += vec4(part[o.x + M], part[o.y + M], part[o.z + M], part[o.w + M]);
    }
    for (; g < p.G; ++g) {
        d.x += part[b + g * p.p_sg + j];
        ss.x += part[b + g * p.p_sg + M];
    }
    mix_out[p.o_off + t * p.o_st + j * p.o_sj] = ((d.x + d.y) + (d.z + d.w)) / sqrt(((ss.x + ss.y) + (ss.z + ss.w)) * p.inv_k + p.norm_eps);
}

#else
#if defined(VEC4)
#define VEC vec4
float dot_v(vec4 a, vec4 b) { return dot(a, b); }
float hsum(vec4 v) { return (v.x + v.y) + (v.z + v.w); }
#else
#define VEC float
float dot_v(float a, float b) { return a * b; }
float hsum(float v) { return v; }
#endif
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
    uint tb;                                   // KSPLIT: tokens per workgroup
#if defined(POST)
    uint s_off, s_st;                          // f (the sublayer's output), in chunks
    uint pw_off, pw_st, pw_sd, cw_off, cw_st, cw_ss, cw_sd;
    uint n_off, n_st, n_sd;                    // X_new, in chunks
#endif
} p;

#if defined(KSPLIT)
#extension GL_KHR_shader_subgroup_shuffle : require
const uint S = 16;                              // chunks per split and stream (a literal: fs has a fixed size)
layout(constant_id = 2) const uint LPT = 4;     // lanes per token (a power of two ≤ the subgroup)
layout(constant_id = 3) const uint TPL = 1;     // tokens per group of LPT lanes: 1, 2 or 4
shared VEC fs[24 * 4 * 16];                     // the split's fn slice: fs[(j·4 + stream)·S + c], j < M
#define FN(i) fs[i]
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

void put_partials(MixAcc A, uint t, uint split) {
    uint ob = p.o_off + t * p.o_st + split * p.o_s2;
    for (uint k = 0u; k <= M; ++k) out_[ob + k] = mixacc_at(A, k);
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
    // a token's LPT lanes are consecutive lanes of one subgroup (full subgroups, WG a multiple of LPT)
    uint pos = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    uint cluster = pos / LPT, lane = pos % LPT;
    uint n_c = min(S, p.chunks - min(c_begin, p.chunks));
    uint t_end = min((block + 1u) * p.tb, p.T);
    for (uint t0 = block * p.tb; t0 < t_end; t0 += TPL * (gl_WorkGroupSize.x / LPT)) {   // uniform loop
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
            post_streams(tpa, c_begin + c, PA, va, ta < t_end);
            if (TPL > 1u) post_streams(tpb, c_begin + c, PB, vb, ta + 1u < t_end);
#endif
            [[unroll]] for (uint s = 0u; s < 4u; ++s) {
                if (TPL > 2u) mixacc_add4(A, B, C, E, va[s], vb[s], vc[s], ve[s], s * S + c, 4u * S);
                else if (TPL > 1u) mixacc_add2(A, B, va[s], vb[s], s * S + c, 4u * S);
                else mixacc_add(A, va[s], s * S + c, 4u * S, true);
            }
        }
        lanes_sum(A);
        if (TPL > 1u) lanes_sum(B);
        if (TPL > 2u) { lanes_sum(C); lanes_sum(E); }
        if (lane == 0u) {
            if (ta < t_end) put_partials(A, ta, split);
            if (TPL > 1u && ta + 1u < t_end) put_partials(B, ta + 1u, split);
            if (TPL > 2u && ta + 2u < t_end) put_partials(C, ta + 2u, split);
            if (TPL > 2u && ta + 3u < t_end) put_partials(E, ta + 3u, split);
        }
    }
}

#elif defined(TILE)
const uint TT = 4, BT = 16 * TT;                // tokens per invocation, tokens per block
const uint BKC = 8;                             // chunks of one stream per step
const uint RMAX = 6;                            // fn rows per invocation: M / 4 ≤ 6
shared VEC xs[BKC][BT + 1];                     // xs[c][t]: token groups read consecutive entries; +1: the
                                                // stores of 8 chunks of one token hit distinct banks
shared VEC fs[BKC][24];                         // fs[c][j], j < M

void main() {
    uint g = flat_group();
    uint block = g / p.G, split = g % p.G;
    uint id = gl_LocalInvocationID.x;           // the workgroup is 64 invocations
    uint tg = id % 16u, rg = id / 16u;
    uint t_base = block * BT;
    uint c_begin = split * p.slice, c_end = min(c_begin + p.slice, p.chunks);
    // per (token, row) a VEC of running products, summed across its components at the end: every
    // product is independent FMAs into its own registers (a dot() per step would chain 4 of them)
    VEC acc[TT][RMAX], ss[TT];
    [[unroll]] for (uint i = 0u; i < TT; ++i) {
        ss[i] = VEC(0.0);
        [[unroll]] for (uint r = 0u; r < RMAX; ++r) acc[i][r] = VEC(0.0);
    }
    // staging: invocation id loads chunk id % 8 of tokens id / 8 + 8·q and of fn rows id / 8 + 8·q
    uint lc = id % BKC, lr = id / BKC;
    for (uint s = 0u; s < 4u; ++s) {
        for (uint c0 = c_begin; c0 < c_end; c0 += BKC) {     // uniform: every invocation takes every step
            uint c = c0 + lc;
            bool in_c = c < c_end;
            [[unroll]] for (uint q = 0u; q < BT / 8u; ++q) {
                uint t = min(t_base + lr + 8u * q, p.T - 1u);    // tokens past T: a real row, never stored
                xs[lc][lr + 8u * q] = in_c ? x[p.x_off + t * p.x_st + s * p.x_ss + c] : VEC(0.0);
            }
            [[unroll]] for (uint q = 0u; q < 3u; ++q) {
                uint j = lr + 8u * q;
                if (j < M) fs[lc][j] = in_c ? fn[p.f_off + j * p.f_sj + s * p.chunks + c] : VEC(0.0);
            }
            barrier();
            [[unroll]] for (uint kk = 0u; kk < BKC; ++kk) {
                VEC xv[TT], fv[RMAX];
                [[unroll]] for (uint i = 0u; i < TT; ++i) xv[i] = xs[kk][tg + 16u * i];
                [[unroll]] for (uint r = 0u; r < RMAX; ++r) if (4u * r < M) fv[r] = fs[kk][rg + 4u * r];
                [[unroll]] for (uint i = 0u; i < TT; ++i) {
                    ss[i] += xv[i] * xv[i];
                    [[unroll]] for (uint r = 0u; r < RMAX; ++r) if (4u * r < M) acc[i][r] += xv[i] * fv[r];
                }
            }
            barrier();
        }
    }
    [[unroll]] for (uint i = 0u; i < TT; ++i) {
        uint t = t_base + tg + 16u * i;
        if (t >= p.T) continue;
        uint ob = p.o_off + t * p.o_st + split * p.o_s2;
        [[unroll]] for (uint r = 0u; r < RMAX; ++r) if (4u * r < M) out_[ob + rg + 4u * r] = hsum(acc[i][r]);
        if (rg == 0u) out_[ob + M] = hsum(ss[i]);
    }
}

#else
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
    if (t < p.T) {                             // workgroup-uniform: a folded grid's extra groups idle
        uint xb = p.x_off + t * p.x_st;
        for (uint c = split * p.slice + gl_LocalInvocationID.x; c < c_end; c += gl_WorkGroupSize.x) {
            VEC xv[4];                         // the 4 streams' loads first: their latencies overlap
            [[unroll]] for (uint s = 0u; s < 4u; ++s) xv[s] = x[xb + s * p.x_ss + c];
            [[unroll]] for (uint s = 0u; s < 4u; ++s) mixacc_add(A, xv[s], p.f_off + s * p.chunks + c, p.f_sj, true);
        }
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
#endif
#endif
