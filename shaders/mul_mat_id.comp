#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; MODE_SWIGLU ; - | VEC4 ; - | W_BF16 | W_F16 ; - | NORM_X
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS | LANES_WORKGROUP ; MODE_SUM ROUTES=1,2,4,8 ; - | VEC4 ; - | HAS_ADD ; - | W_BF16 | W_F16
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; MODE_SWIGLU ; - | VEC4 ; W_FP8 | W_FP4 ; - | NORM_X
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS | LANES_WORKGROUP ; MODE_SUM ROUTES=1 ; - | VEC4 ; - | HAS_ADD ; W_FP8 | W_FP4
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; MODE_SWIGLU ; - | VEC4 ; W_FP4 SHARED_FP8 ; - | NORM_X
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS | LANES_WORKGROUP ; MODE_SUM ROUTES=1 ; - | VEC4 ; - | HAS_ADD ; W_FP4 SHARED_FP8
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; MODE_SWIGLU ; VEC4 ; W_FP8 | W_FP4 | W_FP4 SHARED_FP8 ; - | NORM_X ; X_SHARED
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; MODE_SUM ROUTES=1 ; VEC4 ; - | HAS_ADD ; W_FP8 | W_FP4 | W_FP4 SHARED_FP8 ; X_SHARED ; - | ROUTE_GROUPS
// MUL_MAT_ID: matrix products with the experts the router chose, route[t, r] = (id, weight)
// (MOE_ROUTE's output; ids are exact floats), weights w [E, N, K] stacked per expert:
//   MODE_SWIGLU  x [T, 1 or R, K] (stride 0 over r: the same token row for every route), w [E, 2F, K]:
//                out[t, r, f] = silu(w[id, f]·x[t, r]) · (w[id, F + f]·x[t, r])     gate/up + SwiGLU
//                with the clamp of DeepSeek-V4's SwiGLU: silu(min(gate, limit)) · clamp(up, −limit,
//                limit) (push constant; +inf: no clamp)
//   MODE_SUM     x [T, R, K], w [E, N, K]:
//                out[t, n] = Σ_r weight[t, r] · (w[id_r, n]·x[t, r])  (+ add[t, n] with HAS_ADD)
// Only the chosen experts' rows are read. An id outside [0, n_ids) writes NaN: no out-of-bounds
// read. Experts split over several tensors (a stack past maxStorageBufferRange): w holds experts
// id_base .. id_base + E − 1 (push), a route to another part's expert adds 0 (SwiGLU writes 0).
// Layout: one cluster of LANES lanes per output element (lanes.glsl), lane l takes k = l, l+LANES,
// ...; the output column (f or n) varies fastest across clusters, so neighbouring clusters read
// neighbouring weight rows of the same expert. W_BF16 / W_F16: 16-bit weights (weights.glsl). VEC4: K % 4 == 0 and every row 16-byte aligned.
// W_FP8 / W_FP4: DeepSeek's quantised experts (weights.glsl), w the packed codes [E, N, q_kw
// words], their scale bytes at binding W_SCALE_BINDING (the last one), one grid per expert;
// MODE_SUM with them loads one route at a time (ROUTES = 1). -D SHARED_FP8 (with W_FP4): the last
// expert id (n_ids − 1, the shared expert) is a separate FP8 tensor [2F or D rows, s_kw words] with
// its scales at the two bindings after W's scale (DeepSeek's layout: FP4 routed experts, an FP8
// shared one, in one dispatch).
// NORM_X (MODE_SWIGLU): x rows RMS-normalised as they are read, x / rms(x) ⊙ g with g [K] at
// binding 4 and rms(x) = sqrt(mean_k x² + eps): the FFN norm and the experts in one dispatch.
// UNROLL (spec constant 1): vec4 steps a lane loads before it adds them, so that that many loads
// per row are in flight (a decode step reads each weight once: memory-level parallelism decides
// its speed); MODE_SWIGLU reads its gate and up rows in the same loop for the same reason.
// ROUTES (-D, MODE_SUM): routes whose rows a lane loads in the same steps. One route at a time, an
// output's cluster walks R·K / (4·LANES·UNROLL) dependent memory latencies, and at decode every
// cluster of the dispatch is resident at once, so that chain is the dispatch's time. A literal, not
// a specialization constant: with [spec][spec]-sized arrays the sum was slower in the model on the
// H200 (as if they were kept in memory rather than registers).
// MODE_SUM's spec constant 2, ROWS (ROUTES = 1): output rows a cluster, each x load serving them
// all (quantised experts: x is read from cache 4 (FP8) or 8 (FP4) times their bytes at one row).
// -D LANES_WORKGROUP (MODE_SUM): the cluster is the workgroup, one output each: every lane's chain
// of loads is short and the outputs' workgroups come in waves.
// -D X_SHARED (quantised experts): the staged kernels, x in shared memory and 16-byte code loads
// (spec constants 4..10, -D ROUTE_GROUPS: the sum's route groups; described where they are defined below).
#include "lanes.glsl"
layout(constant_id = 1) const uint UNROLL = 1;
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 2) readonly buffer R { float route[]; };
#if defined(HAS_ADD)
layout(binding = 3) readonly buffer A { float addend[]; };
layout(binding = 4) writeonly buffer D { float d[]; };
#else
layout(binding = 3) writeonly buffer D { float d[]; };
#endif
#if defined(VEC4)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#endif
layout(push_constant) uniform P {
    uint T, R, N, K, E;                 // N: output columns (F for MODE_SWIGLU)
    uint id_base, n_ids;                // w holds experts id_base .. id_base + E − 1 of n_ids
    uint x_off, x_s0, x_s1;
    uint w_off, w_s0, w_s1;
    uint r_off, r_s0, r_s1, r_s2;
    uint d_off, d_s0, d_s1, d_s2;       // MODE_SUM: d[t, n] at d_off + t·d_s0 + n·d_s1
    uint a_off, a_s0, a_s1;
    float limit;                        // MODE_SWIGLU's clamp (+inf: none)
#if defined(NORM_X)
    uint g_off;
    float eps;
#endif
#if defined(W_FP8) || defined(W_FP4)
    uint q_kw, q_rows, q_srows, q_sc;   // quantised weights' geometry (weights.glsl)
#endif
#if defined(SHARED_FP8)
    uint s_rows;                        // the shared expert's rows per scale grid (weights.glsl)
#endif
#if defined(ROUTE_GROUPS)
    uint part_off, cnt_off;             // the route groups' partial sums and last-group counters
#endif
} p;
#define W_S3 1u
#if defined(HAS_ADD) || defined(NORM_X)
#define W_SCALE_BINDING 5
#else
#define W_SCALE_BINDING 4
#endif
#define WS_BINDING (W_SCALE_BINDING + 1)
#define WS_SCALE_BINDING (W_SCALE_BINDING + 2)
#include "weights.glsl"
#if defined(NORM_X)
layout(binding = 4) readonly buffer G { float g[]; };
#if defined(VEC4)
layout(binding = 4) readonly buffer G4 { vec4 g4[]; };
#endif
#endif

#define NAN uintBitsToFloat(0x7FC00000u)

// This lane's share of the dot products of x row xb with w rows wb[0..ROWS) (k contiguous).
#if defined(MODE_SWIGLU)
const uint ROWS = 2;                                    // gate and up
#else
layout(constant_id = 2) const uint ROWS = 1;            // MODE_SUM's output rows a cluster (ROUTES = 1)
#endif
float ss = 0.0;              // Σ x² of this lane's share of the x row (NORM_X)

#if defined(VEC4)
vec4 x_at4(uint xb, uint k) {
    vec4 v = x4[xb / 4 + k];
#if defined(NORM_X)
    ss += dot(v, v);
    v *= g4[p.g_off / 4 + k];
#endif
    return v;
}
#endif

float x_at(uint xb, uint k) {
    float v = x[xb + k];
#if defined(NORM_X)
    ss += v * v;
    v *= g[p.g_off + k];
#endif
    return v;
}

// sh: the rows are the shared expert's (SHARED_FP8; each call site passes a constant after
// inlining, so each copy reads one format)
#if defined(SHARED_FP8)
#define RD4(wb, j) (sh ? S4_ROW(wb, j) : W4_ROW(wb, j))
#define RD1(wb, k) (sh ? S1_ROW(wb, k) : W1_ROW(wb, k))
#else
#define RD4(wb, j) W4_ROW(wb, j)
#define RD1(wb, k) W1_ROW(wb, k)
#endif
#if defined(W_QUANT) && defined(VEC4)
// Spec constant 3, WIDE (quantised experts, VEC4, K % 16 == 0 for FP8, K % 32 == 0 for FP4; not
// the SHARED_FP8 expert): a lane loads 16 bytes of codes a step with one scale byte (weights.glsl);
// 0: a 4-byte word a step with its scale looked up (W4_ROW).
layout(constant_id = 3) const uint WIDE = 0;
#endif
void partial_dots(uint xb, uint wb[ROWS], uint lane, out float acc[ROWS], bool sh) {
    [[unroll]] for (uint j = 0; j < ROWS; ++j) acc[j] = 0.0;
    uint k = lane;
#if defined(W_QUANT) && defined(VEC4)
    if (WIDE != 0u && !sh) {
        uint sb[ROWS];
        [[unroll]] for (uint j = 0; j < ROWS; ++j) sb[j] = q_scale_row(wb[j]);
        for (uint KU = p.q_kw / 4u; k < KU; k += LANES) {
            vec4 xv[Q_XV];
            [[unroll]] for (uint c = 0; c < Q_XV; ++c) xv[c] = x_at4(xb, k * Q_XV + c);
            [[unroll]] for (uint j = 0; j < ROWS; ++j)
                acc[j] += q_scale_at(sb[j] + k * Q_XV * 4u / Q_BC) * q_wide_dot(wq4[wb[j] / 4u + k], xv);
        }
        return;
    }
#endif
#if defined(VEC4)
    uint K4 = p.K / 4;
    for (; k + (UNROLL - 1) * LANES < K4; k += UNROLL * LANES) {
        vec4 xv[UNROLL], wv[ROWS][UNROLL];
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            xv[u] = x_at4(xb, k + u * LANES);
            [[unroll]] for (uint j = 0; j < ROWS; ++j) wv[j][u] = RD4(wb[j], k + u * LANES);
        }
        [[unroll]] for (uint u = 0; u < UNROLL; ++u)
            [[unroll]] for (uint j = 0; j < ROWS; ++j) acc[j] += dot(xv[u], wv[j][u]);
    }
    for (; k < K4; k += LANES) {
        vec4 xv = x_at4(xb, k);
        [[unroll]] for (uint j = 0; j < ROWS; ++j) acc[j] += dot(xv, RD4(wb[j], k));
    }
    k = K4 * 4 + lane;
#endif
    for (; k < p.K; k += LANES) {
        float xv = x_at(xb, k);
        [[unroll]] for (uint j = 0; j < ROWS; ++j) acc[j] += xv * RD1(wb[j], k);
    }
}

#if defined(MODE_SUM) && ROUTES > 1
// This lane's share of ROUTES dot products, x row xb[i] with w row wb[i] (k contiguous), their
// loads issued together; per route the same steps and sums as partial_dots.
void route_dots(uint xb[ROUTES], uint wb[ROUTES], uint lane, out float acc[ROUTES]) {
    [[unroll]] for (uint i = 0; i < ROUTES; ++i) acc[i] = 0.0;
    uint k = lane;
#if defined(VEC4)
    uint K4 = p.K / 4;
    for (; k + (UNROLL - 1) * LANES < K4; k += UNROLL * LANES) {
        vec4 xv[ROUTES][UNROLL], wv[ROUTES][UNROLL];
        [[unroll]] for (uint u = 0; u < UNROLL; ++u)
            [[unroll]] for (uint i = 0; i < ROUTES; ++i) {
                xv[i][u] = x4[xb[i] / 4 + k + u * LANES];
                wv[i][u] = W4_ROW(wb[i], k + u * LANES);
            }
        [[unroll]] for (uint u = 0; u < UNROLL; ++u)
            [[unroll]] for (uint i = 0; i < ROUTES; ++i) acc[i] += dot(xv[i][u], wv[i][u]);
    }
    for (; k < K4; k += LANES)
        [[unroll]] for (uint i = 0; i < ROUTES; ++i) acc[i] += dot(x4[xb[i] / 4 + k], W4_ROW(wb[i], k));
    k = K4 * 4 + lane;
#endif
    for (; k < p.K; k += LANES)
        [[unroll]] for (uint i = 0; i < ROUTES; ++i) acc[i] += x[xb[i] + k] * W1_ROW(wb[i], k);
}
#endif

// Expert of route (t, r) in w: its index there, −2 when the id is valid but another part of the
// experts holds it (the route adds nothing here), −1 when it is not a valid id.
int expert(uint t, uint r) {
    float f = route[p.r_off + t * p.r_s0 + r * p.r_s1];
    if (!(f >= 0.0 && f < float(p.n_ids) && f == floor(f))) return -1;
    uint id = uint(f);
#if defined(SHARED_FP8)
    if (id == p.n_ids - 1u) return int(p.E);            // the shared expert, in its own tensor
#endif
    return (id >= p.id_base && id - p.id_base < p.E) ? int(id - p.id_base) : -2;
}

#if defined(X_SHARED)
// -D X_SHARED (quantised experts, VEC4, rows of whole uvec4s of codes; with SHARED_FP8, K % 32 == 0): x rows staged
// in shared memory as mul_mat.comp's X_SHARED GEMV stages them (XS vec4s a row, spec constant 5;
// vec4 c of uvec4 j's inputs at c·KU + j; NORM_X: x·g, the sums multiplied by 1/rms at the end),
// the hot loop loading only codes: a uvec4 of each of WR rows a lane, UNROLL steps apart by LANES,
// the next step's codes and scale words loaded before the current one is computed.
//   MODE_SWIGLU: a cluster computes XNR (spec constant 4) outputs f, their gate and up rows, of one
//     route; clusters are persistent over (route, f-block)s of a token (at most XGROUPS, spec
//     constant 7, workgroups per token, or per (token, route) when x differs per route); x staged once.
//     The (route, f-block)s are taken route-major; XHEAVY (spec constant 9, 1): the last route's first
//     (where DeepSeek-V4's router puts the shared expert, whose FP8 rows are twice an FP4 row's
//     bytes), then the others in order. Each output is computed as without it.
//   MODE_SUM: a cluster computes XNR outputs n over every route (lanes keep weight · scale · dot
//     and reduce once at the end); a workgroup's clusters take consecutive blocks of n; XRG (spec
//     constant 6) routes' x rows are staged at a time (the device's shared memory permitting).
//     XSPLIT (spec constant 8; needs XRG ≥ R, every route's x staged at once): XSPLIT clusters of a
//     workgroup share an output block, cluster c taking routes c % XSPLIT, + XSPLIT, ..., their sums
//     added in shared memory at the end: XSPLIT times the workgroups (at decode N / XNR / clusters
//     workgroups leave most SMs idle) and a chain of loads XSPLIT times shorter.
//     -D ROUTE_GROUPS: the routes in XRGROUPS (spec constant 10) groups of RPG = ceil(R / XRGROUPS)
//     consecutive routes, a workgroup per (token, output block, group) (the group fastest), each
//     staging only its group's x rows; it stores its sums to the partials (binding PART_BINDING,
//     [T, XRGROUPS, N] from p.part_off) and the last of an output block's workgroups (last_group.glsl,
//     counters at binding PART_BINDING + 1 from p.cnt_off, one per (token, output block)) adds the
//     groups' partials in group order (whichever finishes last), then add[t, n], and stores.
layout(constant_id = 4) const uint XNR = 1;
layout(constant_id = 5) const uint XS = 1;
layout(constant_id = 6) const uint XRG = 1;
layout(constant_id = 7) const uint XGROUPS = 1;     // MODE_SWIGLU: workgroups per item at most
#if defined(MODE_SWIGLU)
const uint WR = 2u * XNR;               // gate rows, then up rows
#else
const uint WR = XNR;
#endif
shared vec4 xs[XS * XRG];
#if defined(NORM_X)
shared float xs_ss[256];                // Σx² of each cluster (at most 256 a workgroup)
#endif
#include "x_stage.glsl"

// The scale byte of uvec4 j of a row: the row's first + j / QD (FP8: 8 uvec4s a 128-block; FP4: 1)
const uint QD = Q_BC / (Q_XV * 4u);
#if defined(SHARED_FP8)
// The shared FP8 expert beside FP4 ones (SH: the block's rows are its own, at WS_BINDING): rows of
// SKU = S_KW / 4 uvec4s (the host checks K % 32 == 0), scale grid per p.s_rows rows; its x vec4s
// are read from the FP4 staging (vec4 i at (i % Q_XV)·KU + i / Q_XV).
layout(binding = WS_BINDING) readonly buffer WShared4 { uvec4 wsq4[]; };
#define IS_SH(ID) ((ID) == int(p.E))
uint s_scale_row(uint wb) {
    uint row = wb / S_KW, m = row / p.s_rows;
    return (m * ((p.s_rows + 127u) / 128u) + (row - m * p.s_rows) / 128u) * ((p.K + 127u) / 128u);
}
float xs_dot_fp8(uvec4 v, uint xg, uint j, uint KU) {
    float s = 0.0;
    [[unroll]] for (uint c = 0; c < 4u; ++c) {
        uint i = 4u * j + c;
        s += dot(xs[xg * XS + (i % Q_XV) * KU + i / Q_XV], q_fp8_word(v[c]));
    }
    return s;
}
#define SH_KW S_KW
#define SH_SCALE_ROW(wb) s_scale_row(wb)
#else
#define IS_SH(ID) false
#define SH_KW 0u
#define SH_SCALE_ROW(wb) 0u
#endif

// Loads into W, S the uvec4s S0 + lane + u·LANES of rows WB and their scale words (those past the
// row are neither loaded nor computed).
#define XS_LOAD_FROM(W, S, WB, SB, S0, CODES, SCALES, KU_, QD_) \
    [[unroll]] for (uint u = 0; u < UNROLL; ++u) { \
        uint j_ = (S0) + lane + u * LANES; \
        if (j_ < (KU_)) { \
            [[unroll]] for (uint i = 0; i < WR; ++i) { \
                W[i][u] = CODES[WB[i] / 4u + j_]; \
                S[i][u] = SCALES[(SB[i] + j_ / (QD_)) >> 2]; \
            } \
        } \
    }
#if defined(SHARED_FP8)
#define XS_LOAD(W, S, WB, SB, S0, SH) \
    if (SH) { XS_LOAD_FROM(W, S, WB, SB, S0, wsq4, wsscale, SKU, 8u) } \
    else { XS_LOAD_FROM(W, S, WB, SB, S0, wq4, wscale, KU, QD) }
#else
#define XS_LOAD(W, S, WB, SB, S0, SH) XS_LOAD_FROM(W, S, WB, SB, S0, wq4, wscale, KU, QD)
#endif
// acc[i] += WT · scale · Σ x · code over the loaded uvec4s, x from staged row XG.
#define XS_COMPUTE_MAIN(W, S, SB, S0, XG, WT) \
    [[unroll]] for (uint u = 0; u < UNROLL; ++u) { \
        uint j_ = (S0) + lane + u * LANES; \
        if (j_ < KU) { \
            vec4 xv[Q_XV]; \
            [[unroll]] for (uint c = 0; c < Q_XV; ++c) xv[c] = xs[(XG) * XS + c * KU + j_]; \
            [[unroll]] for (uint i = 0; i < WR; ++i) { \
                uint si_ = SB[i] + j_ / QD; \
                acc[i] += (WT) * (q_e8m0((S[i][u] >> ((si_ & 3u) << 3)) & 0xFFu) * Q_UNIT) * q_wide_dot_fast(W[i][u], xv); \
            } \
        } \
    }
#if defined(SHARED_FP8)
#define XS_COMPUTE(W, S, SB, S0, XG, WT, SH) \
    if (SH) { \
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) { \
            uint j_ = (S0) + lane + u * LANES; \
            if (j_ < SKU) { \
                [[unroll]] for (uint i = 0; i < WR; ++i) { \
                    uint si_ = SB[i] + j_ / 8u; \
                    acc[i] += (WT) * (q_e8m0((S[i][u] >> ((si_ & 3u) << 3)) & 0xFFu) * 256.0) * \
                              xs_dot_fp8(W[i][u], XG, j_, KU); \
                } \
            } \
        } \
    } else { XS_COMPUTE_MAIN(W, S, SB, S0, XG, WT) }
#else
#define XS_COMPUTE(W, S, SB, S0, XG, WT, SH) XS_COMPUTE_MAIN(W, S, SB, S0, XG, WT)
#endif
#define XS_SHIFT() \
    [[unroll]] for (uint i = 0; i < WR; ++i) { \
        wb[i] = wb1[i]; \
        sb[i] = sb1[i]; \
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) { cw[i][u] = nw[i][u]; cs[i][u] = ns[i][u]; } \
    }

#if defined(MODE_SWIGLU)
layout(constant_id = 9) const uint XHEAVY = 0;
// Block B of this item's (route, f-block)s: its route R_, first output F_, expert ID_ (expert()), rows.
#define SW_BLOCK(B, R_, F_, ID_, WB, SB) { \
    uint b_ = min(B, NB - 1u); \
    R_ = rbase + (XHEAVY != 0u ? (b_ / NBF + RI - 1u) % RI : b_ / NBF); \
    F_ = (b_ % NBF) * XNR; \
    ID_ = expert(t, R_); \
    bool sh_ = IS_SH(ID_); \
    uint e_ = sh_ ? 0u : p.w_off + uint(max(ID_, 0)) * p.w_s0, rs_ = sh_ ? SH_KW : p.w_s1; \
    [[unroll]] for (uint i = 0; i < XNR; ++i) { \
        uint f_ = min(F_ + i, p.N - 1u); \
        WB[i] = e_ + f_ * rs_; \
        WB[XNR + i] = e_ + (p.N + f_) * rs_; \
    } \
    [[unroll]] for (uint i = 0; i < WR; ++i) SB[i] = sh_ ? SH_SCALE_ROW(WB[i]) : q_scale_row(WB[i]); }

void main() {
    uint RI = p.x_s1 == 0u ? p.R : 1u;                  // routes of one staged x row
    uint lane = cluster_lane(), cl = lane_linear() / LANES, CPW = gl_WorkGroupSize.x / LANES;
    uint NBF = (p.N + XNR - 1u) / XNR, NB = RI * NBF, KU = p.q_kw / 4u, SKU = SH_KW / 4u, STEP = LANES * UNROLL;
    uint GPB = min(XGROUPS, (NB + CPW - 1u) / CPW), g = flat_group();
    if (g >= p.T * (p.R / RI) * GPB) return;            // whole workgroup leaves together
    uint gi = g % GPB, item = g / GPB;
    uint t = item / (p.R / RI), rbase = (item % (p.R / RI)) * RI;
    uint b = gi * CPW + cl, s0 = 0, r, f0;
    bool live = b < NB;
    int id;
    uint wb[WR], sb[WR];
    uvec4 cw[WR][UNROLL];
    uint cs[WR][UNROLL];
    SW_BLOCK(b, r, f0, id, wb, sb)
    if (live && id >= 0) { XS_LOAD(cw, cs, wb, sb, 0u, IS_SH(id)) }
    float s2 = stage_x(p.x_off + t * p.x_s0 + rbase * p.x_s1, 0u, 1u, KU);
    float inv = 1.0;
#if defined(NORM_X)
    s2 = cluster_sum(s2);
    if (lane == 0u) xs_ss[cl] = s2;
#endif
    barrier();
#if defined(NORM_X)
    s2 = 0.0;
    for (uint c = 0; c < CPW; ++c) s2 += xs_ss[c];
    inv = 1.0 / sqrt(s2 / float(p.K) + p.eps);
#endif
    float acc[WR];
    [[unroll]] for (uint i = 0; i < WR; ++i) acc[i] = 0.0;
    while (live) {                                      // uniform per cluster
        uint s1 = s0 + STEP, b1 = b, r1 = r, f1 = f0;
        bool row_end = s1 >= (IS_SH(id) ? SKU : KU);
        if (row_end) { s1 = 0; b1 += GPB * CPW; }
        bool live1 = b1 < NB;
        int id1 = id;
        uint wb1[WR], sb1[WR];
        [[unroll]] for (uint i = 0; i < WR; ++i) { wb1[i] = wb[i]; sb1[i] = sb[i]; }
        if (row_end) SW_BLOCK(b1, r1, f1, id1, wb1, sb1)
        uvec4 nw[WR][UNROLL];
        uint ns[WR][UNROLL];
        if (live1 && id1 >= 0) { XS_LOAD(nw, ns, wb1, sb1, s1, IS_SH(id1)) }
        if (id >= 0) { XS_COMPUTE(cw, cs, sb, s0, 0u, 1.0, IS_SH(id)) }
        if (row_end) {
            [[unroll]] for (uint i = 0; i < XNR; ++i) {
                float gate = cluster_sum(acc[i]) * inv, up = cluster_sum(acc[XNR + i]) * inv;
                gate = min(gate, p.limit);
                up = clamp(up, -p.limit, p.limit);
                float v = id >= 0 ? gate / (1.0 + exp(-gate)) * up : id == -2 ? 0.0 : NAN;
                if (lane == i % LANES && f0 + i < p.N) d[p.d_off + t * p.d_s0 + r * p.d_s1 + (f0 + i) * p.d_s2] = v;
                acc[i] = 0.0;
                acc[XNR + i] = 0.0;
            }
        }
        s0 = s1; b = b1; r = r1; f0 = f1; id = id1; live = live1;
        XS_SHIFT()
    }
}
#else
// Route R_'s expert ID_ (expert()), weight WT_ and rows WB (outputs n0.., clamped).
#define SUM_ROUTE(R_, ID_, WT_, WB, SB) { \
    ID_ = expert(t, R_); \
    WT_ = route[p.r_off + t * p.r_s0 + (R_) * p.r_s1 + p.r_s2]; \
    bool sh_ = IS_SH(ID_); \
    uint e_ = sh_ ? 0u : p.w_off + uint(max(ID_, 0)) * p.w_s0, rs_ = sh_ ? SH_KW : p.w_s1; \
    [[unroll]] for (uint i = 0; i < WR; ++i) WB[i] = e_ + min(n0 + i, p.N - 1u) * rs_; \
    [[unroll]] for (uint i = 0; i < WR; ++i) SB[i] = sh_ ? SH_SCALE_ROW(WB[i]) : q_scale_row(WB[i]); }

layout(constant_id = 8) const uint XSPLIT = 1;
shared float xsp[256];                  // the split routes' sums: [cluster (≤ 64)][XNR (≤ 4)]
#if defined(ROUTE_GROUPS)
layout(constant_id = 10) const uint XRGROUPS = 1;
#if defined(SHARED_FP8)
#define PART_BINDING (W_SCALE_BINDING + 3)
#else
#define PART_BINDING (W_SCALE_BINDING + 1)
#endif
#define LG_BINDING (PART_BINDING + 1)
layout(binding = PART_BINDING) coherent buffer Parts { float part[]; };
#include "last_group.glsl"
#else
const uint XRGROUPS = 1u;
#endif

void main() {
    uint lane = cluster_lane(), cl = lane_linear() / LANES, CPW = gl_WorkGroupSize.x / LANES;
    uint KU = p.q_kw / 4u, SKU = SH_KW / 4u, STEP = LANES * UNROLL, BPW = CPW / XSPLIT;
    uint GPB = ((p.N + XNR - 1u) / XNR + BPW - 1u) / BPW, g = flat_group();
    if (g >= p.T * GPB * XRGROUPS) return;              // whole workgroup leaves together
    uint grp = g % XRGROUPS, blk = g / XRGROUPS;        // (route group, (token, output block))
    uint t = blk / GPB;
    uint n0 = ((blk % GPB) * BPW + cl / XSPLIT) * XNR;
    bool rows = n0 < p.N;                               // clusters past N still stage and wait
    uint RPG = (p.R + XRGROUPS - 1u) / XRGROUPS;        // routes rb .. re − 1 (all of them: 0 .. R − 1)
    uint rb = min(grp * RPG, p.R), re = min(rb + RPG, p.R);
    uint r = rb + cl % XSPLIT, s0 = 0;
    int id = -2;                                        // (no route: adds nothing)
    float wt = 0.0;
    uint wb[WR], sb[WR];
    [[unroll]] for (uint i = 0; i < WR; ++i) { wb[i] = 0u; sb[i] = 0u; }
    uvec4 cw[WR][UNROLL];
    uint cs[WR][UNROLL];
    if (r < re) SUM_ROUTE(r, id, wt, wb, sb)
    if (rows && id >= 0) { XS_LOAD(cw, cs, wb, sb, 0u, IS_SH(id)) }
    stage_x(p.x_off + t * p.x_s0 + rb * p.x_s1, p.x_s1, min(XRG, re - rb), KU);
    barrier();
    bool ok = true;
    float acc[WR];
    [[unroll]] for (uint i = 0; i < WR; ++i) acc[i] = 0.0;
    while (r < re) {                                    // uniform per workgroup (XSPLIT > 1: per cluster)
        uint s1 = s0 + STEP, r1 = r;
        bool route_end = s1 >= (IS_SH(id) ? SKU : KU);
        if (route_end) { s1 = 0; r1 += XSPLIT; }
        int id1 = id;
        float wt1 = wt;
        uint wb1[WR], sb1[WR];
        [[unroll]] for (uint i = 0; i < WR; ++i) { wb1[i] = wb[i]; sb1[i] = sb[i]; }
        if (route_end && r1 < re) SUM_ROUTE(r1, id1, wt1, wb1, sb1)
        uvec4 nw[WR][UNROLL];
        uint ns[WR][UNROLL];
        if (rows && r1 < re && id1 >= 0) { XS_LOAD(nw, ns, wb1, sb1, s1, IS_SH(id1)) }
        if (rows && id >= 0) { XS_COMPUTE(cw, cs, sb, s0, (r - rb) % XRG, wt, IS_SH(id)) }
        if (route_end) {
            ok = ok && (id >= 0 || id == -2);
            if (XSPLIT == 1u && r1 < re && (r1 - rb) % XRG == 0u) {  // the next routes' x rows
                barrier();
                stage_x(p.x_off + t * p.x_s0 + r1 * p.x_s1, p.x_s1, min(XRG, re - r1), KU);
                barrier();
            }
        }
        s0 = s1; r = r1; id = id1; wt = wt1;
        XS_SHIFT()
    }
    float v[XNR];
    [[unroll]] for (uint i = 0; i < XNR; ++i) v[i] = ok ? cluster_sum(acc[i]) : NAN;
    if (XSPLIT > 1u) {
        if (lane == 0u) [[unroll]] for (uint i = 0; i < XNR; ++i) xsp[cl * XNR + i] = v[i];
        barrier();
        [[unroll]] for (uint i = 0; i < XNR; ++i) {
            v[i] = 0.0;
            for (uint c = cl - cl % XSPLIT; c < cl - cl % XSPLIT + XSPLIT; ++c) v[i] += xsp[c * XNR + i];
        }
    }
#if defined(ROUTE_GROUPS)
    // this group's sums to the partials; the output block's last workgroup adds them in group order
    [[unroll]] for (uint i = 0; i < XNR; ++i)
        if (lane == i % LANES && cl % XSPLIT == 0u && n0 + i < p.N)
            part[p.part_off + (t * XRGROUPS + grp) * p.N + n0 + i] = v[i];
    if (!last_group(p.cnt_off + blk, XRGROUPS)) return;
    [[unroll]] for (uint i = 0; i < XNR; ++i)
        if (lane == i % LANES && cl % XSPLIT == 0u && n0 + i < p.N) {
            v[i] = part[p.part_off + t * XRGROUPS * p.N + n0 + i];
            for (uint j = 1u; j < XRGROUPS; ++j) v[i] += part[p.part_off + (t * XRGROUPS + j) * p.N + n0 + i];
        }
#endif
    [[unroll]] for (uint i = 0; i < XNR; ++i) {
        uint n = min(n0 + i, p.N - 1u);
#if defined(HAS_ADD)
        v[i] += addend[p.a_off + t * p.a_s0 + n * p.a_s1];
#endif
        if (lane == i % LANES && cl % XSPLIT == 0u && n0 + i < p.N) d[p.d_off + t * p.d_s0 + n * p.d_s1] = v[i];
    }
}
#endif
#else
void main() {
    uint item = cluster_id();
    uint lane = cluster_lane();
#if defined(MODE_SWIGLU)
    if (item >= p.T * p.R * p.N) return;                // whole cluster leaves together
    uint f = item % p.N, tr = item / p.N;
    uint r = tr % p.R, t = tr / p.R;
    int id = expert(t, r);
    float v = id == -2 ? 0.0 : NAN;                     // another part's expert: 0 here
    if (id >= 0) {                                      // uniform per cluster
        uint xb = p.x_off + t * p.x_s0 + r * p.x_s1;
        uint wb = p.w_off + uint(id) * p.w_s0;
        float a[ROWS];
#if defined(SHARED_FP8)
        if (id == int(p.E)) partial_dots(xb, uint[ROWS](f * S_KW, (p.N + f) * S_KW), lane, a, true);
        else
#endif
        partial_dots(xb, uint[ROWS](wb + f * p.w_s1, wb + (p.N + f) * p.w_s1), lane, a, false);
        float gate = cluster_sum(a[0]), up = cluster_sum(a[1]);
#if defined(NORM_X)
        float inv = 1.0 / sqrt(cluster_sum(ss) / float(p.K) + p.eps);
        gate *= inv;
        up *= inv;
#endif
        gate = min(gate, p.limit);
        up = clamp(up, -p.limit, p.limit);
        v = gate / (1.0 + exp(-gate)) * up;
    }
    if (lane == 0) d[p.d_off + t * p.d_s0 + r * p.d_s1 + f * p.d_s2] = v;
#elif defined(MODE_SUM)
    uint NB = (p.N + ROWS - 1) / ROWS;                  // ROWS outputs n0.. a cluster (rows past N:
    if (item >= p.T * NB) return;                       // clamped for loading, not stored)
    uint n0 = (item % NB) * ROWS, t = item / NB, n = n0;
    float acc = 0.0, accs[ROWS];
    [[unroll]] for (uint i = 0; i < ROWS; ++i) accs[i] = 0.0;
    bool ok = true;
#if ROUTES == 1
    for (uint r = 0; r < p.R; ++r) {                    // the measured default: a route at a time
        int id = expert(t, r);
        if (id < 0) { ok = ok && id == -2; continue; }
        float wt = route[p.r_off + t * p.r_s0 + r * p.r_s1 + p.r_s2];
        uint xb = p.x_off + t * p.x_s0 + r * p.x_s1;
        float a[ROWS];
        uint wb[ROWS];
#if defined(SHARED_FP8)
        if (id == int(p.E)) {
            [[unroll]] for (uint i = 0; i < ROWS; ++i) wb[i] = min(n0 + i, p.N - 1) * S_KW;
            partial_dots(xb, wb, lane, a, true);
        } else
#endif
        {
            [[unroll]] for (uint i = 0; i < ROWS; ++i) wb[i] = p.w_off + uint(id) * p.w_s0 + min(n0 + i, p.N - 1) * p.w_s1;
            partial_dots(xb, wb, lane, a, false);
        }
        [[unroll]] for (uint i = 0; i < ROWS; ++i) accs[i] += wt * a[i];
    }
    [[unroll]] for (uint i = 1; i < ROWS; ++i) {        // rows after the first: stored here
        float s = cluster_sum(accs[i]);
        uint ni = min(n0 + i, p.N - 1);
#if defined(HAS_ADD)
        s += addend[p.a_off + t * p.a_s0 + ni * p.a_s1];
#endif
        if (lane == i % LANES && n0 + i < p.N) d[p.d_off + t * p.d_s0 + ni * p.d_s1] = ok ? s : NAN;
    }
    acc = accs[0];
#else
    for (uint r0 = 0; r0 < p.R; r0 += ROUTES) {
        // routes past R (the last group's padding) and invalid ids read a valid row (route R − 1's,
        // expert 0's) and are not added: every load in bounds, the loads of a group together
        uint xb[ROUTES], wb[ROUTES];
        float wt[ROUTES];
        bool use[ROUTES];
        [[unroll]] for (uint i = 0; i < ROUTES; ++i) {
            uint r = min(r0 + i, p.R - 1);
            int id = expert(t, r);
            use[i] = r0 + i < p.R && id >= 0;
            if (r0 + i < p.R && id == -1) ok = false;
            wt[i] = route[p.r_off + t * p.r_s0 + r * p.r_s1 + p.r_s2];
            xb[i] = p.x_off + t * p.x_s0 + r * p.x_s1;
            wb[i] = p.w_off + uint(max(id, 0)) * p.w_s0 + n * p.w_s1;
        }
        float a[ROUTES];
        route_dots(xb, wb, lane, a);
        [[unroll]] for (uint i = 0; i < ROUTES; ++i)
            if (use[i]) acc += wt[i] * a[i];
    }
#endif
    float s = cluster_sum(acc);
#if defined(HAS_ADD)
    s += addend[p.a_off + t * p.a_s0 + n * p.a_s1];
#endif
    if (lane == 0) d[p.d_off + t * p.d_s0 + n * p.d_s1] = ok ? s : NAN;
#else
#error "define MODE_SWIGLU or MODE_SUM"
#endif
}
#endif
