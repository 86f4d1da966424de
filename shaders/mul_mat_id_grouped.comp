#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: MODE_SWIGLU ; - | VEC4 ; - | W_BF16 | W_F16 | W_FP8 | W_FP4 | W_FP4 SHARED_FP8 ; - | NORM_X
//! variants: MODE_SUM ; - | VEC4 ; - | W_BF16 | W_F16 | W_FP8 | W_FP4 | W_FP4 SHARED_FP8
//! variants: MODE_SWIGLU ; VEC4 ; W_BF16 | W_FP4 SHARED_FP8 ; - | NORM_X ; LITERAL_ARRAYS
//! variants: MODE_SUM ; VEC4 ; W_BF16 | W_FP4 SHARED_FP8 ; LITERAL_ARRAYS
//! variants: MODE_SWIGLU ; VEC4 ; W_BF16 | W_FP4 SHARED_FP8 ; - | NORM_X ; - | LITERAL_ARRAYS ; PREFETCH
//! variants: MODE_SUM ; VEC4 ; W_BF16 | W_FP4 SHARED_FP8 ; - | LITERAL_ARRAYS ; PREFETCH
// MUL_MAT_ID's grouped kernel (prefill chunks, from mul_mat_id_grouped.min_tokens tokens): the experts' products as one GEMM per
// expert over the routes sorted to it (mul_mat_id_sort.comp), each expert's weights read once per
// tile of BT of its routes rather than once per route. Same products as mul_mat_id.comp:
//   MODE_SWIGLU  x [T, 1 or R, K], w [E, 2F, K]: out[t, r, f] = silu(min(g, limit)) · clamp(u, −limit,
//                limit), g = w[id, f]·x[t, r], u = w[id, F + f]·x[t, r]; NORM_X: x RMS-normalised as it
//                is read (x·g staged, the sums times 1/rms(x), rms(x) = sqrt(mean x² + eps), as the
//                per-route kernel does); a route not computed here: 0 (another part's expert) or NaN
//                (an invalid id), as there.
//   MODE_SUM     x [T, R, K], w [E, N, K]: y[t, r, n] = w[id, n]·x[t, r] for the routes computed here
//                (y at binding 4 laid out [T, R, N] by d_s0, d_s1, d_s2); mul_mat_id_combine.comp then
//                sums them per token in route order (no float atomics: deterministic).
// Weights as mul_mat_id.comp reads them (weights.glsl): f32, BF16, F16, FP8 128×128 blocks, FP4 32-
// groups, -D SHARED_FP8 the FP8 shared expert beside FP4 ones (bucket E; its own tensor), a split
// stack by id_base / n_ids (the sort leaves other parts' routes out).
// Grid: x = tiles of BN outputs, y = tile slots. The number of tiles lives on the device (the sort
// writes it), so the host launches the worst case, S / BT + min(B, S) tile slots for S = T·R slots
// in B buckets (each bucket adds at most one partial tile), and a workgroup past the tiles there
// are leaves at once (no indirect dispatch: one recording serves every routing, and the recorder
// knows no indirect dispatches). x varies fastest: the workgroups of a tile slot (one expert's
// routes) run one after another over its output tiles, its x rows staying in cache.
// Tile (spec constants): BT route slots × BN outputs (MODE_SWIGLU: BN gate and BN up rows), K in
// steps of BK (a multiple of 4). Per step the workgroup stages the BT gathered x rows (xs) and the
// weight rows (ws), decoded to f32, in shared memory, row-major with k contiguous (A = x, B = wᵀ in
// the layouts a cooperative-matrix load takes), rows of BK/4 vec4s padded by one vec4 (an odd
// stride: consecutive rows' vec4s fall in distinct banks); then each invocation adds its TM × TN
// outputs' products in f32, slots ty + m·(BT/TM) and outputs tx + j·(BN/TN) (consecutive
// invocations: consecutive rows, so coalesced stores and conflict-free vec4 loads of the tiles),
// four k at a time. The staging and the inner product are apart, so the inner product can become
// cooperative-matrix loads and multiply-adds over the same shared tiles. Workgroup: (BT/TM)·(BN/TN)
// invocations (spec constant 0, the host checks); WG % BK == 0 and BT·BK % WG == 0 (the host
// checks) so that an invocation stages the same x rows every step (NORM_X: its share of their Σx²).
// Push block: R, N (F for SWIGLU), K, E, id_base, n_ids; x_off, x_s0, x_s1; w_off, w_s0, w_s1;
// r_off, r_s0, r_s1; d_off, d_s0, d_s1, d_s2; s_off, TILE0, LIST0, EL (the sort's result and the
// bucket of routes not computed here); limit; NORM_X: g_off, eps; quantised: q_kw, q_rows, q_srows,
// q_sc; SHARED_FP8: s_rows.
// -D LITERAL_ARRAYS (VEC4, the model's bf16 and FP4 + FP8-shared experts): the per-invocation arrays
// (accumulators, the step's operands, the staging addresses) get literal sizes, at least the
// specialization constants their loops run to (TM ≤ 8, TN·WR ≤ 16, NX ≤ 16, NW ≤ 16: the host
// checks), instead of sizes from specialization constants, which a driver may keep in memory rather
// than registers (knob mul_mat_id_grouped.literal, off until the H200 has compared them).
// -D PREFETCH (VEC4, the same formats; with or without LITERAL_ARRAYS): register double-buffering.
// Each invocation issues the next step's global loads (its x elements, NORM_X their norm weights,
// and the raw words of its weight vec4s: w_raw4) into registers before the current step's products
// and stores them into shared memory after them, decoded only then (w_decode4), so the loads' latency
// overlaps the multiply-adds rather than waiting on other workgroups to hide it. The same values are
// stored in the same order (Σx² too), so the sums are the same bit for bit. Cost: NX more registers
// (NORM_X: 2·NX) and NW raw vec4s (two words each, float weights four) live across the products; the
// host takes it only where NX and NW are within LITERAL_ARRAYS' sizes (knob
// mul_mat_id_grouped.prefetch, off until the H200 has measured it). A partial last step loads its
// weights as it stages them.
// -D VEC4: weight rows staged as vec4s where a step is whole (K % 4 == 0; float weights: rows 16-byte
// aligned). Bindings: 0 x, 1 w, 2 route, 3 sort (i32), 4 out, 5 g (NORM_X), then the scale bytes, the shared
// expert's codes and scale bytes (weights.glsl).
#include "common.glsl"
#if defined(PREFETCH) && !defined(VEC4)
#error "-D PREFETCH loads vec4 weight rows a step ahead: it needs -D VEC4"
#endif
layout(constant_id = 1) const uint BT = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 32;
layout(constant_id = 4) const uint TM = 4;
layout(constant_id = 5) const uint TN = 4;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 2) readonly buffer R { float route[]; };
layout(binding = 3) readonly buffer SortB { int sr[]; };
layout(binding = 4) writeonly buffer D { float d[]; };
layout(push_constant) uniform P {
    uint R, N, K, E;
    uint id_base, n_ids;
    uint x_off, x_s0, x_s1;
    uint w_off, w_s0, w_s1;
    uint r_off, r_s0, r_s1;
    uint d_off, d_s0, d_s1, d_s2;
    uint s_off, TILE0, LIST0, EL;
    float limit;
#if defined(NORM_X)
    uint g_off;
    float eps;
#endif
#if defined(W_FP8) || defined(W_FP4)
    uint q_kw, q_rows, q_srows, q_sc;
#endif
#if defined(SHARED_FP8)
    uint s_rows;
#endif
} p;
#define W_S3 1u
#if defined(NORM_X)
layout(binding = 5) readonly buffer G { float g[]; };
#define W_SCALE_BINDING 6
#else
#define W_SCALE_BINDING 5
#endif
#define WS_BINDING (W_SCALE_BINDING + 1)
#define WS_SCALE_BINDING (W_SCALE_BINDING + 2)
#include "weights.glsl"

#define NAN uintBitsToFloat(0x7FC00000u)
#if defined(MODE_SWIGLU)
const uint WR = 2u;                     // gate and up rows
#else
const uint WR = 1u;
#endif
const uint KP = BK / 4u + 1u;           // vec4s of a padded tile row
const uint NX = (BT * BK + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;   // x elements an invocation stages
#if defined(LITERAL_ARRAYS)
#define TM_N 8
#define TNW_N 16
#define NX_N 16
#define NW_N 16
#else
#define TM_N TM
#define TNW_N (TN * WR)
#define NX_N NX
#define NW_N NW
#endif
shared vec4 xs[BT * KP];                // x of the tile's slot i at k0 + k: xs[i·KP + k/4][k%4]
shared vec4 ws[BN * WR * KP];           // weight row j (gate rows, then up rows) at k0 + k: ws[j·KP + k/4][k%4]
shared uint slots[BT];

// The tile's weight row j (gate rows 0..BN−1, up rows BN..2BN−1 for MODE_SWIGLU) of expert e, as
// its first element (words for quantised weights), clamped to a valid row past N.
uint w_row(uint e, bool sh, uint n0, uint j) {
    uint n = min(n0 + j % BN, p.N - 1u) + (j / BN) * p.N;
#if defined(SHARED_FP8)
    if (sh) return n * S_KW;
#endif
    return p.w_off + e * p.w_s0 + n * p.w_s1;
}

float w_at(uint wb, uint k, bool sh) {
#if defined(SHARED_FP8)
    if (sh) return S1_ROW(wb, k);
#endif
    return W1_ROW(wb, k);
}

#if defined(VEC4)
// The first scale byte of the row at wb's grid row (quantised weights; 0 otherwise): the divisions
// done once per row, not per load.
uint w_scale_row(uint wb, bool sh) {
#if defined(SHARED_FP8)
    if (sh) {
        uint row = wb / S_KW, m = row / p.s_rows;
        return (m * ((p.s_rows + 127u) / 128u) + (row - m * p.s_rows) / 128u) * ((p.K + 127u) / 128u);
    }
#endif
#if defined(W_QUANT)
    return q_scale_row(wb);
#else
    return 0u;
#endif
}

// Weights j·4 .. j·4 + 3 of the row at wb, sb its w_scale_row, in two parts: w_raw4 the loads (what
// the staging keeps in registers a step ahead with -D PREFETCH), w_decode4 the arithmetic on them.
// W_RAW4: float weights their vec4; 16-bit ones the uvec2 of four values; quantised ones the word of
// codes and the word of scale bytes.
#if defined(W_BF16) || defined(W_F16) || defined(W_QUANT)
#define W_RAW4 uvec2
#else
#define W_RAW4 vec4
#endif
W_RAW4 w_raw4(uint wb, uint sb, uint j, bool sh) {
#if defined(SHARED_FP8)
    if (sh) return uvec2(wsq[wb + j], wsscale[(sb + j / 32u) >> 2]);   // 128-input blocks
#endif
#if defined(W_FP8)
    return uvec2(wq[wb + j], wscale[(sb + 4u * j / Q_BC) >> 2]);
#elif defined(W_FP4)
    return uvec2(wq[wb + (j >> 1)], wscale[(sb + 4u * j / Q_BC) >> 2]);
#elif defined(W_BF16) || defined(W_F16)
    return w64[wb / 4u + j];
#else
    return W4_ROW(wb, j);
#endif
}
vec4 w_decode4(W_RAW4 r, uint sb, uint j, bool sh) {
#if defined(SHARED_FP8)
    if (sh) return q_fp8x4(r.x) * (q_e8m0_of(r.y, sb + j / 32u) * 256.0);
#endif
#if defined(W_FP8)
    return q_fp8x4(r.x) * (q_e8m0_of(r.y, sb + 4u * j / Q_BC) * Q_UNIT);
#elif defined(W_FP4)
    return q_fp4x4(r.x >> ((j & 1u) << 4)) * (q_e8m0_of(r.y, sb + 4u * j / Q_BC) * Q_UNIT);
#elif defined(W_BF16) || defined(W_F16)
    return w_half4(r);
#else
    return r;
#endif
}
vec4 w_at4(uint wb, uint sb, uint j, bool sh) { return w_decode4(w_raw4(wb, sb, j, sh), sb, j, sh); }
const uint NW = (BN * WR * BK / 4u + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;   // vec4s an invocation stages
#endif

// What the staging stores: x's element k of the row at xb[u] (NORM_X: times g's), the weights' vec4
// j for the row at wb[u]; -D PREFETCH: from registers loaded a step ahead (PREFETCH_STEP), the weights
// decoded only now, so that no decode waits for a load before the step's products.
#if defined(PREFETCH)
#define X_STAGED(u, k) xr[u]
#define G_STAGED(u, k) gr[u]
#define W_STAGED(u, j) w_decode4(wr[u], sb[u], j, sh)
#if defined(NORM_X)
#define PREFETCH_G(u, k) gr[u] = k < p.K ? g[p.g_off + k] : 0.0;
#else
#define PREFETCH_G(u, k)
#endif
// The loads of step kl (the same elements the staging stores: 0 past K), the weights' where the step
// is whole (the partial last step loads its weights as it stages them).
#define PREFETCH_STEP(kl) { \
        [[unroll]] for (uint u = 0; u < NX; ++u) { \
            uint k = (kl) + (li + u * WG) % BK; \
            xr[u] = k < p.K ? x[xb[u] + k] : 0.0; \
            PREFETCH_G(u, k) \
        } \
        if ((kl) + BK <= p.K) { \
            [[unroll]] for (uint u = 0; u < NW; ++u) \
                wr[u] = w_raw4(wb[u], sb[u], (kl) / 4u + (li + u * WG) % (BK / 4u), sh); \
        } \
    }
#else
#define X_STAGED(u, k) x[xb[u] + k]
#define G_STAGED(u, k) g[p.g_off + k]
#define W_STAGED(u, j) w_at4(wb[u], sb[u], j, sh)
#endif

uint x_row(uint s) {
    uint t = s / p.R;
    return p.x_off + t * p.x_s0 + (s - t * p.R) * p.x_s1;
}

uint d_at(uint s, uint n) {
    uint t = s / p.R;
    return p.d_off + t * p.d_s0 + (s - t * p.R) * p.d_s1 + n * p.d_s2;
}

void main() {
    uint li = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    uint tile = gl_WorkGroupID.y, n0 = gl_WorkGroupID.x * BN;
    if (tile >= uint(sr[p.s_off])) return;              // past the tiles the routing makes
    uint at = p.s_off + p.TILE0 + 3u * tile;
    uint bucket = uint(sr[at]), first = uint(sr[at + 1u]), rows = uint(sr[at + 2u]);
    for (uint i = li; i < BT; i += WG) slots[i] = uint(sr[p.s_off + p.LIST0 + first + min(i, rows - 1u)]);
    barrier();
    if (bucket == p.EL) {                               // routes not computed here
#if defined(MODE_SWIGLU)
        for (uint q = li; q < rows * BN; q += WG) {
            uint i = q / BN, n = n0 + q % BN, s = slots[i], t = s / p.R;
            if (n >= p.N) continue;
            float f = route[p.r_off + t * p.r_s0 + (s - t * p.R) * p.r_s1];
            bool valid = f >= 0.0 && f < float(p.n_ids) && f == floor(f);
            d[d_at(s, n)] = valid ? 0.0 : NAN;
        }
#endif
        return;
    }
    bool sh = false;
#if defined(SHARED_FP8)
    sh = bucket == p.E;
#endif
    uint TX = BN / TN, TY = BT / TM, tx = li % TX, ty = li / TX;
    float acc[TM_N][TNW_N];
    [[unroll]] for (uint m = 0; m < TM; ++m)
        [[unroll]] for (uint j = 0; j < TN * WR; ++j) acc[m][j] = 0.0;
    // Each invocation stages the same x rows and weight rows every step (its items q = li + u·WG):
    // their addresses (and the weights' scale rows) found once.
    float ss[NX_N];                                       // NORM_X: Σx² of the rows this invocation stages
    uint xb[NX_N];
    [[unroll]] for (uint u = 0; u < NX; ++u) {
        ss[u] = 0.0;
        xb[u] = x_row(slots[min((li + u * WG) / BK, BT - 1u)]);
    }
#if defined(VEC4)
    uint wb[NW_N], sb[NW_N];
    [[unroll]] for (uint u = 0; u < NW; ++u) {
        wb[u] = w_row(bucket, sh, n0, min((li + u * WG) / (BK / 4u), BN * WR - 1u));
        sb[u] = w_scale_row(wb[u], sh);
    }
#endif
#if defined(PREFETCH)
    float xr[NX_N];                                     // the step's x elements, loaded a step ahead
#if defined(NORM_X)
    float gr[NX_N];                                     // and the norm weights they take
#endif
    W_RAW4 wr[NW_N];                                    // the step's weights, undecoded (whole steps)
    PREFETCH_STEP(0u)
#endif
    for (uint k0 = 0; k0 < p.K; k0 += BK) {
        // stage x: the tile's BT gathered rows (slots past `rows` repeat the last one: read, never stored)
        [[unroll]] for (uint u = 0; u < NX; ++u) {
            uint q = li + u * WG, i = q / BK, kk = q - i * BK, k = k0 + kk;
            if (q < BT * BK) {
                float v = 0.0;
                if (k < p.K) {
                    v = X_STAGED(u, k);
#if defined(NORM_X)
                    ss[u] += v * v;
                    v *= G_STAGED(u, k);
#endif
                }
                xs[i * KP + kk / 4u][kk % 4u] = v;
            }
        }
        // stage w: BN·WR rows × BK, decoded to f32 (zeros past K)
#if defined(VEC4)
        if (k0 + BK <= p.K) {
            [[unroll]] for (uint u = 0; u < NW; ++u) {
                uint q = li + u * WG, j = q / (BK / 4u), c = q - j * (BK / 4u);
                if (q < BN * WR * BK / 4u) {
                    ws[j * KP + c] = W_STAGED(u, k0 / 4u + c);
                }
            }
        } else
#endif
        for (uint q = li; q < BN * WR * BK; q += WG) {
            uint j = q / BK, kk = q - j * BK, k = k0 + kk;
            ws[j * KP + kk / 4u][kk % 4u] = k < p.K ? w_at(w_row(bucket, sh, n0, j), k, sh) : 0.0;
        }
        barrier();
#if defined(PREFETCH)
        if (k0 + BK < p.K) PREFETCH_STEP(k0 + BK)       // the next step's loads, in flight during the products
#endif
        // the inner product over the staged step
        for (uint c = 0; c < BK / 4u; ++c) {
            vec4 a[TM_N], b[TNW_N];
            [[unroll]] for (uint m = 0; m < TM; ++m) a[m] = xs[(ty + m * TY) * KP + c];
            [[unroll]] for (uint j = 0; j < TN * WR; ++j)             // TN outputs' gate rows, then up rows
                b[j] = ws[(tx + (j % TN) * TX + (j / TN) * BN) * KP + c];
            [[unroll]] for (uint m = 0; m < TM; ++m)
                [[unroll]] for (uint j = 0; j < TN * WR; ++j)
                    acc[m][j] = fma(a[m].w, b[j].w, fma(a[m].z, b[j].z, fma(a[m].y, b[j].y, fma(a[m].x, b[j].x, acc[m][j]))));
        }
        barrier();
    }
    float inv[TM_N];
    [[unroll]] for (uint m = 0; m < TM; ++m) inv[m] = 1.0;
#if defined(NORM_X)
    // Σx² per row in a fixed order: the BK partial sums of row i sit at floats u·WG + (i % (WG/BK))·BK + c
    // of xs (its BT·(BK + 4) floats hold them)
    [[unroll]] for (uint u = 0; u < NX; ++u) {
        uint q = li + u * WG;
        if (q < BT * BK) xs[q / 4u][q % 4u] = ss[u];
    }
    barrier();
    [[unroll]] for (uint m = 0; m < TM; ++m) {
        uint i = ty + m * TY, rpw = WG / BK, base = (i / rpw) * WG + (i % rpw) * BK;
        float s2 = 0.0;
        for (uint c = 0; c < BK; ++c) s2 += xs[(base + c) / 4u][(base + c) % 4u];
        inv[m] = 1.0 / sqrt(s2 / float(p.K) + p.eps);
    }
#endif
    [[unroll]] for (uint m = 0; m < TM; ++m) {
        uint i = ty + m * TY;
        if (i >= rows) continue;
        uint s = slots[i];
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            uint n = n0 + tx + j * TX;
            if (n >= p.N) continue;
#if defined(MODE_SWIGLU)
            float gate = min(acc[m][j] * inv[m], p.limit), up = clamp(acc[m][TN + j] * inv[m], -p.limit, p.limit);
            d[d_at(s, n)] = gate / (1.0 + exp(-gate)) * up;
#else
            d[d_at(s, n)] = acc[m][j];
#endif
        }
    }
}
