#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: MODE_SWIGLU ; W_BF16 | W_F16 | W_FP8 | W_FP4 | W_FP4 SHARED_FP8 ; - | NORM_X ; - | CM_NV
//! variants: MODE_SUM ; W_BF16 | W_F16 | W_FP8 | W_FP4 | W_FP4 SHARED_FP8 ; - | CM_NV
//! variants: X_ROWS ; - | NORM_X
// MUL_MAT_ID's grouped kernel on 16-bit matrix units: the products of mul_mat_id_grouped.comp (same
// route lists from mul_mat_id_sort.comp, same outputs, same push block and bindings) with fp16 inputs
// and f32 sums, for bf16 / f16 / FP8 / FP4 experts (FP4 with -D SHARED_FP8 the FP8 shared expert):
//   MODE_SWIGLU  out[t, r, f] = silu(min(g, limit)) · clamp(u, −limit, limit) of g = w[id, f]·x[t, r],
//                u = w[id, F + f]·x[t, r]; NORM_X: x·gn staged, the sums times 1/rms(x) (rms(x) =
//                sqrt(mean x² + eps), Σx² of the f32 x); a route of another part: 0; an invalid id: NaN.
//   MODE_SUM     y[t, r, n] = w[id, n]·x[t, r] per route slot (mul_mat_id_combine.comp sums them).
// Range: every row staged is scaled by a power of two first (coopmat_scale.glsl): a gathered x row
// (x·gn with NORM_X) by 2^row_shift of its largest finite |value| over K, found by the workgroup
// before its k loop (a scan of its x rows, a shared atomicMax of f32 bits: non-negative floats order
// as uints); FP8 / FP4 rows by their folded scale bytes (FP8's 128 × 128 block scales folded per row
// too: one accumulator set, any tile; rows spanning more than 12 (FP8) or 26 (FP4) binades summed in
// f32 from the dequantised weights, as mul_mat_coopmat.comp's FP8_FOLD / FP4); f16 weights as they
// are; bf16 weights unscaled where every weight row of the tile has its largest finite |value| m in
// [2⁻⁷, 65504] or 0 (values of at least 2⁻¹⁷ are then fp16s exactly, smaller ones rounded to fp16's
// subnormals: absolute error ≤ 2⁻²⁵ ≤ 2⁻¹⁸·m), else (wbad, found from the maxima gathered while
// staging) the products are formed again with each weight row's shift from its m. The sums are
// multiplied back by 2^−(sx + sw) in f32.
// Tile (spec constants): BT route slots (one bucket's: the sort's tile) × BN outputs (MODE_SWIGLU: BN
// gate rows, then BN up rows: BR = WR·BN weight rows), K in steps of BK (a multiple of 16). NW =
// (BT/WM)·(BR/WN) warps of 32 invocations, warp w computing slots WM·(w / (BR/WN)) .. +WM−1 and
// weight rows WN·(w % (BR/WN)) .. +WN−1 as (WM/16)·(WN/16) 16 × 16 f32 accumulators. Staging: the
// BT + BR rows × BK/8 chunks of 8 consecutive k are the items q of the tile step (row q / (BK/8),
// chunk q % (BK/8)); invocation i stages items i, i + WG, ... every step (the same rows: addresses
// and scales found once; two vec4 / one uvec4 / two or one code words a load), scaled, rounded to
// fp16 (packHalf2x16) and stored as one uvec4 in rows of XS = BK + 8 halves (16-byte aligned, rows on
// distinct banks; k past K: 0), x rows then weight rows. Each step: the chunks stored; barrier; the
// next step's chunks loaded into registers (in flight during the products); the products; barrier.
// Epilogue, EP slots a pass: the accumulators of the warps holding them to an f32 tile [EP][BR] in the
// staging memory (free after the loop), barrier, then invocation i takes outputs i, i + WG, ... of the
// pass (slot q / BN, output q % BN: consecutive invocations, consecutive outputs), gate at column o
// and up at BN + o.
//   -D CM_NV: products by VK_NV_cooperative_matrix (16 × 16 × 16 fp16 · fp16 + f32, subgroup scope,
//     full 32-lane subgroups): A from x rows row-major, B from weight rows column-major; warp w is
//     subgroup gl_SubgroupID.
//   without: the same staging, scales and epilogue with the products formed by FMA loops, lane l of
//     warp w holding elements l + 32·m of each 16 × 16 tile (any device: the kernel's data flow and
//     rounding, for tests).
// X_HALF (spec constant 8, 0 or 1; knob mul_mat_id_coopmat.x_half): x rounded to fp16 once instead of by
//   every output tile of a token tile. A pass before the GEMM (-D X_ROWS, below) writes each x row as the
//   staging would (x (·gn) · 2^sx, packHalf2x16, 8 halves a uvec4) with its shift sx (and 1/rms(x) with
//   NORM_X) to xh: row records of K/8 + 1 uvec4s (the halves, then uvec4(sx, 1/rms bits, 0, 0)), one per
//   token where x's route stride is 0 (the SwiGLU's x [T, 1, K] broadcast over the routes), else one per
//   route slot t·R + r. The GEMM then skips its x rows' scan (shifts and 1/rms read from the records) and
//   stages each x chunk as the record's uvec4, unchanged (16 bytes per 8 inputs instead of 32, no multiply
//   or pack); the weights, the epilogue and the f32 sums of flagged rows (which read the f32 x) are as
//   without it, so the outputs are the same bit for bit. A specialization constant, not a define: every
//   variant declares xh and every launch binds a buffer there (x itself where X_HALF is 0: never read).
// -D X_ROWS: that pass. Invocations (c, row) of a workgroup of KP·PR (spec constant 0, at most 256; PR
//   rows, KP = BK/8 lanes a row): lane c takes chunk column c (inputs k0 + 8c of every step k0 = 0, BK, ..:
//   the GEMM's own columns, so Σx² is summed per column in the GEMM's order and the columns added in
//   order: the same f32 value); the row's largest finite |value| by a shared atomicMax, then the row read
//   again (cached) and written scaled and rounded. Push: rows, R, K, x_off, x_s0, x_s1 (NORM_X: g_off,
//   eps). Bindings: 0 x, 1 gn (NORM_X), then xh. Spec constant 5 BK as the GEMM's.
// Needs K % 8 == 0 and x rows (and gn), bf16 / f16 weight rows 16-byte aligned (the host checks; else
// the f32 grouped kernel runs).
// Grid as mul_mat_id_grouped.comp: x = tiles of NT·BN outputs, y = tile slots (a workgroup past the sort's
// tiles leaves at once). Spec constants: 0 workgroup size (NW·32), 1 BT, 2 BN, 3 WM, 4 WN (multiples of
// 16; BT % WM == BR % WN == 0), 5 BK (a multiple of 16; BK/8 divides the workgroup size), 6 EP (a
// multiple of WM, at most BT: the host picks the most the shared memory holds), 7 NT (output tiles a
// workgroup takes in turn, its x rows' shifts found once: grid x = tiles of NT·BN outputs).
// Push block (as mul_mat_id_grouped.comp's): R, N (F for SWIGLU), K, E, id_base, n_ids; x_off, x_s0,
// x_s1; w_off, w_s0, w_s1; r_off, r_s0, r_s1; d_off, d_s0, d_s1, d_s2; s_off, TILE0, LIST0, EL;
// limit; NORM_X: g_off, eps; quantised: q_kw, q_rows, q_srows, q_sc; SHARED_FP8: s_rows. Bindings: 0 x,
// 1 w, 2 route, 3 sort (i32), 4 out, 5 gn (NORM_X), then the scale bytes, the shared expert's codes and
// scale bytes (weights.glsl), then xh (X_HALF's records; written by X_ROWS). Spec constant 8 X_HALF.
#include "common.glsl"
#if defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
layout(constant_id = 1) const uint BT = 16;
layout(constant_id = 2) const uint BN = 16;
layout(constant_id = 3) const uint WM = 16;
layout(constant_id = 4) const uint WN = 16;
layout(constant_id = 5) const uint BK = 32;
layout(constant_id = 6) const uint EP = 16;             // slots an epilogue pass (a multiple of WM)
layout(constant_id = 7) const uint NT = 1;              // output tiles a workgroup takes in turn
layout(constant_id = 8) const uint X_HALF = 0;          // x's chunks from xh, as the X_ROWS pass rounded them
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#if defined(X_ROWS)
layout(push_constant) uniform P {
    uint rows, R, K;
    uint x_off, x_s0, x_s1;
#if defined(NORM_X)
    uint g_off;
    float eps;
#endif
} p;
#define G_BINDING 1
#if defined(NORM_X)
#define XH_BINDING 2
#else
#define XH_BINDING 1
#endif
layout(binding = XH_BINDING) writeonly buffer XHalf { uvec4 xh[]; };
#else
layout(binding = 2) readonly buffer Rt { float route[]; };
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
#define G_BINDING 5
#if defined(NORM_X)
#define W_SCALE_BINDING 6
#else
#define W_SCALE_BINDING 5
#endif
#define WS_BINDING (W_SCALE_BINDING + 1)
#define WS_SCALE_BINDING (W_SCALE_BINDING + 2)
#if defined(SHARED_FP8)
#define XH_BINDING (W_SCALE_BINDING + 3)
#elif defined(W_FP8) || defined(W_FP4)
#define XH_BINDING (W_SCALE_BINDING + 1)
#else
#define XH_BINDING W_SCALE_BINDING
#endif
layout(binding = XH_BINDING) readonly buffer XHalf { uvec4 xh[]; };
#include "weights.glsl"
#if !defined(W_QUANT)
layout(binding = 1) readonly buffer W8 { uvec4 w128[]; };
#endif
#endif
#if defined(NORM_X)
layout(binding = G_BINDING) readonly buffer G { float gn[]; };
layout(binding = G_BINDING) readonly buffer G4 { vec4 gn4[]; };
mat2x4 gn_chunk(uint k) { return mat2x4(gn4[(p.g_off + k) / 4u], gn4[(p.g_off + k) / 4u + 1u]); }
#endif
#include "coopmat_scale.glsl"

const uint KP = BK / 8u;                // chunks of 8 inputs of a row a step
// The chunk at k (k % 8 == 0; K % 8 == 0: whole or past K: 0) of the x row at xb
mat2x4 x_chunk(uint xb, uint k) { return k < p.K ? mat2x4(x4[(xb + k) / 4u], x4[(xb + k) / 4u + 1u]) : mat2x4(0.0); }
// A chunk's Σx² and a row's 1 / rms(x) from its Σx², precise (no fused multiply-adds): the GEMM and the X_ROWS pass
// form them alike whatever the compiler would contract in either (x_half's records are the GEMM's own values)
float sq8(mat2x4 v) {
    precise vec4 a = v[0] * v[0], b = v[1] * v[1];
    precise float r = ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
    return r;
}
#if defined(NORM_X)
float inv_rms(float s2) {
    precise float r = 1.0 / sqrt(s2 / float(p.K) + p.eps);
    return r;
}
#endif
uvec4 pack8(mat2x4 v) {                 // 8 values as fp16, k even in the low half
    return uvec4(packHalf2x16(v[0].xy), packHalf2x16(v[0].zw), packHalf2x16(v[1].xy), packHalf2x16(v[1].zw));
}
uint xh_stride() { return p.K / 8u + 1u; }   // uvec4s of an xh record: the halves, then the shift and 1/rms

#if defined(X_ROWS)
shared uint rmx[256];                   // each row's largest finite |value| (f32 bits; PR ≤ 256 rows)
#if defined(NORM_X)
shared float ssp[256];                  // Σx² of each row's chunk column (row · KP + column)
#endif

void main() {
    uint id = gl_LocalInvocationID.x, pr = gl_WorkGroupSize.x / KP, rl = id / KP, c = id % KP;
    uint g = flat_group() * pr + rl;
    bool live = g < p.rows;             // (no early return: the barriers below)
    uint rr = p.x_s1 == 0u ? 1u : p.R;  // x rows a token: 1 where x is broadcast over the routes
    uint t = g / rr;
    uint xb = p.x_off + t * p.x_s0 + (g - t * rr) * p.x_s1;
    float m = 0.0;
#if defined(NORM_X)
    float ss = 0.0;
#endif
    for (uint k0 = 0u; live && k0 < p.K; k0 += BK) {    // as the GEMM's scan: column c, step by step
        uint k = k0 + 8u * c;
        mat2x4 v = x_chunk(xb, k);
#if defined(NORM_X)
        ss += sq8(v);
        if (k < p.K) v = matrixCompMult(v, gn_chunk(k));
#endif
        m = max(m, finite_max(v));
    }
    if (c == 0u) rmx[rl] = 0u;
    barrier();
    atomicMax(rmx[rl], floatBitsToUint(m));
#if defined(NORM_X)
    ssp[id] = ss;
#endif
    barrier();
    if (!live) return;
    int s = row_shift(uintBitsToFloat(rmx[rl]));
    uint hb = g * xh_stride();
    for (uint k = 8u * c; k < p.K; k += BK) {           // the row again (cached), as the GEMM stages it
        mat2x4 v = x_chunk(xb, k);
#if defined(NORM_X)
        v = matrixCompMult(v, gn_chunk(k));
#endif
        xh[hb + k / 8u] = pack8(v * pow2(s));
    }
    if (c == 0u) {
        float iv = 1.0;
#if defined(NORM_X)
        float s2 = 0.0;
        for (uint j = 0u; j < KP; ++j) s2 += ssp[rl * KP + j];
        iv = inv_rms(s2);
#endif
        xh[hb + p.K / 8u] = uvec4(uint(s), floatBitsToUint(iv), 0u, 0u);
    }
}
#else
#define NAN uintBitsToFloat(0x7FC00000u)
#if defined(MODE_SWIGLU)
const uint WR = 2u;                     // gate and up rows
#else
const uint WR = 1u;
#endif
const uint BR = WR * BN;                // weight rows of a tile
const uint NWN = BR / WN;               // warps along the weight rows
const uint NW = (BT / WM) * NWN;        // warps a workgroup
const uint WG = NW * 32u;
const uint TI = WM / 16u, TJ = WN / 16u;
const uint XS = BK + 8u;                // halves between staged rows
const uint XS8 = XS / 8u;
const uint ITEMS = (BT + BR) * KP;      // chunks of a step
const uint NI = (ITEMS + WG - 1u) / WG; // chunks an invocation stages a step
const uint STAGE8 = (BT + BR) * XS / 8u, TILE8 = EP * BR / 4u;
// the staging buffer (fp16 pairs, k even in the low half), later the f32 tile [EP][BR] of an epilogue pass
shared uvec4 smem[STAGE8 > TILE8 ? STAGE8 : TILE8];
shared uint mx[BT + BR];                // rows' largest finite |value| (f32 bits)
shared int sh[BT + BR];                 // rows' shifts: x rows, then weight rows (folded: flagged)
shared uint slots[BT];
#if defined(W_QUANT)
const uint SP = 8u;                     // invocations that scan a quantised row's scale bytes
shared uint rlo[BR], rhi[BR];           // its smallest and largest scale byte
#endif
shared uint wbad;                       // bf16: a weight row's largest value outside [2⁻⁷, 65504] (and not 0)
#if defined(NORM_X)
shared float ssp[BT * KP];              // Σx² of each x row's chunk column (fixed order, no float atomics)
shared float inv[BT];                   // 1 / rms(x) of each slot
#endif

#if defined(CM_NV)
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#endif

uint x_row(uint s) {
    uint t = s / p.R;
    return p.x_off + t * p.x_s0 + (s - t * p.R) * p.x_s1;
}
const bool XH = X_HALF != 0u;
uint xh_row(uint s) { return (p.x_s1 == 0u ? s / p.R : s) * xh_stride(); }    // slot s's xh record
uint d_at(uint s, uint n) {
    uint t = s / p.R;
    return p.d_off + t * p.d_s0 + (s - t * p.R) * p.d_s1 + n * p.d_s2;
}
// weight row j of the tile (gate rows 0..BN−1, up rows BN..2BN−1), clamped past N: its first element
// (words for quantised weights; the shared expert's tensor with sh)
uint w_row(uint e, bool shx, uint n0, uint j) {
    uint n = min(n0 + j % BN, p.N - 1u) + (j / BN) * p.N;
#if defined(SHARED_FP8)
    if (shx) return n * S_KW;
#endif
    return p.w_off + e * p.w_s0 + n * p.w_s1;
}
#if defined(W_QUANT)
uint scale_byte(uint i) { return (wscale[i >> 2] >> ((i & 3u) << 3)) & 0xFFu; }
#if defined(SHARED_FP8)
uint s_scale_byte(uint i) { return (wsscale[i >> 2] >> ((i & 3u) << 3)) & 0xFFu; }
#endif
// the first scale byte of the row at wb's grid row, and its scale bytes (q_sc, the shared expert's
// ceil(K / 128))
uint w_scale_row(uint wb, bool shx) {
#if defined(SHARED_FP8)
    if (shx) {
        uint row = wb / S_KW, m = row / p.s_rows;
        return (m * ((p.s_rows + 127u) / 128u) + (row - m * p.s_rows) / 128u) * ((p.K + 127u) / 128u);
    }
#endif
    return q_scale_row(wb);
}
#endif
// dequantised weight k of the row at wb (the f32 sums of flagged rows)
float w_at(uint wb, uint k, bool shx) {
#if defined(SHARED_FP8)
    if (shx) return S1_ROW(wb, k);
#endif
    return W1_ROW(wb, k);
}

// The chunk at k (k % 8 == 0; K % 8 == 0: whole or past K) of a weight row as exact f32 values and its
// exponent: float weights their values (exponent 0), quantised weights their codes' halves (E4M3 · 2⁻⁸,
// E2M1 · 2⁻¹⁴) and the chunk's scale byte.
mat2x4 w_chunk(uint wb, uint sb, uint k, bool shx, out int e) {
    e = 0;
    if (k >= p.K) return mat2x4(0.0);
#if defined(SHARED_FP8)
    if (shx) {
        e = int(s_scale_byte(sb + k / 128u));
        return mat2x4(q_fp8x4(wsq[wb + k / 4u]), q_fp8x4(wsq[wb + k / 4u + 1u]));
    }
#endif
#if defined(W_FP8)
    e = int(scale_byte(sb + k / 128u));
    return mat2x4(q_fp8x4(wq[wb + k / 4u]), q_fp8x4(wq[wb + k / 4u + 1u]));
#elif defined(W_FP4)
    uint v = wq[wb + k / 8u];
    e = int(scale_byte(sb + k / 32u));
    return mat2x4(q_fp4x4(v), q_fp4x4(v >> 16));
#else
    uvec4 u = w128[(wb + k) / 8u];
    return mat2x4(w_half(u.x & 0xFFFFu), w_half(u.x >> 16), w_half(u.y & 0xFFFFu), w_half(u.y >> 16),
                  w_half(u.z & 0xFFFFu), w_half(u.z >> 16), w_half(u.w & 0xFFFFu), w_half(u.w >> 16));
#endif
}

void stage(uint h, mat2x4 v) { smem[h / 8u] = pack8(v); }     // halves h .. h + 7 (h % 8 == 0): one 16-byte store
#if !defined(CM_NV)
vec2 staged_pair(uint i) { return unpackHalf2x16(smem[i / 4u][i % 4u]); }     // halves 2i, 2i + 1
#endif

// the items' chunks at step k0 (past K: 0): x (·gn) values (XH: xq, the halves as the pass wrote them),
// weights as w_chunk gives them
void load_items(uint k0, uint rw[NI], uint base[NI], uint sb[NI], uint kc, bool shx, out mat2x4 v[NI], out int ve[NI],
                out uvec4 xq[NI]) {
    [[unroll]] for (uint u = 0u; u < NI; ++u) {
        uint k = k0 + kc;
        ve[u] = 0;
        xq[u] = uvec4(0u);
        v[u] = mat2x4(0.0);
        if (rw[u] < BT && XH) {
            if (k < p.K) xq[u] = xh[base[u] + k / 8u];
        } else if (rw[u] < BT) {
            v[u] = x_chunk(base[u], k);
#if defined(NORM_X)
            if (k < p.K) v[u] = matrixCompMult(v[u], gn_chunk(k));
#endif
        } else {
            v[u] = w_chunk(base[u], sb[u], k, shx, ve[u]);
        }
    }
}

void main() {
    uint id = gl_LocalInvocationID.x;
    uint tile = gl_WorkGroupID.y, n_first = gl_WorkGroupID.x * NT * BN;
    if (tile >= uint(sr[p.s_off])) return;              // past the tiles the routing makes
    uint at = p.s_off + p.TILE0 + 3u * tile;
    uint bucket = uint(sr[at]), first = uint(sr[at + 1u]), rows = uint(sr[at + 2u]);
    for (uint i = id; i < BT; i += WG) slots[i] = uint(sr[p.s_off + p.LIST0 + first + min(i, rows - 1u)]);
    barrier();
    if (bucket == p.EL) {                               // routes not computed here
#if defined(MODE_SWIGLU)
        for (uint q = id; q < rows * BN * NT; q += WG) {
            uint i = q / (BN * NT), n = n_first + q % (BN * NT), s = slots[i], t = s / p.R;
            if (n >= p.N) continue;
            float f = route[p.r_off + t * p.r_s0 + (s - t * p.R) * p.r_s1];
            bool valid = f >= 0.0 && f < float(p.n_ids) && f == floor(f);
            d[d_at(s, n)] = valid ? 0.0 : NAN;
        }
#endif
        return;
    }
    bool shx = false;
#if defined(SHARED_FP8)
    shx = bucket == p.E;
#endif
#if defined(W_FP8)
    const int f_top = FP8_FOLD_TOP, f_spread = FP8_FOLD_SPREAD, f_exp = FP8_FOLD_EXP;
#elif defined(W_FP4)
    int f_top = shx ? FP8_FOLD_TOP : FP4_FOLD_TOP, f_spread = shx ? FP8_FOLD_SPREAD : FP4_FOLD_SPREAD;
    int f_exp = shx ? FP8_FOLD_EXP : FP4_FOLD_EXP;
#endif

    // this invocation's items: row, chunk, the row's first element (word), first scale byte
    uint rw[NI], base[NI], sb[NI];
    [[unroll]] for (uint u = 0u; u < NI; ++u) {
        uint q = min(id + u * WG, ITEMS - 1u), r = q / KP;
        rw[u] = r;
        base[u] = r < BT ? (XH ? xh_row(slots[r]) : x_row(slots[r])) : 0u;     // (weight rows: per output tile)
        sb[u] = 0u;
    }
    uint kc = 8u * (id % KP);                           // (WG % KP == 0: every item of this invocation's at it)

    // 1. the x rows' shifts: their largest finite |value| (x·gn) over K (and Σx² with NORM_X), found once for
    // the NT output tiles this workgroup takes (XH: as the X_ROWS pass found them, from the records)
    float m[NI];
    [[unroll]] for (uint u = 0u; u < NI; ++u) m[u] = 0.0;
    if (XH) {
        for (uint i = id; i < BT; i += WG) {
            uvec4 rec = xh[xh_row(slots[i]) + p.K / 8u];
            sh[i] = int(rec.x);
#if defined(NORM_X)
            inv[i] = uintBitsToFloat(rec.y);
#endif
        }
    } else {
    for (uint i = id; i < BT; i += WG) mx[i] = 0u;
#if defined(NORM_X)
    float ss[NI];
    [[unroll]] for (uint u = 0u; u < NI; ++u) ss[u] = 0.0;
#endif
    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
        uint k = k0 + kc;
        [[unroll]] for (uint u = 0u; u < NI; ++u) {
            if (rw[u] < BT) {
                mat2x4 v = x_chunk(base[u], k);
#if defined(NORM_X)
                ss[u] += sq8(v);
                if (k < p.K) v = matrixCompMult(v, gn_chunk(k));
#endif
                m[u] = max(m[u], finite_max(v));
            }
        }
    }
    barrier();                                          // (mx cleared)
    [[unroll]] for (uint u = 0u; u < NI; ++u) if (id + u * WG < ITEMS && rw[u] < BT) atomicMax(mx[rw[u]], floatBitsToUint(m[u]));
#if defined(NORM_X)
    [[unroll]] for (uint u = 0u; u < NI; ++u) {
        uint q = id + u * WG;
        if (q < BT * KP) ssp[q] = ss[u];                // (item q of an x row is row q / KP, chunk q % KP)
    }
#endif
    barrier();
    for (uint i = id; i < BT; i += WG) {
        sh[i] = row_shift(uintBitsToFloat(mx[i]));
#if defined(NORM_X)
        float s2 = 0.0;
        for (uint c = 0u; c < KP; ++c) s2 += ssp[i * KP + c];
        inv[i] = inv_rms(s2);
#endif
    }
    }

    for (uint nt = 0u; nt < NT; ++nt) {                 // (uniform) the workgroup's output tiles in turn
    uint n0 = (gl_WorkGroupID.x * NT + nt) * BN;
    if (n0 >= p.N) break;
    // the weight rows' shifts: folded from their scale bytes (FP8 / FP4), 0 (f16; bf16 unless a row's
    // largest value falls outside [2⁻⁷, 65504], below)
    [[unroll]] for (uint u = 0u; u < NI; ++u) {
        if (rw[u] >= BT) {
            base[u] = w_row(bucket, shx, n0, rw[u] - BT);
#if defined(W_QUANT)
            sb[u] = w_scale_row(base[u], shx);
#endif
        }
    }
    for (uint i = id; i < BR; i += WG) mx[BT + i] = 0u;
    if (id == 0u) wbad = 0u;
#if defined(W_QUANT)
    for (uint i = id; i < BR; i += WG) { rlo[i] = 255u; rhi[i] = 0u; }
    barrier();
    // the weight rows' smallest and largest scale byte, SP invocations a row (each every SP-th byte)
    for (uint q = id; q < BR * SP; q += WG) {
        uint j = q / SP, r0 = w_scale_row(w_row(bucket, shx, n0, j), shx), lo = 255u, hi = 0u, nsc = p.q_sc;
#if defined(SHARED_FP8)
        if (shx) nsc = (p.K + 127u) / 128u;
#endif
        for (uint c = q % SP; c < nsc; c += SP) {
#if defined(SHARED_FP8)
            uint b = shx ? s_scale_byte(r0 + c) : scale_byte(r0 + c);
#else
            uint b = scale_byte(r0 + c);
#endif
            lo = min(lo, b);
            hi = max(hi, b);
        }
        atomicMin(rlo[j], lo);
        atomicMax(rhi[j], hi);
    }
    barrier();
    for (uint i = id; i < BR; i += WG) sh[BT + i] = fold_shift_of(rlo[i], rhi[i], f_top, f_spread);
#else
    for (uint i = id; i < BR; i += WG) sh[BT + i] = 0;
#endif
    barrier();

    // 2. the products, BK inputs a step. bf16 weights are staged unscaled first, their rows' largest finite
    // |value| m gathered on the way: a value v with 2⁻¹⁷ ≤ |v| ≤ 65504 is an fp16 exactly (8 significant
    // bits), smaller ones land on fp16's subnormal grid (absolute error ≤ 2⁻²⁵ ≤ 2⁻¹⁸·m where m ≥ 2⁻⁷).
    // Where a row of the tile has m > 65504 or 0 < m < 2⁻⁷, wbad is set and the workgroup forms its
    // products again with each weight row's shift from m (row_shift, as x's). (f16 weights are fp16
    // already; FP8 / FP4 rows take their folded shifts.)
#if defined(CM_NV)
    uint wc = gl_SubgroupID;
#else
    uint wc = id / 32u, lane = id % 32u;
#endif
    uint wt = (wc / NWN) * WM, wn = (wc % NWN) * WN;
#if defined(CM_NV)
    MAT_C acc[TI * TJ];
#else
    float acc[TI * TJ][8];
#endif
#if defined(W_BF16)
    const uint ATTEMPTS = 2u;
#else
    const uint ATTEMPTS = 1u;
#endif
    for (uint attempt = 0u; attempt < ATTEMPTS; ++attempt) {
#if defined(W_BF16)
        if (attempt == 1u) {                            // (uniform: wbad read after a barrier)
            if (wbad == 0u) break;
            for (uint i = BT + id; i < BT + BR; i += WG) sh[i] = row_shift(uintBitsToFloat(mx[i]));
            barrier();
        }
        [[unroll]] for (uint u = 0u; u < NI; ++u) m[u] = 0.0;     // the weight rows' largest |value|
#endif
        int rf[NI];                                     // each item's row exponent (folded rows: −top)
        [[unroll]] for (uint u = 0u; u < NI; ++u) {
#if defined(W_QUANT)
            rf[u] = rw[u] < BT ? sh[rw[u]] : fold_unflag(sh[rw[u]]) - f_top;
#else
            rf[u] = sh[rw[u]];
#endif
        }
#if defined(CM_NV)
        [[unroll]] for (uint a = 0u; a < TI * TJ; ++a) acc[a] = MAT_C(0.0);
#else
        for (uint a = 0u; a < TI * TJ; ++a) for (uint j = 0u; j < 8u; ++j) acc[a][j] = 0.0;
#endif
        mat2x4 v[NI];
        int ve[NI];
        uvec4 xq[NI];
        load_items(0u, rw, base, sb, kc, shx, v, ve, xq);
        for (uint k0 = 0u; k0 < p.K; k0 += BK) {
            // this step's chunks, scaled: x·gn · 2^sx, float weights · 2^sw, codes · 2^(EXP + s − top)
            [[unroll]] for (uint u = 0u; u < NI; ++u) {
                uint q = id + u * WG;
                if (q >= ITEMS) continue;
                int e = rf[u];
#if defined(W_QUANT)
                if (rw[u] >= BT) e = max(f_exp + ve[u] + e, -126);
#elif defined(W_BF16)
                if (rw[u] >= BT) m[u] = max(m[u], finite_max(v[u]));
#endif
                if (XH && rw[u] < BT) smem[(rw[u] * XS + 8u * (q % KP)) / 8u] = xq[u];
                else stage(rw[u] * XS + 8u * (q % KP), v[u] * pow2(e));
            }
            barrier();
            load_items(k0 + BK, rw, base, sb, kc, shx, v, ve, xq);     // the next step's, in flight during the products
#if defined(CM_NV)
            [[unroll]] for (uint kk = 0u; kk < BK; kk += 16u) {
                MAT_A a[TI];
                [[unroll]] for (uint i = 0u; i < TI; ++i)
                    coopMatLoadNV(a[i], smem, ((wt + 16u * i) * XS + kk) / 8u, XS8, false);
                [[unroll]] for (uint j = 0u; j < TJ; ++j) {
                    MAT_A b;                            // column-major: B(k, n) at weight row n, half k
                    coopMatLoadNV(b, smem, ((BT + wn + 16u * j) * XS + kk) / 8u, XS8, true);
                    [[unroll]] for (uint i = 0u; i < TI; ++i) acc[i * TJ + j] = coopMatMulAddNV(a[i], b, acc[i * TJ + j]);
                }
            }
#else
            // (loops kept rolled: lavapipe's compile time grows with the unrolled tiles)
            [[dont_unroll]] for (uint i = 0u; i < TI; ++i) [[dont_unroll]] for (uint j = 0u; j < TJ; ++j)
                [[dont_unroll]] for (uint mm = 0u; mm < 8u; ++mm) {
                    uint e = lane + 32u * mm;
                    uint xa = ((wt + 16u * i + e / 16u) * XS) / 2u;
                    uint wa = ((BT + wn + 16u * j + e % 16u) * XS) / 2u;
                    float sum = acc[i * TJ + j][mm];
                    for (uint q = 0u; q < BK / 2u; ++q) {
                        vec2 xp = staged_pair(xa + q), wp = staged_pair(wa + q);
                        sum = fma(xp.y, wp.y, fma(xp.x, wp.x, sum));
                    }
                    acc[i * TJ + j][mm] = sum;
                }
#endif
            barrier();                                  // every warp done with the step's tiles
        }
#if defined(W_BF16)
        if (attempt == 0u) {                            // the weight rows' maxima: any outside the range?
            [[unroll]] for (uint u = 0u; u < NI; ++u) if (id + u * WG < ITEMS && rw[u] >= BT) atomicMax(mx[rw[u]], floatBitsToUint(m[u]));
            barrier();
            for (uint i = BT + id; i < BT + BR; i += WG) {
                float mw = uintBitsToFloat(mx[i]);
                if (mw > 65504.0 || (mw > 0.0 && mw < 1.0 / 128.0)) wbad = 1u;     // (any writer: the same value)
            }
            barrier();
        }
#endif
    }

    // 3. epilogue, EP slots at a time: the accumulators of the warps holding them to the f32 tile [EP][BR],
    // then each output unscaled
    for (uint p0 = 0u; p0 < BT; p0 += EP) {
        if (wt >= p0 && wt < p0 + EP) {                 // (uniform per warp: its WM slots lie in one pass)
#if defined(CM_NV)
            [[unroll]] for (uint i = 0u; i < TI; ++i) [[unroll]] for (uint j = 0u; j < TJ; ++j)
                coopMatStoreNV(acc[i * TJ + j], smem, ((wt - p0 + 16u * i) * BR + wn + 16u * j) / 4u, BR / 4u, false);
#else
            for (uint a = 0u; a < TI * TJ; ++a) for (uint mm = 0u; mm < 8u; ++mm) {
                uint e = lane + 32u * mm;
                uint f = (wt - p0 + 16u * (a / TJ) + e / 16u) * BR + wn + 16u * (a % TJ) + e % 16u;
                smem[f / 4u][f % 4u] = floatBitsToUint(acc[a][mm]);
            }
#endif
        }
        barrier();
        for (uint q = id; q < EP * BN; q += WG) {
            uint i = p0 + q / BN, o = q % BN, n = n0 + o;
            if (i >= rows || n >= p.N) continue;
            uint s = slots[i];
            float r[WR];
            [[unroll]] for (uint h = 0u; h < WR; ++h) {
                uint c = h * BN + o, f = (i - p0) * BR + c;
                int ws = sh[BT + c];
#if defined(W_QUANT)
                if (fold_flagged(ws)) {                     // summed in f32 from the dequantised weights
                    uint xb = x_row(s), wb = w_row(bucket, shx, n0, c);
                    float sum = 0.0;
                    for (uint k = 0u; k < p.K; ++k) {
#if defined(NORM_X)
                        sum = fma(x[xb + k] * gn[p.g_off + k], w_at(wb, k, shx), sum);
#else
                        sum = fma(x[xb + k], w_at(wb, k, shx), sum);
#endif
                    }
                    r[h] = sum;
                    continue;
                }
                ws = fold_unflag(ws);
#endif
                r[h] = unscale(uintBitsToFloat(smem[f / 4u][f % 4u]), sh[i] + ws);
            }
#if defined(NORM_X)
            [[unroll]] for (uint h = 0u; h < WR; ++h) r[h] *= inv[i];
#endif
#if defined(MODE_SWIGLU)
            float gate = min(r[0], p.limit), up = clamp(r[1], -p.limit, p.limit);
            d[d_at(s, n)] = gate / (1.0 + exp(-gate)) * up;
#else
            d[d_at(s, n)] = r[0];
#endif
        }
        barrier();                                      // (the tile is written again next pass)
    }
    }                                                   // (the next output tile)
}
#endif
