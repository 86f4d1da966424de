#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: MODE_GEMV ; - | VEC4 ; - | LANES_SHUFFLE | LANES_SUBGROUP_OPS | LANES_WORKGROUP ; TB=1,2,4,8 ; - | W_BF16 | W_F16 ; - | NORM_X
//! variants: MODE_GEMV ; VEC4 ; - | LANES_SHUFFLE | LANES_SUBGROUP_OPS | LANES_WORKGROUP ; TB=1,8 ; W_FP8 | W_FP4 ; - | NORM_X
//! variants: MODE_GEMV ; - | LANES_SHUFFLE | LANES_SUBGROUP_OPS | LANES_WORKGROUP ; TB=1 ; W_FP8 | W_FP4 ; NORM_X
//! variants: MODE_GEMV ; VEC4 ; - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; TB=1 ; W_FP8 | W_FP4 ; - | NORM_X ; X_SHARED
//! variants: MODE_GEMM_REGS ; - | VEC4 ; - | W_BF16 | W_F16 | W_FP8 | W_FP4
//! variants: MODE_GEMM_SHARED ; - | W_BF16 | W_F16 | W_FP8 | W_FP4
// MUL_MAT: d[b0, b1, t, n] = Σ_k x[b0, b1, t, k] · w[b0, b1, n, k]  (x @ wᵀ), f32 accumulation.
// x, w, d are strided 4-D views (broadcast batch dims have stride 0). Variants (-D):
//   MODE_GEMV         few tokens: one cluster of LANES lanes (lanes.glsl) per (batch, TB-token block,
//                     n); lane l takes k = l, l+LANES, ... for TB tokens at once (each w value is
//                     loaded once per block), then a cluster reduction. n varies fastest across
//                     clusters, so neighbouring clusters share the x rows. -D LANES_WORKGROUP: the
//                     cluster is the workgroup (few outputs: more lanes per output, fewer loads
//                     one after the other in each).
//   MODE_GEMM_REGS    many tokens, no shared memory (lavapipe, where barrier() is slow): one
//                     invocation per 4 tokens × 4 outputs tile, n-tiles fastest.
//   MODE_GEMM_SHARED  many tokens on GPUs: one 256-invocation workgroup per 64 × 64 tile; 16-deep
//                     k slices of x and w staged in shared memory (loaded along k, coalesced when k
//                     is contiguous); invocation (ty, tx) = (id / 16, id % 16) computes tokens
//                     ty + 16i and outputs tx + 16j, i, j < 4.
//   W_BF16 / W_F16    16-bit weights (weights.glsl), widened to f32 as they are read.
//   W_FP8 / W_FP4     DeepSeek's quantised weights (weights.glsl): w is the tensor of packed
//                     codes (32-bit words, q_kw a row), its scale bytes at the binding after
//                     the others (3, or 4 with NORM_X); dequantised
//                     in registers. The GEMV takes them with VEC4 (else a GEMM kernel runs,
//                     but for a folded norm at one token) and TB = 1 or 8 (a partial block of
//                     tokens is clamped like any other), and at one token (VEC4) NR output
//                     rows a cluster sharing each x load (spec constant 2; rows past N
//                     clamped, not stored).
//   X_SHARED          (GEMV, VEC4, TB = 1, W_FP8 / W_FP4) the staged GEMV: x in shared memory,
//                     16-byte code loads, persistent clusters (see its main below).
//   VEC4              (GEMV, GEMM_REGS) k contiguous and every row start 16-byte aligned: vec4 loads.
//   NORM_X            (GEMV) x rows RMS-normalised on the fly: d = (x / rms(x) ⊙ g) @ wᵀ with
//                     rms(x) = sqrt(mean_k x² + eps), g [K] at binding 3: each cluster sums x² beside
//                     its dot product (x is a few KB, read from cache), so RMS_NORM → MUL_MAT at
//                     decode is one dispatch, not two.
// LANES is specialization constant 15 (lanes.glsl); TB, the tokens of a GEMV block (1, 2, 4 or 8:
// the host rounds T up to a power of two), stays a define because it sizes the per-token arrays of
// the hot loop, which literal sizes keep in registers.
// GEMV's spec constant 1, UNROLL: vec4 steps a lane loads before adding them (TB = 1), so that
// that many weight loads per lane are in flight (decode reads each weight once: memory-level
// parallelism decides its speed).
// Rows past T or N in a partial tile are clamped to the last row for loading, never stored.
#if defined(MODE_GEMV)
#include "lanes.glsl"
#else
#include "common.glsl"
#endif
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 2) buffer D { float d[]; };
#if defined(VEC4)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#endif
layout(push_constant) uniform P {
    uint ne0, ne1, T, N, K;
    uint x_off, x_s0, x_s1, x_s2, x_s3;
    uint w_off, w_s0, w_s1, w_s2, w_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
#if defined(NORM_X)
    uint g_off;
    float eps;
#endif
#if defined(W_FP8) || defined(W_FP4)
    uint q_kw, q_rows, q_srows, q_sc;   // quantised weights' geometry (weights.glsl)
#endif
#if defined(X_SHARED)
    uint xs_groups;                     // workgroups per batch item (X_SHARED)
#endif
} p;
#define W_S3 p.w_s3
#if defined(NORM_X)
#define W_SCALE_BINDING 4
#else
#define W_SCALE_BINDING 3
#endif
#include "weights.glsl"
#if defined(NORM_X)
layout(binding = 3) readonly buffer G { float g[]; };
#if defined(VEC4)
layout(binding = 3) readonly buffer G4 { vec4 g4[]; };
#endif
#endif

uint x_row(uint b0, uint b1, uint t) { return p.x_off + b0 * p.x_s0 + b1 * p.x_s1 + min(t, p.T - 1) * p.x_s2; }
uint w_row(uint b0, uint b1, uint n) { return p.w_off + b0 * p.w_s0 + b1 * p.w_s1 + min(n, p.N - 1) * p.w_s2; }
void store(uint b0, uint b1, uint t, uint n, float v) {
    if (t < p.T && n < p.N) d[p.d_off + b0 * p.d_s0 + b1 * p.d_s1 + t * p.d_s2 + n * p.d_s3] = v;
}

#if defined(MODE_GEMV)
layout(constant_id = 1) const uint UNROLL = 1;
float acc[TB], ss[TB];      // ss: Σ x² of each token's row (NORM_X)
uint xb[TB];

#if defined(VEC4)
void add4(uint t, vec4 xv, vec4 wv, uint k) {
#if defined(NORM_X)
    ss[t] += dot(xv, xv);
    xv *= g4[p.g_off / 4 + k];
#endif
    acc[t] += dot(xv, wv);
}
#endif

void add1(uint t, float xv, float wv, uint k) {
#if defined(NORM_X)
    ss[t] += xv * xv;
    xv *= g[p.g_off + k];
#endif
    acc[t] += xv * wv;
}

#if (defined(W_FP8) || defined(W_FP4)) && defined(VEC4) && TB == 1
// Quantised weights at one token: NR (spec constant 2) output rows a cluster, every x load serving
// NR weight rows, so that x's loads from cache do not outnumber the weight bytes (FP8: 16 bytes of
// x a 4-byte word of codes; FP4: a half word) and the loads of NR rows are in flight together.
layout(constant_id = 2) const uint NR = 1;
// Spec constant 3, WIDE (1: needs K % 16 == 0 for FP8, K % 32 == 0 for FP4, rows 16-byte aligned):
// each lane loads 16 bytes of codes a step (16 FP8 or 32 FP4 weights; consecutive lanes consecutive
// uvec4s), with one scale byte (an FP8 block of 128 holds 8 such loads, an FP4 group of 32 is
// one), the row's scale grid row found once before the loop; 0: a 4-byte word a step (W4_ROW).
layout(constant_id = 3) const uint WIDE = 0;
#if defined(X_SHARED)
// -D X_SHARED (needs rows of whole uvec4s of codes, q_kw % 4 == 0): the x row is staged once per
// workgroup in shared memory (XS vec4s, spec constant 4, zeros past K; vec4 c of uvec4 j's inputs
// at xs[c·KU + j], so that consecutive lanes read consecutive vec4s), its Σx² reduced over the
// workgroup once (NORM_X: x·g is staged, the row sums are multiplied by 1/rms at the end), so the
// hot loop loads only codes: each lane a uvec4 (16 FP8 / 32 FP4 codes; consecutive lanes
// consecutive uvec4s) of each of NR rows, UNROLL steps apart by LANES, decodes a word in a few
// operations (q_fp8_word / q_fp4_word), multiplies the unscaled sum of a uvec4 by its one scale and
// reduces each row over the cluster once. A cluster of fewer lanes than a subgroup (the host's
// choice of LANES) walks more uvec4s of its rows a reduction, the subgroup's clusters reading the
// same staged x vec4s at each step (their rows are equally long). Clusters are persistent over row
// blocks (p.xs_groups workgroups per batch item, each cluster taking every p.xs_groups·clusters-th
// block of NR rows) and load the next step's codes and scale words before they compute the current
// one (the first before x is staged), so a row's end and its reduction do not stall the loads.
layout(constant_id = 4) const uint XS = 1;
// Spec constant 5, ONE_SCALE (1: FP8, where the host found that each block of NR rows lies in one
// 128-row block of the scale grid): the block's rows share their scale bytes, so each uvec4 step
// loads and decodes one scale word for all NR rows rather than one a row.
layout(constant_id = 5) const uint ONE_SCALE = 0;
shared vec4 xs[XS];
#if defined(NORM_X)
shared float xs_ss[256];                // Σx² of each subgroup (of each lane without subgroups; ≤ 256)
#endif
#include "x_stage.glsl"

void main() {
    uint GPB = p.xs_groups, g = flat_group();
    if (g >= p.ne0 * p.ne1 * GPB) return;               // whole workgroup leaves together
    uint gi = g % GPB, bi = g / GPB;
    uint b1 = bi % p.ne1, b0 = bi / p.ne1;
    uint lane = cluster_lane(), cl = lane_linear() / LANES, CPW = gl_WorkGroupSize.x / LANES;
    uint NB = (p.N + NR - 1) / NR, KU = p.q_kw / 4u, STEP = LANES * UNROLL;
    // the cluster's iteration: row block rb, uvec4s s0 + lane + u·LANES (u < UNROLL) of each row
    uint rb = gi * CPW + cl, s0 = 0;
    bool live = rb < NB;
    uint wb[NR], sb[NR];
    uvec4 cw[NR][UNROLL];
    uint cs[NR][UNROLL];
    [[unroll]] for (uint i = 0; i < NR; ++i) {
        wb[i] = w_row(b0, b1, rb * NR + i);
        sb[i] = q_scale_row(wb[i]);
    }
    if (live) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            uint j = lane + u * LANES;
            if (j < KU) {                               // (past the row: not loaded, not computed)
                [[unroll]] for (uint i = 0; i < NR; ++i) {
                    cw[i][u] = wq4[wb[i] / 4u + j];
                    if (i == 0u || ONE_SCALE == 0u) cs[i][u] = wscale[(sb[i] + j * Q_XV * 4u / Q_BC) >> 2];
                }
            }
        }
    }
    float s2 = stage_x(x_row(b0, b1, 0u), 0u, 1u, KU);
    float inv = 1.0;
#if defined(NORM_X)
    // one partial sum a subgroup (every invocation is here): clusters of fewer lanes than a subgroup
    // add theirs up first, so the sum below reads no more partial sums than a workgroup has subgroups
    s2 = cluster_sum(s2);
#if defined(LANES_CLUSTER)
#if defined(LANES_SHUFFLE)
    for (uint m = LANES; m < gl_SubgroupSize; m <<= 1) s2 += subgroupShuffleXor(s2, m);
#endif
    uint parts = gl_NumSubgroups;
    if (gl_SubgroupInvocationID == 0u) xs_ss[gl_SubgroupID] = s2;
#else
    uint parts = CPW;
    if (lane == 0u) xs_ss[cl] = s2;
#endif
#endif
    barrier();
#if defined(NORM_X)
    s2 = 0.0;
    for (uint c = 0; c < parts; ++c) s2 += xs_ss[c];
    inv = 1.0 / sqrt(s2 / float(p.K) + p.eps);
#endif
    float acc[NR];
    [[unroll]] for (uint i = 0; i < NR; ++i) acc[i] = 0.0;
    while (live) {                                      // uniform per cluster
        uint s1 = s0 + STEP, rb1 = rb;
        bool row_end = s1 >= KU;
        if (row_end) { s1 = 0; rb1 += GPB * CPW; }
        bool live1 = rb1 < NB;
        uint wb1[NR], sb1[NR];
        [[unroll]] for (uint i = 0; i < NR; ++i) { wb1[i] = wb[i]; sb1[i] = sb[i]; }
        if (row_end) {                                  // the next block's rows and scale grid rows
            [[unroll]] for (uint i = 0; i < NR; ++i) {
                wb1[i] = w_row(b0, b1, rb1 * NR + i);
                sb1[i] = q_scale_row(wb1[i]);
            }
        }
        uvec4 nw[NR][UNROLL];
        uint ns[NR][UNROLL];
        if (live1) {
            [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
                uint j = s1 + lane + u * LANES;
                if (j < KU) {
                    [[unroll]] for (uint i = 0; i < NR; ++i) {
                        nw[i][u] = wq4[wb1[i] / 4u + j];
                        if (i == 0u || ONE_SCALE == 0u)
                            ns[i][u] = wscale[(sb1[i] + j * Q_XV * 4u / Q_BC) >> 2];
                    }
                }
            }
        }
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            uint j = s0 + lane + u * LANES;
            if (j < KU) {
                vec4 xv[Q_XV];                          // read once for the NR rows
                [[unroll]] for (uint c = 0; c < Q_XV; ++c) xv[c] = xs[c * KU + j];
                float sc[NR];
                [[unroll]] for (uint i = 0; i < NR; ++i) {
                    if (i == 0u || ONE_SCALE == 0u) {
                        uint si = sb[i] + j * Q_XV * 4u / Q_BC;
                        sc[i] = q_e8m0((cs[i][u] >> ((si & 3u) << 3)) & 0xFFu) * Q_UNIT;
                    } else {
                        sc[i] = sc[0];
                    }
                    acc[i] += sc[i] * q_wide_dot_fast(cw[i][u], xv);
                }
            }
        }
        if (row_end) {
            [[unroll]] for (uint i = 0; i < NR; ++i) {
                float v = cluster_sum(acc[i]) * inv;
                if (lane == i % LANES) store(b0, b1, 0u, rb * NR + i, v);
                acc[i] = 0.0;
            }
        }
        s0 = s1;
        rb = rb1;
        live = live1;
        [[unroll]] for (uint i = 0; i < NR; ++i) {
            wb[i] = wb1[i];
            sb[i] = sb1[i];
            [[unroll]] for (uint u = 0; u < UNROLL; ++u) { cw[i][u] = nw[i][u]; cs[i][u] = ns[i][u]; }
        }
    }
}
#else
void main() {
    uint NB = (p.N + NR - 1) / NR;
    uint item = cluster_id();
    if (item >= p.ne0 * p.ne1 * p.T * NB) return;         // whole cluster leaves together
    uint lane = cluster_lane();
    uint n0 = (item % NB) * NR, r = item / NB;
    uint t = r % p.T; r /= p.T;
    uint b1 = r % p.ne1, b0 = r / p.ne1;
    uint xr = x_row(b0, b1, t), wb[NR];
    float a[NR], s2 = 0.0;
    [[unroll]] for (uint i = 0; i < NR; ++i) { wb[i] = w_row(b0, b1, n0 + i); a[i] = 0.0; }
    uint K4 = WIDE != 0u ? 0u : p.K / 4, k = lane;
    if (WIDE != 0u) {
        uint sb[NR];
        [[unroll]] for (uint i = 0; i < NR; ++i) sb[i] = q_scale_row(wb[i]);
        for (uint KU = p.q_kw / 4u; k < KU; k += LANES) {
            vec4 xv[Q_XV];
            [[unroll]] for (uint c = 0; c < Q_XV; ++c) {
                xv[c] = x4[xr / 4 + k * Q_XV + c];
#if defined(NORM_X)
                s2 += dot(xv[c], xv[c]);
                xv[c] *= g4[p.g_off / 4 + k * Q_XV + c];
#endif
            }
            [[unroll]] for (uint i = 0; i < NR; ++i)
                a[i] += q_scale_at(sb[i] + k * Q_XV * 4u / Q_BC) * q_wide_dot(wq4[wb[i] / 4u + k], xv);
        }
    }
    for (; k + (UNROLL - 1) * LANES < K4; k += UNROLL * LANES) {
        vec4 xv[UNROLL], wv[NR][UNROLL];
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            xv[u] = x4[xr / 4 + k + u * LANES];
            [[unroll]] for (uint i = 0; i < NR; ++i) wv[i][u] = W4_ROW(wb[i], k + u * LANES);
        }
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
#if defined(NORM_X)
            s2 += dot(xv[u], xv[u]);
            xv[u] *= g4[p.g_off / 4 + k + u * LANES];
#endif
            [[unroll]] for (uint i = 0; i < NR; ++i) a[i] += dot(xv[u], wv[i][u]);
        }
    }
    for (; k < K4; k += LANES) {
        vec4 xv = x4[xr / 4 + k];
#if defined(NORM_X)
        s2 += dot(xv, xv);
        xv *= g4[p.g_off / 4 + k];
#endif
        [[unroll]] for (uint i = 0; i < NR; ++i) a[i] += dot(xv, W4_ROW(wb[i], k));
    }
    float inv = 1.0;
#if defined(NORM_X)
    inv = 1.0 / sqrt(cluster_sum(s2) / float(p.K) + p.eps);
#endif
    [[unroll]] for (uint i = 0; i < NR; ++i) {
        float v = cluster_sum(a[i]) * inv;
        if (lane == i % LANES) store(b0, b1, t, n0 + i, v);
    }
}
#endif
#else
void main() {
    uint blocks = (p.T + TB - 1) / TB;
    uint item = cluster_id();
    if (item >= p.ne0 * p.ne1 * blocks * p.N) return;     // whole cluster leaves together
    uint lane = cluster_lane();
    uint n = item % p.N, r = item / p.N;
    uint t0 = (r % blocks) * TB; r /= blocks;
    uint b1 = r % p.ne1, b0 = r / p.ne1;
    uint wb = w_row(b0, b1, n);
    [[unroll]] for (uint t = 0; t < TB; ++t) { xb[t] = x_row(b0, b1, t0 + t); acc[t] = 0.0; ss[t] = 0.0; }
    uint k = lane;
#if defined(VEC4)
    uint K4 = p.K / 4;
    if (TB == 1) {
        for (; k + (UNROLL - 1) * LANES < K4; k += UNROLL * LANES) {
            vec4 wv[UNROLL], xv[UNROLL];
            [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
                wv[u] = W4_ROW(wb, k + u * LANES);
                xv[u] = x4[xb[0] / 4 + k + u * LANES];
            }
            [[unroll]] for (uint u = 0; u < UNROLL; ++u) add4(0, xv[u], wv[u], k + u * LANES);
        }
    }
    for (; k < K4; k += LANES) {
        vec4 wv = W4_ROW(wb, k);
        [[unroll]] for (uint t = 0; t < TB; ++t) add4(t, x4[xb[t] / 4 + k], wv, k);
    }
    k = K4 * 4 + lane;
#endif
    for (; k < p.K; k += LANES) {
        float wv = W1_ROW(wb, k);
        [[unroll]] for (uint t = 0; t < TB; ++t) add1(t, x[xb[t] + k * p.x_s3], wv, k);
    }
    [[unroll]] for (uint t = 0; t < TB; ++t) {
#if defined(NORM_X)
        vec2 r = cluster_sum2(vec2(acc[t], ss[t]));
        float s = r.x / sqrt(r.y / float(p.K) + p.eps);
#else
        float s = cluster_sum(acc[t]);
#endif
        if (lane == t % LANES) store(b0, b1, t0 + t, n, s);
    }
}
#endif

#elif defined(MODE_GEMM_REGS)
const uint TM = 4, TN = 4;
void main() {
    uint n_tiles = (p.N + TN - 1) / TN, t_tiles = (p.T + TM - 1) / TM;
    uint item = flat_index();
    if (item >= p.ne0 * p.ne1 * t_tiles * n_tiles) return;
    uint n0 = (item % n_tiles) * TN, r = item / n_tiles;
    uint t0 = (r % t_tiles) * TM; r /= t_tiles;
    uint b1 = r % p.ne1, b0 = r / p.ne1;
    uint xb[TM], wb[TN];
    float acc[TM][TN];
    [[unroll]] for (uint i = 0; i < TM; ++i) xb[i] = x_row(b0, b1, t0 + i);
    [[unroll]] for (uint j = 0; j < TN; ++j) wb[j] = w_row(b0, b1, n0 + j);
    [[unroll]] for (uint i = 0; i < TM; ++i) [[unroll]] for (uint j = 0; j < TN; ++j) acc[i][j] = 0.0;
    uint k = 0;
#if defined(VEC4)
    for (; k < p.K / 4; ++k) {
        vec4 xv[TM], wv[TN];
        [[unroll]] for (uint i = 0; i < TM; ++i) xv[i] = x4[xb[i] / 4 + k];
        [[unroll]] for (uint j = 0; j < TN; ++j) wv[j] = W4_ROW(wb[j], k);
        [[unroll]] for (uint i = 0; i < TM; ++i) [[unroll]] for (uint j = 0; j < TN; ++j) acc[i][j] += dot(xv[i], wv[j]);
    }
    k *= 4;
#endif
    for (; k < p.K; ++k) {
        float xv[TM], wv[TN];
        [[unroll]] for (uint i = 0; i < TM; ++i) xv[i] = x[xb[i] + k * p.x_s3];
        [[unroll]] for (uint j = 0; j < TN; ++j) wv[j] = W1_ROW(wb[j], k);
        [[unroll]] for (uint i = 0; i < TM; ++i) [[unroll]] for (uint j = 0; j < TN; ++j) acc[i][j] += xv[i] * wv[j];
    }
    [[unroll]] for (uint i = 0; i < TM; ++i) [[unroll]] for (uint j = 0; j < TN; ++j) store(b0, b1, t0 + i, n0 + j, acc[i][j]);
}

#elif defined(MODE_GEMM_SHARED)
const uint BM = 64, BN = 64, BK = 16, R = 4;        // needs a 256-invocation workgroup
shared float xs[BK][BM + 1];                          // +1: the k-major stores hit distinct banks
shared float ws[BK][BN + 1];
void main() {
    uint n_tiles = (p.N + BN - 1) / BN, t_tiles = (p.T + BM - 1) / BM;
    uint g = flat_group();                            // uniform per workgroup: no early return inside
    if (g >= p.ne0 * p.ne1 * t_tiles * n_tiles) return;
    uint n0 = (g % n_tiles) * BN, r = g / n_tiles;
    uint t0 = (r % t_tiles) * BM; r /= t_tiles;
    uint b1 = r % p.ne1, b0 = r / p.ne1;
    uint id = gl_LocalInvocationID.x, lk = id % BK, lr = id / BK;
    uint tx = id % 16, ty = id / 16;
    uint xb[R], wb[R];
    [[unroll]] for (uint i = 0; i < R; ++i) { xb[i] = x_row(b0, b1, t0 + lr + 16 * i); wb[i] = w_row(b0, b1, n0 + lr + 16 * i); }
    float acc[R][R];
    [[unroll]] for (uint i = 0; i < R; ++i) [[unroll]] for (uint j = 0; j < R; ++j) acc[i][j] = 0.0;
    for (uint k0 = 0; k0 < p.K; k0 += BK) {
        uint k = k0 + lk;
        bool in_k = k < p.K;
        [[unroll]] for (uint i = 0; i < R; ++i) {
            xs[lk][lr + 16 * i] = in_k ? x[xb[i] + k * p.x_s3] : 0.0;
            ws[lk][lr + 16 * i] = in_k ? W1_ROW(wb[i], k) : 0.0;
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < BK; ++kk) {
            float a[R], b[R];
            [[unroll]] for (uint i = 0; i < R; ++i) { a[i] = xs[kk][ty + 16 * i]; b[i] = ws[kk][tx + 16 * i]; }
            [[unroll]] for (uint i = 0; i < R; ++i) [[unroll]] for (uint j = 0; j < R; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    [[unroll]] for (uint i = 0; i < R; ++i) [[unroll]] for (uint j = 0; j < R; ++j) store(b0, b1, t0 + ty + 16 * i, n0 + tx + 16 * j, acc[i][j]);
}
#else
#error "define MODE_GEMV, MODE_GEMM_REGS or MODE_GEMM_SHARED"
#endif
