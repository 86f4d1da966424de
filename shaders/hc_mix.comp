#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | VEC4 ; - | FINAL | KSPLIT
//! variants: REDUCE
// HC_MIX family: a site's flat RMS norm and mixes mat-mul, mix[t,j] = (x_t · fn[j]) / sqrt(mean(x_t²)
// + norm_eps) with x_t = X[t] flattened (4·D), reading each token's X once for all M mixes and its
// sum of squares.
//
// Layout (default and -D FINAL): workgroup g → token tile g / G (R consecutive tokens, spec 2) and
// split g % G of the D axis: chunks [split·slice, (split+1)·slice) of each of the 4 streams. A chunk
// is a vec4 with -D VEC4, else one float. Invocation i takes chunks i, i+WG, ... of its split and keeps
// R·(M+1) running sums in registers: for every chunk it loads the R tokens' x and each fn row once,
// so fn is read once per tile, not per token, and X once in all. Tokens past T in the last tile
// re-read token T−1 (no branch in the loop) and are not stored. Then every sum is reduced across
// the workgroup (wg_reduce.glsl: subgroupAdd + one shared-memory step).
//   default: partials[t, split, 0..M−1] = the split's dot products, [t, split, M] = its Σx² — the
//            layout the whole-site kernel (hc_site.comp) and -D REDUCE finish;
//   FINAL:   (G = 1 only) mix[t, j] directly.
// -D KSPLIT (prefill; partials): workgroup g → token block g / G (push tb tokens) and split g % G of S
//   chunks (spec 4) per stream. The split's fn slice (M·4·S chunks) is staged once in shared memory
//   and every token of the block streams through it: fn is read once per block of tokens from
//   memory, and from shared memory (broadcast across the block's tokens) inside. LPT (spec 5)
//   consecutive subgroup lanes take one token (chunks lane, lane+LPT, ...), summed by shuffles.
// -D REDUCE: the second pass, one invocation per (t, j): Σ over the G partials, then the
//   norm: mix[t, j] = Σ dot / sqrt(Σ Σx² / (4·D) + norm_eps).
// Spec constants: 0 workgroup size, 1 M (mix rows), 2 R (tokens per tile), 3 RG (row groups); KSPLIT
//   also 4 S (chunks per split) and 5 LPT (lanes per token).
// Push (tile kernels): T, chunks per stream, slice (chunks per split), G, 1/(4·D), norm_eps,
//   X (offset, token and stream strides, in chunks), fn (offset, row stride, in chunks; fn[j, s·D + d]
//   is chunk s·chunks + c of row j), out (offset, token stride, split or row stride), tokens per
//   block (KSPLIT).
// Push (REDUCE): T, G, 1/(4·D), norm_eps, partials (offset, token and split strides), out (offset,
//   token and row strides).
#include "common.glsl"
layout(constant_id = 1) const uint M = 24;
layout(constant_id = 2) const uint R = 1;
// Row groups (spec 3; tile kernels): invocation i works on chunk lane i % (WG/RG) and the mix rows j
// with j % RG == i / (WG/RG) (Σx² in row group 0). At decode a token's fn (M·4·D floats) is the data
// to stream, and RG > 1 spreads it over RG times more invocations, each with fewer loads in flight.
layout(constant_id = 3) const uint RG = 1;

#if defined(REDUCE)
layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) writeonly buffer Mix { float mix_out[]; };
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
    float d = 0.0, ss = 0.0;
    for (uint g = 0u; g < p.G; ++g) {
        d += part[b + g * p.p_sg + j];
        ss += part[b + g * p.p_sg + M];
    }
    mix_out[p.o_off + t * p.o_st + j * p.o_sj] = d / sqrt(ss * p.inv_k + p.norm_eps);
}

#else
#if defined(VEC4)
#define VEC vec4
float dot_v(vec4 a, vec4 b) { return dot(a, b); }
#else
#define VEC float
float dot_v(float a, float b) { return a * b; }
#endif
layout(binding = 0) readonly buffer X { VEC x[]; };
layout(binding = 1) readonly buffer Fn { VEC fn[]; };
layout(binding = 2) writeonly buffer Out { float out_[]; };
layout(push_constant) uniform P {
    uint T, chunks, slice, G;
    float inv_k, norm_eps;
    uint x_off, x_st, x_ss;
    uint f_off, f_sj;
    uint o_off, o_st, o_s2;
    uint tb;                                   // KSPLIT: tokens per workgroup
} p;

#if defined(KSPLIT)
#extension GL_KHR_shader_subgroup_shuffle : require
layout(constant_id = 4) const uint S = 16;      // chunks per split (per stream)
layout(constant_id = 5) const uint LPT = 4;     // lanes per token (a power of two ≤ the subgroup)
shared VEC fs[M * 4u * S];                      // the split's fn slice: fs[(j·4 + stream)·S + c]

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
    for (uint t0 = block * p.tb; t0 < t_end; t0 += gl_WorkGroupSize.x / LPT) {   // uniform loop
        uint t = t0 + cluster;
        uint tc = min(t, p.T - 1u);            // lanes past the block compute on a real token, store nothing
        float acc[M + 1u];
        [[unroll]] for (uint k = 0u; k <= M; ++k) acc[k] = 0.0;
        for (uint s = 0u; s < 4u; ++s) {
            uint xb = p.x_off + tc * p.x_st + s * p.x_ss + c_begin;
            for (uint c = lane; c < n_c; c += LPT) {
                VEC xv = x[xb + c];
                acc[M] += dot_v(xv, xv);
                [[unroll]] for (uint j = 0u; j < M; ++j) acc[j] += dot_v(xv, fs[(j * 4u + s) * S + c]);
            }
        }
        [[unroll]] for (uint k = 0u; k <= M; ++k)
            [[unroll]] for (uint m = 1u; m < LPT; m <<= 1u) acc[k] += subgroupShuffleXor(acc[k], m);
        if (t < t_end && lane == 0u)
            [[unroll]] for (uint k = 0u; k <= M; ++k) out_[p.o_off + t * p.o_st + split * p.o_s2 + k] = acc[k];
    }
}

#else
#define WG_NV (R * (M + 1u))
#include "wg_reduce.glsl"

void main() {
    uint g = flat_group();
    uint t0 = (g / p.G) * R, split = g % p.G;
    uint c_end = min((split + 1u) * p.slice, p.chunks);
    const uint CL = gl_WorkGroupSize.x / RG;   // chunk lanes
    uint lane = gl_LocalInvocationID.x % CL, rg = gl_LocalInvocationID.x / CL;
    float acc[WG_NV];                          // acc[r·(M+1) + j]: dots j < M, then Σx²
    [[unroll]] for (uint k = 0u; k < WG_NV; ++k) acc[k] = 0.0;
    if (t0 < p.T) {                            // workgroup-uniform: a folded grid's extra groups idle
        uint xb[R];
        [[unroll]] for (uint r = 0u; r < R; ++r) xb[r] = p.x_off + min(t0 + r, p.T - 1u) * p.x_st;
        for (uint s = 0u; s < 4u; ++s) {
            for (uint c = split * p.slice + lane; c < c_end; c += CL) {
                VEC xv[R];
                [[unroll]] for (uint r = 0u; r < R; ++r) {
                    xv[r] = x[xb[r] + s * p.x_ss + c];
                    if (rg == 0u) acc[r * (M + 1u) + M] += dot_v(xv[r], xv[r]);
                }
                uint fb = p.f_off + s * p.chunks + c;
                [[unroll]] for (uint j = 0u; j < M; ++j) {
                    if (j % RG != rg) continue;
                    VEC f = fn[fb + j * p.f_sj];
                    [[unroll]] for (uint r = 0u; r < R; ++r) acc[r * (M + 1u) + j] += dot_v(xv[r], f);
                }
            }
        }
    }
    [[unroll]] for (uint k = 0u; k < WG_NV; ++k) wg_put(k, acc[k]);
    barrier();
    for (uint k = gl_LocalInvocationID.x; k < WG_NV; k += gl_WorkGroupSize.x) {   // value k of the tile
        uint r = k / (M + 1u), j = k % (M + 1u);
        if (t0 + r >= p.T) continue;
#if defined(FINAL)
        if (j < M)
            out_[p.o_off + (t0 + r) * p.o_st + j * p.o_s2] =
                wg_total(k) / sqrt(wg_total(r * (M + 1u) + M) * p.inv_k + p.norm_eps);
#else
        out_[p.o_off + (t0 + r) * p.o_st + split * p.o_s2 + j] = wg_total(k);
#endif
    }
}
#endif
#endif
