#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | VEC4 ; - | FINAL | KSPLIT | KSPLIT POST
//! variants: VEC4 TC ; - | POST ; - | CM_NV CM_N=8 | CM_NV CM_N=16
//! variants: VEC4 TC TCR ; CM_TT=1 | CM_TT=2 | CM_TT=4 ; - | CM_NV CM_N=8
//! variants: VEC4 TC TCR CM_NV CM_N=8 CM_TT=1 PROBE
//! variants: VEC4 TC TCR CM_TT=1 FNSPLIT
//! variants: REDUCE
// HC_MIX family: a site's flat RMS norm and mixes mat-mul, mix[t,j] = (x_t · fn[j]) / sqrt(mean(x_t²)
// + norm_eps) with x_t = X[t] flattened (4·D), reading each token's X once for all M mixes and its
// sum of squares.
//
// Layout (default and -D FINAL; decode and few tokens): workgroup g → token g / G and split g % G of
// the D axis: chunks [split·slice, (split+1)·slice) of each of the 4 streams. A chunk is a vec4 with
// -D VEC4, else one float. The workgroup is 4 groups of WG/4 invocations, group s taking stream s:
// invocation i takes chunks i % (WG/4), + WG/4, ... of its split in stream i / (WG/4), loads x and
// each fn row's chunk once and keeps the M + 1 running sums in registers (hc_mixacc.glsl); then
// they are reduced across the workgroup (wg_reduce.glsl: subgroupAdd + one shared-memory step).
// One stream an invocation, as HC_POST_MIX: at decode this pass is a chain of latencies, and 4×
// the invocations with a quarter of the fn loads each finish it sooner.
//   default: partials[t, split, 0..M−1] = the split's dot products, [t, split, M] = its Σx² — the
//            layout the whole-site kernel (hc_site.comp) and -D REDUCE finish;
//   FINAL:   (G = 1 only) mix[t, j] directly.
// -D KSPLIT (many tokens; partials): workgroup g → token block g / G (push tb tokens) and split g % G
//   of S = 16 chunks per stream (32 was slower on the H200). The split's fn slice (M·4·S chunks) is staged
//   once in shared
//   memory and every token of the block streams through it: fn is read from memory once per block
//   of tokens, and from shared memory (a broadcast across the block's tokens) inside. LPT (spec 2)
//   consecutive subgroup lanes take one token (chunks lane, lane+LPT, ...), summed by shuffles;
//   with TPL = 2 or 4 (spec 3) they take two or four tokens, each fn chunk read from shared memory
//   once for all of them (TPL = 2: 1.39× faster than 1 at T = 4096 on the H200). With LPT = 1
//   every lane of a subgroup reads the same fn chunk: a broadcast. With RH = 2 (spec 4; M a multiple
//   of 8) two groups of LPT lanes take the same tokens, each half of the rows: per fn chunk loaded, as
//   many products, but each lane holds half the sums, so TPL can double for the same registers
//   (4 tokens × 12 rows: 3 products per operand loaded, against 1.85 with 2 × 24).
//   (Shared arrays have compile-time sizes here: 24·4·S chunks, 24 KiB with vec4.)
//   Each token's X is read once.
// -D KSPLIT -D POST (HC_POST_MIX for many tokens: a layer boundary at prefill): the streams are not
//   read from X but made by the post, X_new[t,d,:] = f[t,:]·post[t,d] + Σ_s comb[t,s,d]·res[t,s,:]
//   (hc_post.glsl, as hc_post.comp), written out, and their partials computed from the registers: the
//   next site's mixes cost no read of X_new. Bindings 0 f, 1 fn (the next site's), 2 partials,
//   3 res, 4 post, 5 comb, 6 X_new; TPL ≤ 2.
// -D TC (many tokens; partials; VEC4 only): the mixes on 16-bit tensor cores at fp32 accuracy.
//   Workgroup g → token block g / G of 64 tokens and split g % G of `slice` chunks per stream;
//   128 invocations. Per step (16 chunks = 64 floats of one stream) the block's x and the M fn rows
//   are staged in shared memory split into two fp16 parts, hi = f16(v·σ) and lo = f16((v·σ − hi)·2¹¹)
//   (σ = 2⁻⁸ for x, 1 for fn), so that x·f = 2⁸·(xhi·fhi + 2⁻¹¹·(xhi·flo + xlo·fhi)) up to the
//   dropped xlo·flo (2⁻²² relative): two fp32 accumulators, C1 = Σ xhi·fhi and C2 = Σ (xhi·flo +
//   xlo·fhi), each product exact. σ keeps |x| < 2²⁴ inside fp16's range; below 2⁻⁶ the parts are
//   subnormal, the error stays under 2⁻²⁸ absolute. Σx² is summed in fp32 while staging (lanes of 16
//   invocations per token, added in the epilogue). The staged rows are XS = 72 halves apart (64 + 8:
//   consecutive rows start on different banks).
//   -D CM_NV: the products by VK_NV_cooperative_matrix, subgroup s of 4 (32 lanes) taking tokens
//     16s..16s+15 against ⌈M / CM_N⌉ tiles of CM_N fn rows (CM_N = 8 or 16, the device's shape
//     16 × CM_N × 16); the accumulators are stored to shared memory at the end.
//   without: the same staging and epilogue with the products formed by FMA loops (invocation i:
//     token i % 64, rows 12·(i / 64) + 0..11) — the tensor-core kernel's arithmetic on any device,
//     for tests.
//   The epilogue writes partials[t, split, j] = 2⁸·(C1 + 2⁻¹¹·C2) and [t, split, M] = Σx².
//   Steps run stream by stream (a token's 64 floats of one stream: 256 contiguous bytes). With
//   -D POST (HC_POST_MIX for many tokens, bindings and push as KSPLIT POST) a step is instead 4
//   chunks of all 4 streams, so that an invocation makes its stream of the new X (hc_post.glsl)
//   from the 4 residual chunks it loads, writes it, and stages it; the fn rows are staged in the
//   same order (k = 16·stream + 4·chunk + component), so the products are the same sums.
// -D REDUCE: the second pass, one invocation per (t, j): Σ over the G partials, then the
//   norm: mix[t, j] = Σ dot / sqrt(Σ Σx² / (4·D) + norm_eps).
// Spec constants: 0 workgroup size (TC: 128), 1 M (mix rows: a multiple of 4, ≤ 24); KSPLIT also 2 LPT (lanes
//   per token), 3 TPL (tokens per lane group, 1, 2 or 4) and 4 RH (row groups, 1 or 2).
// Push (all but REDUCE): T, chunks per stream, slice (chunks per split), G, 1/(4·D), norm_eps,
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
    // RG splits' loads issued before any is added, into RG independent chains: the partials of a
    // token are few (T·G·(M + 1) floats) and the invocations few, so the time is the number of
    // dependent load trips (H200, D = 4096, G = 64: 11.5 against 13.6 µs with 4 loads a trip at
    // T = 4096, 5.1 against 7.4 at T = 512; results/h200/hc_tune_layout_h200.txt, hc_tune_mix_h200.txt)
    const uint RG = 16u;
    vec4 d[RG / 4u], ss[RG / 4u];
    [[unroll]] for (uint q = 0u; q < RG / 4u; ++q) { d[q] = vec4(0.0); ss[q] = vec4(0.0); }
    uint g = 0u;
    for (; g + RG <= p.G; g += RG) {
        float dv[RG], sv[RG];
        [[unroll]] for (uint q = 0u; q < RG; ++q) {
            uint o = b + (g + q) * p.p_sg;
            dv[q] = part[o + j];
            sv[q] = part[o + M];
        }
        [[unroll]] for (uint q = 0u; q < RG / 4u; ++q) {
            d[q] += vec4(dv[4u * q], dv[4u * q + 1u], dv[4u * q + 2u], dv[4u * q + 3u]);
            ss[q] += vec4(sv[4u * q], sv[4u * q + 1u], sv[4u * q + 2u], sv[4u * q + 3u]);
        }
    }
    for (; g + 4u <= p.G; g += 4u) {           // the rest: 4 a trip, then one (constant indices only:
        uvec4 o = b + (g + uvec4(0u, 1u, 2u, 3u)) * p.p_sg;      // an array indexed in a loop may live
        d[0] += vec4(part[o.x + j], part[o.y + j], part[o.z + j], part[o.w + j]);    // in local memory)
        ss[0] += vec4(part[o.x + M], part[o.y + M], part[o.z + M], part[o.w + M]);
    }
    for (; g < p.G; ++g) {
        d[0].x += part[b + g * p.p_sg + j];
        ss[0].x += part[b + g * p.p_sg + M];
    }
    vec4 dt = (d[0] + d[1]) + (d[2] + d[3]), st = (ss[0] + ss[1]) + (ss[2] + ss[3]);
    mix_out[p.o_off + t * p.o_st + j * p.o_sj] = ((dt.x + dt.y) + (dt.z + dt.w)) /
        sqrt(((st.x + st.y) + (st.z + st.w)) * p.inv_k + p.norm_eps);
}

#else
#if defined(VEC4)
#define VEC vec4
float dot_v(vec4 a, vec4 b) { return dot(a, b); }
#else
#define VEC float
float dot_v(float a, float b) { return a * b; }
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
#if defined(TCR) && !defined(PROBE) && !defined(FNSPLIT)
layout(binding = 1) restrict readonly buffer Fn { uvec4 fnp[]; };     // fn split by -D FNSPLIT
#else
layout(binding = 1) restrict readonly buffer Fn { VEC fn[]; };
#endif
#if defined(FNSPLIT)
layout(binding = 2) restrict writeonly buffer Out { uvec4 out_u[]; };
#else
layout(binding = 2) restrict writeonly buffer Out { float out_[]; };
#endif
layout(push_constant) uniform P {
    uint T, chunks, slice, G;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_s2;
    uint tb;                                   // KSPLIT: tokens per workgroup
#if defined(TCR) && !defined(PROBE) && !defined(FNSPLIT)
    uint zero;                                 // 0 (tcr_split)
#endif
#if defined(POST)
    uint s_off, s_st;                          // f (the sublayer's output), in chunks
    uint pw_off, pw_st, pw_sd, cw_off, cw_st, cw_ss, cw_sd;
    uint n_off, n_st, n_sd;                    // X_new, in chunks
#endif
} p;

#if defined(KSPLIT)
#extension GL_KHR_shader_subgroup_shuffle : require
const uint S = 16;                              // chunks per split and stream (mix_kernels.KSPLIT_S)
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

#elif defined(TC)
#if !defined(VEC4)
#error "TC stages whole vec4 chunks"
#endif
const uint BT = 64;                             // tokens per block
const uint KC = 16;                             // chunks (vec4) of one stream per step
const uint XS = 4u * KC + 8u;                   // halves between staged rows
const float X_SIGMA = 1.0 / 256.0, LO = 2048.0;
// v·σ split into fp16 parts: hi = v·σ on fp16's grid and lo = (v·σ − hi)·2¹¹ (exact in fp32; rounded
// when staged). hi is rounded by integer arithmetic to 11 significant bits (multiples of 2⁻²⁴ below
// fp16's normal range), so that converting it to fp16 is exact. Not f32(f16(a)): the H200's compiler
// folds that round trip to a (unpackHalf2x16(packHalf2x16(a)) too), lo was then 0 and the sums had
// fp16's 2⁻¹¹ relative error.
void split16(vec4 v, float sigma, out vec4 hi, out vec4 lo) {
    vec4 a = v * sigma;
    vec4 normal = uintBitsToFloat((floatBitsToUint(a) + 0x1000u) & 0xFFFFE000u);   // |a| rounded, sign kept
    vec4 sub = round(a * 16777216.0) * (1.0 / 16777216.0);
    hi = mix(normal, sub, lessThan(abs(a), vec4(1.0 / 16384.0)));
    lo = (a - hi) * LO;
}
#if defined(TCR)
#extension GL_KHR_shader_subgroup_shuffle : require
#if defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#elif defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
const uint NT = (24u + CM_N - 1u) / CM_N;       // fn row tiles (M ≤ 24)
const uint NP = NT * CM_N;                      // fn rows staged (zeros past M)
const uint CW = NP;                             // the accumulators' row width in shared memory
shared float16_t xh[BT * XS], xl[BT * XS], fh[NP * XS], fl[NP * XS];
shared float cs[2u * BT * CW + BT * KC];        // C1, C2, then the Σx² lanes
#define C1(t, j) cs[(t) * CW + (j)]
#define C2(t, j) cs[BT * CW + (t) * CW + (j)]
#define SSQ(t, l) cs[2u * BT * CW + (t) * KC + (l)]
void stage_x(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) { xh[i + e] = float16_t(hi[e]); xl[i + e] = float16_t(lo[e]); }
}
void stage_f(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) { fh[i + e] = float16_t(hi[e]); fl[i + e] = float16_t(lo[e]); }
}
#else
const uint NP = 24u, CW = 24u;
// hi and lo as one packHalf2x16 word; after the last step the epilogue's sums (as float bits)
shared uint xp[BT * XS], fp[NP * XS];
#define C1(t, j) uintBitsToFloat(xp[(t) * CW + (j)])
#define C2(t, j) uintBitsToFloat(xp[BT * CW + (t) * CW + (j)])
#define SSQ(t, l) uintBitsToFloat(xp[2u * BT * CW + (t) * KC + (l)])
void stage_x(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) xp[i + e] = packHalf2x16(vec2(hi[e], lo[e]));
}
void stage_f(uint i, vec4 v, float sigma) {
    vec4 hi, lo;
    split16(v, sigma, hi, lo);
    [[unroll]] for (uint e = 0u; e < 4u; ++e) fp[i + e] = packHalf2x16(vec2(hi[e], lo[e]));
}
#endif

#if defined(POST)
#include "hc_post.glsl"
#endif

#if defined(TCR)
layout(constant_id = 2) const uint TCR_AH = 240u;     // spec constants (probed per device; these: the
layout(constant_id = 3) const uint TCR_AF = 58596u;   // H200's, hc.tcr.TCR_H200_LAYOUT)
layout(constant_id = 4) const uint TCR_BF = 228u;
#define A_H(e) ((TCR_AH >> (e)) & 1u)
#define A_F(e) ((TCR_AF >> (2u * (e))) & 3u)
#define B_F(e) ((TCR_BF >> (2u * (e))) & 3u)
#define KK(f) (((f) & 1u) + 8u * ((f) >> 1u))     // a float of the chunk → its logical column 2q + 0, 1, 8, 9
#endif

#if defined(TCR) && defined(PROBE)
// -D PROBE: the device's element layout of the 16 × 16 A, 16 × 8 B and 16 × 8 C matrices TCR uses, for
// hc.tcr.tcr_layout: one subgroup of 32 loads matrices whose entry (r, c) is its flat index and
// writes lane l's element e at out[l·8 + e] (A), 256 + l·4 + e (B), 384 + l·4 + e (C).
shared float16_t pa[256], pb[128];
shared float pc[128];
void main() {
    uint l = gl_LocalInvocationID.x;
    for (uint i = l; i < 256u; i += 32u) pa[i] = float16_t(float(i));
    for (uint i = l; i < 128u; i += 32u) { pb[i] = float16_t(float(i)); pc[i] = float(i); }
    barrier();
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 8> b;
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 8> c;
    coopMatLoadNV(a, pa, 0u, 16u, false);
    coopMatLoadNV(b, pb, 0u, 8u, false);
    coopMatLoadNV(c, pc, 0u, 8u, false);
    for (uint e = 0u; e < 8u; ++e) out_[l * 8u + e] = e < uint(a.length()) ? float(a[e]) : -1.0;
    for (uint e = 0u; e < 4u; ++e) out_[256u + l * 4u + e] = e < uint(b.length()) ? float(b[e]) : -1.0;
    for (uint e = 0u; e < 4u; ++e) out_[384u + l * 4u + e] = e < uint(c.length()) ? c[e] : -1.0;
    if (l == 0u) out_[512] = float(a.length() * 10000 + b.length() * 100 + c.length());
}
#elif defined(TCR) && defined(FNSPLIT)
// -D FNSPLIT (HC_MIX_FN_SPLIT): fn as TCR's B elements, split into fp16 hi and lo once per call, so that
// TCR's lanes load them (one uvec4 a lane, fn tile and step) instead of splitting fn in every
// workgroup. Invocation i = ((step·4 + j)·3 + n)·32 + lane, step a 64-float step of the 4·D columns
// (stream step / (chunks / 16)): B element e of lane 4g + q is row k = g + 8·(B_F(e) >> 1), column
// 2q + (B_F(e) & 1) of fn tile n, i.e. float (g & 1) + 2·(B_F(e) >> 1) of chunk 4·(g / 2) + j of fn row
// 8n + 2q + (B_F(e) & 1) (zero past M). Push as the other variants: chunks, G = steps, fn (offset, row
// stride), out offset (in uvec4).
void main() {
    uint i = flat_index();
    if (i >= p.G * 384u) return;
    uint lane = i & 31u, n = (i >> 5u) % 3u, j = (i / 96u) & 3u, step = i / 384u;
    uint gq = lane >> 2u, q = lane & 3u;
    uint per = p.chunks / 16u, s = step / per;
    uint c = s * p.chunks + (step % per) * 16u + 4u * (gq >> 1u) + j;
    vec4 f[2];
    [[unroll]] for (uint r = 0u; r < 2u; ++r) {
        uint row = 8u * n + 2u * q + r;
        f[r] = row < M ? fn[p.f_off + row * p.f_sj + c] : vec4(0.0);
    }
    bool odd = (gq & 1u) == 1u;                 // w[2·(k is g + 8) + (column is odd)]
    vec4 w = odd ? vec4(f[0].y, f[1].y, f[0].w, f[1].w) : vec4(f[0].x, f[1].x, f[0].z, f[1].z);
    vec4 h, l;
    split16(w, 1.0, h, l);
    out_u[p.o_off + i] = uvec4(packHalf2x16(vec2(h[B_F(0u)], h[B_F(1u)])), packHalf2x16(vec2(h[B_F(2u)], h[B_F(3u)])),
                               packHalf2x16(vec2(l[B_F(0u)], l[B_F(1u)])), packHalf2x16(vec2(l[B_F(2u)], l[B_F(3u)])));
}
#elif defined(TCR)
// -D TCR: x split in registers straight into the elements of the A matrices, no staging. With
// -D CM_NV on VK_NV_cooperative_matrix's 16 × 8 × 16 fp16 shape. Lane l = 4g + q holds, of a 16 × 16
// A, rows g, g + 8 and columns 2q, 2q+1, 2q+8, 2q+9; of a 16 × 8 B, rows g, g + 8 and columns 2q,
// 2q+1 (as the H200 has them); which element is which the device probe (-D PROBE below,
// hc.tcr.tcr_layout) reads and spec constants 2–4 (TCR_AH, TCR_AF, TCR_BF) carry: A element e is in
// row g + 8·A_H(e), column 2q + KK(A_F(e)); B element e in row g + 8·(B_F(e) >> 1), column 2q + (B_F(e)
// & 1). A sum over k is the same in any order of k, so the logical columns 2q, 2q+1, 2q+8, 2q+9 take
// the 4 floats of one vec4 chunk (4q + j of a 16-chunk step, j the 16-deep product): each lane loads
// whole chunks of x, 4 lanes 256 contiguous bytes of a token per step; B's rows gq, gq + 8 are then
// floats of the chunks 4·(gq / 2) + j of its two fn rows.
// Without CM_NV the same elements go through shared memory and FMA loops (32-invocation groups
// stand in for the subgroups): the kernel's data flow and arithmetic on any device, for tests.
// Workgroup: 4 groups of 32 invocations, each TT (CM_TT) tiles of 16 tokens; split g % G of `slice`
// chunks per stream; tb = 64·TT tokens a workgroup.
const uint TT = CM_TT;
const uint TW = 64u * TT;                       // tokens per workgroup
shared float ct[TW * 24u];                      // C1 + 2⁻¹¹·C2: [token][24]
shared float sq[TW];
#if defined(CM_NV)
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>
#else
// the emulation's matrices: per 32-invocation group A (hi, lo) of each tile, B (hi, lo) of each fn tile
// (hi, lo) as one packHalf2x16 word: the rounding to fp16 the matrices' elements have
shared uint ea[4u * TT * 256u], eb[4u * 3u * 128u];
#endif
// x·σ split into fp16 hi and lo = (x·σ − hi)·2¹¹ as packHalf2x16 words (floats 0, 1 | 2, 3): hi is the
// conversion's own rounding, read back through p.zero (0 at run time) so that the compiler cannot fold
// f32(f16(a)) to a (split16's trouble). About 5 operations a float against split16's 12 and its two
// conversions; the products see the same hi + 2⁻¹¹·lo to fp32's rounding. Where hi is an fp16
// subnormal (|x| < 2⁻⁶) the read-back must agree with the matrices' reading of the same bits: both
// keep subnormals on the H200.
void tcr_split(vec4 v, out uvec2 hb, out uvec2 lb) {
    vec4 a = v * X_SIGMA;
    hb = uvec2(packHalf2x16(a.xy), packHalf2x16(a.zw));
    vec4 hi = vec4(unpackHalf2x16(hb.x ^ p.zero), unpackHalf2x16(hb.y ^ p.zero));
    vec4 lo = (a - hi) * LO;
    lb = uvec2(packHalf2x16(lo.xy), packHalf2x16(lo.zw));
}
void main() {
    uint g = flat_group();
    uint block = g / p.G, split = g % p.G;
    uint lane = gl_LocalInvocationID.x & 31u, grp = gl_LocalInvocationID.x >> 5u;
    uint gq = lane >> 2u, q = lane & 3u;
    uint tl0 = grp * 16u * TT;                  // this group's first token in the workgroup's block
    uint t0 = block * TW + tl0;
    uint c_begin = split * p.slice, c_end = min(c_begin + p.slice, p.chunks);
    uint n_ss = (c_end - c_begin) / 16u;        // 16-chunk steps per stream (the launch checks divisibility)
#if defined(CM_NV)
    MAT_C c1[TT][3], c2[TT][3];
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint n = 0u; n < 3u; ++n) {
        c1[tt][n] = MAT_C(0.0);
        c2[tt][n] = MAT_C(0.0);
    }
#else
    float c1[TT][3][4], c2[TT][3][4];
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint n = 0u; n < 3u; ++n)
        [[unroll]] for (uint e = 0u; e < 4u; ++e) { c1[tt][n][e] = 0.0; c2[tt][n][e] = 0.0; }
#endif
    float ssq[TT][2];
    uint xrow[TT][2];
    bool xlive[TT][2];
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint h = 0u; h < 2u; ++h) {
        uint t = t0 + 16u * tt + gq + 8u * h;
        xlive[tt][h] = t < p.T;
        xrow[tt][h] = p.x_off + min(t, p.T - 1u) * p.x_st;
        ssq[tt][h] = 0.0;
    }
    for (uint s = 0u; s < 4u; ++s) {
        for (uint ss = 0u; ss < n_ss; ++ss) {
            uint cb = c_begin + 16u * ss + 4u * q;
            vec4 xv[TT][2][4];
            [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint h = 0u; h < 2u; ++h)
                [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                    vec4 v = x[xrow[tt][h] + s * p.x_ss + cb + j];
                    xv[tt][h][j] = xlive[tt][h] ? v : vec4(0.0);
                }
            // B's elements of this lane, split by -D FNSPLIT: fp16 (hi of elements 0, 1; hi 2, 3; lo 0, 1; lo 2, 3)
            uvec4 fv[4][3];
            uint fb = p.f_off + (s * (p.chunks / 16u) + c_begin / 16u + ss) * 384u + lane;
            [[unroll]] for (uint j = 0u; j < 4u; ++j) [[unroll]] for (uint n = 0u; n < 3u; ++n)
                fv[j][n] = fnp[fb + (j * 3u + n) * 32u];
            [[unroll]] for (uint j = 0u; j < 4u; ++j) {
#if defined(CM_NV)
                MAT_B bh[3], bl[3];
#else
                barrier();                      // the previous step's products have read ea, eb
#endif
                [[unroll]] for (uint n = 0u; n < 3u; ++n) {
                    uvec4 b = fv[j][n];
#if defined(CM_NV)
                    f16vec2 h01 = unpackFloat2x16(b.x), h23 = unpackFloat2x16(b.y);
                    f16vec2 l01 = unpackFloat2x16(b.z), l23 = unpackFloat2x16(b.w);
                    bh[n][0] = h01.x; bh[n][1] = h01.y; bh[n][2] = h23.x; bh[n][3] = h23.y;
                    bl[n][0] = l01.x; bl[n][1] = l01.y; bl[n][2] = l23.x; bl[n][3] = l23.y;
#else
                    vec4 h = vec4(unpackHalf2x16(b.x), unpackHalf2x16(b.y)), l = vec4(unpackHalf2x16(b.z), unpackHalf2x16(b.w));
                    [[unroll]] for (uint e = 0u; e < 4u; ++e) {          // B element e: (k, column)
                        uint k = gq + 8u * (B_F(e) >> 1u), col = 2u * q + (B_F(e) & 1u);
                        eb[(grp * 3u + n) * 128u + k * 8u + col] = packHalf2x16(vec2(h[e], l[e]));
                    }
#endif
                }
                [[unroll]] for (uint tt = 0u; tt < TT; ++tt) {
                    vec4 a0 = xv[tt][0][j], a1 = xv[tt][1][j];
                    ssq[tt][0] += dot(a0, a0);
                    ssq[tt][1] += dot(a1, a1);
                    uvec2 hb[2], lb[2];
                    tcr_split(a0, hb[0], lb[0]);
                    tcr_split(a1, hb[1], lb[1]);
                    // element e: row gq + 8·A_H(e) (a0 or a1), float A_F(e) of its chunk
#if defined(CM_NV)
                    MAT_A mh, ml;
                    [[unroll]] for (uint e = 0u; e < 8u; ++e) {
                        mh[e] = unpackFloat2x16(hb[A_H(e)][A_F(e) >> 1u])[A_F(e) & 1u];
                        ml[e] = unpackFloat2x16(lb[A_H(e)][A_F(e) >> 1u])[A_F(e) & 1u];
                    }
                    [[unroll]] for (uint n = 0u; n < 3u; ++n) {
                        if (8u * n >= M) break;
                        c1[tt][n] = coopMatMulAddNV(mh, bh[n], c1[tt][n]);
                        c2[tt][n] = coopMatMulAddNV(mh, bl[n], c2[tt][n]);
                        c2[tt][n] = coopMatMulAddNV(ml, bh[n], c2[tt][n]);
                    }
#else
                    [[unroll]] for (uint e = 0u; e < 8u; ++e) {
                        vec2 h = unpackHalf2x16(hb[A_H(e)][A_F(e) >> 1u]), l = unpackHalf2x16(lb[A_H(e)][A_F(e) >> 1u]);
                        ea[(grp * TT + tt) * 256u + (gq + 8u * A_H(e)) * 16u + 2u * q + KK(A_F(e))] =
                            packHalf2x16(vec2(h[A_F(e) & 1u], l[A_F(e) & 1u]));
                    }
#endif
                }
#if !defined(CM_NV)
                barrier();
                [[unroll]] for (uint tt = 0u; tt < TT; ++tt) [[unroll]] for (uint n = 0u; n < 3u; ++n) {
                    if (8u * n >= M) break;
                    [[unroll]] for (uint e = 0u; e < 4u; ++e) {           // C element e: (row, column)
                        uint row = gq + 8u * (e >> 1u), col = 2u * q + (e & 1u);
                        uint oa = (grp * TT + tt) * 256u + row * 16u, ob = (grp * 3u + n) * 128u + col;
                        for (uint k = 0u; k < 16u; ++k) {
                            vec2 xa = unpackHalf2x16(ea[oa + k]), fb = unpackHalf2x16(eb[ob + k * 8u]);
                            c1[tt][n][e] = fma(xa.x, fb.x, c1[tt][n][e]);
                            c2[tt][n][e] = fma(xa.y, fb.x, fma(xa.x, fb.y, c2[tt][n][e]));
                        }
                    }
                }
#endif
            }
        }
    }
    // epilogue: C1, C2 to shared memory ([token][24]), Σx² summed over the 4 lanes of a row
    [[unroll]] for (uint tt = 0u; tt < TT; ++tt) {
        uint r = (tl0 + 16u * tt) * 24u;
        [[unroll]] for (uint n = 0u; n < 3u; ++n) {
#if defined(CM_NV)
            MAT_C c = c1[tt][n] + c2[tt][n] * float(1.0 / LO);
            coopMatStoreNV(c, ct, r + 8u * n, 24u, false);
#else
            [[unroll]] for (uint e = 0u; e < 4u; ++e)
                ct[r + (gq + 8u * (e >> 1u)) * 24u + 8u * n + 2u * q + (e & 1u)] = c1[tt][n][e] + c2[tt][n][e] * (1.0 / LO);
#endif
        }
        [[unroll]] for (uint h = 0u; h < 2u; ++h) {
            float v = ssq[tt][h];
            v += subgroupShuffleXor(v, 1u);     // the 4 lanes of a row: aligned within any subgroup ≥ 4
            v += subgroupShuffleXor(v, 2u);
            if (q == 0u) sq[tl0 + 16u * tt + gq + 8u * h] = v;
        }
    }
    barrier();
    for (uint i = gl_LocalInvocationID.x; i < TW * (M + 1u); i += gl_WorkGroupSize.x) {
        uint tl = i / (M + 1u), j = i % (M + 1u), t = block * TW + tl;
        if (t >= p.T) continue;
        float v = j < M ? ct[tl * 24u + j] / X_SIGMA : sq[tl];
        out_[p.o_off + t * p.o_st + split * p.o_s2 + j] = v;
    }
}
#else
void main() {
    uint g = flat_group();
    uint block = g / p.G, split = g % p.G;
    uint id = gl_LocalInvocationID.x;           // the workgroup is 128 invocations
    uint t_base = block * BT;
    uint c_begin = split * p.slice, c_end = min(c_begin + p.slice, p.chunks);
    // staging: invocation id takes slot id % 16 of a step for tokens id / 16 + 8·r and fn rows
    // id / 16 + 8·q; a slot is a chunk of the step's stream, or with POST stream slot / 4, chunk slot % 4
    uint lc = id % KC, lr = id / KC;
#if defined(POST)
    const uint CPS = KC / 4u;                   // chunks per step
    uint n_steps = (c_end - c_begin + CPS - 1u) / CPS;
    uint ps = lc / 4u;                          // this invocation's stream of the new X
    float pw[BT / 8u];                          // its tokens' post[t, ps] and comb[t, 0..3, ps]
    vec4 cw[BT / 8u];
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) {
        uint t = min(t_base + lr + 8u * r, p.T - 1u);
        uint cb = p.cw_off + t * p.cw_st + ps * p.cw_sd;
        pw[r] = postw[p.pw_off + t * p.pw_st + ps * p.pw_sd];
        cw[r] = vec4(combw[cb], combw[cb + p.cw_ss], combw[cb + 2u * p.cw_ss], combw[cb + 3u * p.cw_ss]);
    }
#else
    uint n_steps = 4u * ((c_end - c_begin + KC - 1u) / KC);
#endif
    float ssq[BT / 8u];
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) ssq[r] = 0.0;
#if defined(CM_NV)
    fcoopmatNV<32, gl_ScopeSubgroup, 16, CM_N> c1[NT], c2[NT];
    [[unroll]] for (uint n = 0u; n < NT; ++n) {
        c1[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, CM_N>(0.0);
        c2[n] = fcoopmatNV<32, gl_ScopeSubgroup, 16, CM_N>(0.0);
    }
    uint row0 = 16u * gl_SubgroupID;            // this subgroup's tokens in the block
#else
    uint et = id % BT, ej = 12u * (id / BT);    // this invocation's token and first fn row
    float c1[12], c2[12];
    [[unroll]] for (uint r = 0u; r < 12u; ++r) { c1[r] = 0.0; c2[r] = 0.0; }
#endif
    for (uint step = 0u; step < n_steps; ++step) {        // uniform: every invocation takes every step
#if defined(POST)
        uint s = ps, c = c_begin + step * CPS + lc % 4u;
#else
        uint per = n_steps / 4u, s = step / per, c = c_begin + (step % per) * KC + lc;
#endif
        bool in_c = c < c_end;
        [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) {
            uint t = t_base + lr + 8u * r;
            bool live = in_c && t < p.T;
#if defined(POST)
            vec4 v = vec4(0.0);
            if (live) {
                uint rb = p.x_off + t * p.x_st + c;
                v = post_stream(fsub[p.s_off + t * p.s_st + c], pw[r], cw[r], x[rb], x[rb + p.x_ss],
                                x[rb + 2u * p.x_ss], x[rb + 3u * p.x_ss]);
                xnew[p.n_off + t * p.n_st + s * p.n_sd + c] = v;
            }
#else
            vec4 v = live ? x[p.x_off + t * p.x_st + s * p.x_ss + c] : vec4(0.0);
#endif
            ssq[r] += dot(v, v);
            stage_x((lr + 8u * r) * XS + 4u * lc, v, X_SIGMA);
        }
        [[unroll]] for (uint q = 0u; q < NP / 8u; ++q) {
            uint j = lr + 8u * q;
            vec4 v = in_c && j < M ? fn[p.f_off + j * p.f_sj + s * p.chunks + c] : vec4(0.0);
            stage_f(j * XS + 4u * lc, v, 1.0);
        }
        barrier();
#if defined(CM_NV)
        [[unroll]] for (uint kk = 0u; kk < 4u * KC; kk += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ah, al;
            coopMatLoadNV(ah, xh, row0 * XS + kk, XS, false);
            coopMatLoadNV(al, xl, row0 * XS + kk, XS, false);
            [[unroll]] for (uint n = 0u; n < NT; ++n) {
                if (n * CM_N >= M) break;
                fcoopmatNV<16, gl_ScopeSubgroup, 16, CM_N> bh, bl;    // column-major: (k, j) at j·XS + k
                coopMatLoadNV(bh, fh, n * CM_N * XS + kk, XS, true);
                coopMatLoadNV(bl, fl, n * CM_N * XS + kk, XS, true);
                c1[n] = coopMatMulAddNV(ah, bh, c1[n]);
                c2[n] = coopMatMulAddNV(ah, bl, c2[n]);
                c2[n] = coopMatMulAddNV(al, bh, c2[n]);
            }
        }
#else
        for (uint k = 0u; k < 4u * KC; ++k) {
            vec2 xv = unpackHalf2x16(xp[et * XS + k]);
            [[unroll]] for (uint r = 0u; r < 12u; ++r) {
                if (ej + r >= M) break;
                vec2 fv = unpackHalf2x16(fp[(ej + r) * XS + k]);
                c1[r] = fma(xv.x, fv.x, c1[r]);
                c2[r] = fma(xv.y, fv.x, fma(xv.x, fv.y, c2[r]));
            }
        }
#endif
        barrier();
    }
    // epilogue: the accumulators and the Σx² lanes to shared memory, then one value per invocation
#if defined(CM_NV)
    [[unroll]] for (uint n = 0u; n < NT; ++n) {
        coopMatStoreNV(c1[n], cs, row0 * CW + n * CM_N, CW, false);
        coopMatStoreNV(c2[n], cs, BT * CW + row0 * CW + n * CM_N, CW, false);
    }
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) SSQ(lr + 8u * r, lc) = ssq[r];
#else
    [[unroll]] for (uint r = 0u; r < 12u; ++r) {
        xp[et * CW + ej + r] = floatBitsToUint(c1[r]);          // rows past M: zeros, never read
        xp[BT * CW + et * CW + ej + r] = floatBitsToUint(c2[r]);
    }
    [[unroll]] for (uint r = 0u; r < BT / 8u; ++r) xp[2u * BT * CW + (lr + 8u * r) * KC + lc] = floatBitsToUint(ssq[r]);
#endif
    barrier();
    for (uint i = id; i < BT * (M + 1u); i += gl_WorkGroupSize.x) {
        uint tl = i / (M + 1u), j = i % (M + 1u), t = t_base + tl;
        if (t >= p.T) continue;
        float v;
        if (j < M) {
            v = (C1(tl, j) + C2(tl, j) * (1.0 / LO)) / X_SIGMA;
        } else {
            v = 0.0;
            for (uint l = 0u; l < KC; ++l) v += SSQ(tl, l);
        }
        out_[p.o_off + t * p.o_st + split * p.o_s2 + j] = v;
    }
}
#endif

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
    uint q = gl_WorkGroupSize.x / 4u, s = gl_LocalInvocationID.x / q;     // (WG a multiple of 4)
    if (t < p.T) {                             // workgroup-uniform: a folded grid's extra groups idle
        uint xb = p.x_off + t * p.x_st + s * p.x_ss;
        for (uint c = split * p.slice + gl_LocalInvocationID.x % q; c < c_end; c += q)
            mixacc_add(A, x[xb + c], p.f_off + s * p.chunks + c, p.f_sj, true);
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
