#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | CM_NV ; - | MODE_HCA | MODE_CSA ; - | Q_NORM
// MQA_ATTENTION kernel="prefill_coopmat" / "prefill_coopmat_fma": mqa_prefill.comp's attention (one
// workgroup = one query token × HM = 16·HT of its heads, the token's key rows staged a tile at a time,
// online softmax with the sink, −1 CSA slots and keys outside the window masked; a position outside
// [0, capacity) gives NaN) with its two products on 16-bit matrix units: per tile of NT keys
// S = Q·Kᵀ (HM × NT × hd) and O += P·V (HM × hd × NT, V = the same staged key rows), fp16 inputs,
// f32 sums.
//
// Range. Every fp16 input is a row scaled by a power of two first (exact), as mul_mat_coopmat.comp
// does for its rows: q's row i (after its norm, RoPE and the softmax scale) by 2^sq_i, key row j by
// 2^sk_j, s = min(15 − e, 126) where 2^(e−1) ≤ m < 2^e, m the row's largest finite |value| (every
// finite value then < 2¹⁵ ≤ 65504; values down to m·2⁻²⁹ stay normal fp16, 11 significant bits).
// The score sum S'_ij = Σ (q·2^sq)(k·2^sk) (≤ hd·2³⁰, f32) is multiplied back by 2^−(sq_i + sk_j).
// For P·V the key rows stay as staged (v_j·2^sk_j), so P enters as P_ij·2^−sk_j, and row i of that by
// 2^a_i with a_i the same shift of the row's largest P_ij·2^−sk_j (found from the same reduction as
// the row's maximum: max_j (S_ij − sk_j·ln 2)): a softmax weight far below the sink's keeps its 11
// bits. The tile's product Σ_j (P·2^(a_i − sk_j)) (v_j·2^sk_j) is added to O_i times 2^−a_i in f32.
// inf and NaN are left out of m and stay inf / NaN.
//
// Lanes: WG = 32·WARPS invocations; warp w (32 of them: gl_SubgroupID with -D CM_NV) owns channels
// w·CW .. + CW − 1 (CW = HD / WARPS, HD = hd rounded up to 16·WARPS, zeros past hd) of both products:
// its slice of q as HT·CT 16 × 16 A tiles in registers (CT = CW / 16), its slice of O as HT·CT
// 16 × 16 f32 tiles of 8 elements a lane (lane l: elements l + 32·m, row (l + 32m) / 16, column
// (l + 32m) % 16), in registers.
// Start: q's rows, 16 (a head tile) at a time (LR = WG / 16 invocations a row, vec4 c of a row at
// invocation c % LR of the row's): normalised, rotated, scaled, rounded to fp16 into the key
// staging rows 0..15, then read into the head tile's A tiles.
// Tile loop (uniform per workgroup), NT keys a tile:
//   1. the keys' row starts and flags (as mqa_prefill.comp; a tile of −1 slots only is skipped),
//      written during the tile before (after its S product: CSA's idx loads in flight meanwhile);
//   2. key rows staged 16 at a time as q's: loaded (all of a pass's loads issued first), each row's
//      maximum by a shared atomicMax, shifted and stored as fp16 rows of ROWH = HD + 8 halves;
//   3. S: warp w sums its channel slice's products into HT × NT/16 tiles, stored to SP[w] (f32);
//   4. softmax: invocation (i = lid / RT, part = lid % RT), RT = WG / HM, takes keys part·KPT ..
//      + KPT − 1 of head row i: S_ij = Σ_w SP[w] · 2^−(sq_i + sk_j); the row's tile maximum and
//      max (S − sk·ln 2) by partials in shared memory; each of the row's invocations keeps the same
//      running maximum and its own part of the running sum (the sink's 1 in part 0's), writes its
//      P'_ij = P_ij·2^(a_i − sk_j) as fp16 pairs and, part 0, the row's correction e^(m_old − m_new)
//      and a_i;
//   5. P·V: warp w, per head tile and channel tile of its slice, the tile's product over the NT keys
//      (A = P' row-major, B = the staged key rows row-major), through its 16 × 16 f32 scratch in
//      shared memory into its lanes' O elements: O = O·corr_i + C·2^−a_i.
// End: the row's sum from its RT parts; O / l to out (heads past H and channels past hd not written).
// -D CM_NV: the products by VK_NV_cooperative_matrix (16 × 16 × 16 fp16 · fp16 + f32, subgroup scope,
// full 32-lane subgroups); without: the same staging, scales and order of steps with the products as
// FMA loops over the staged halves (the A tiles kept as lane l's elements l + 32·m, written to the
// warp's scratch before use), on any device: the kernel's data flow and rounding, for tests.
// Shared memory (uvec4 words): KS NT rows of ROWH halves; SP max(WARPS·HM·NT, WARPS·256)
// floats (the S partials, later the warps' scratch); PP HM rows of NT + 8 halves (P'); small arrays.
// Spec constants: 0 WG, 1 HD, 2 HT, 3 WINDOW, 4 RATE, 5 NT (a multiple of 16 and of 2·RT), 6 ROWS4.
// Push: as mqa_prefill.comp's.
#include "common.glsl"
#if defined(CM_NV)
#define UNROLL [[unroll]]
#else
#define UNROLL [[dont_unroll]]                       /* the twin's loops kept rolled: lavapipe's compile time */
#endif
#if defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
layout(constant_id = 1) const uint HD = 64;       // hd rounded up to 16·WARPS
layout(constant_id = 2) const uint HT = 1;        // head tiles of 16 a workgroup
layout(constant_id = 3) const uint WINDOW = 1;    // sliding_window
layout(constant_id = 4) const uint RATE = 1;      // the compression rate m (MODE_HCA)
layout(constant_id = 5) const uint NT = 16;       // keys staged a tile
layout(constant_id = 6) const bool ROWS4 = false; // hd, kv's and ent's offsets and row strides multiples of 4
layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer KV { float kv[]; };
layout(binding = 2) readonly buffer E { float ent[]; };
layout(binding = 1) readonly buffer KV4 { vec4 kv4[]; };
layout(binding = 2) readonly buffer E4 { vec4 ent4[]; };
layout(binding = 3) readonly buffer I { int idx[]; };
layout(binding = 4) readonly buffer Pos { int pos[]; };
layout(binding = 5) readonly buffer Sk { float sinks[]; };
layout(binding = 6) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, H, hd, capacity, n_ent, K;
    uint q_off, q_s0, q_s1;
    uint kv_rows, kv_off, kv_s0, e_off, e_s0, i_off, i_s0;
    uint o_off, o_s0, o_s1;
    uint pos_off, sink_off;
    float scale;
#if defined(Q_NORM)
    float q_eps;
    uint q_half, cos_off, sin_off, tab_s0;
#endif
} p;
#if defined(Q_NORM)
layout(binding = 7) readonly buffer Cos { float cos_t[]; };
layout(binding = 8) readonly buffer Sin { float sin_t[]; };
#include "rope.glsl"
#endif

const float LOWEST = -3.402823466e38;
const float LN2 = 0.6931471805599453;
const uint WG = gl_WorkGroupSize.x, WARPS = WG / 32u, HM = 16u * HT;
const uint CW = HD / WARPS, CT = CW / 16u;         // a warp's channels, and in 16-wide tiles
const uint NTN = NT / 16u;                          // key tiles of 16
const uint LR = WG / 16u, VX = HD / 4u / LR;        // staging: invocations a row, vec4s each a pass
const uint RT = WG / HM, KPT = NT / RT;             // softmax: invocations a head row, keys each
const uint ROWH = HD + 8u, ROW8 = ROWH / 8u;        // staged rows (halves, uvec4s)
const uint PS = NT + 8u;                            // P' rows (halves)
const uint KPW = (NT + WG - 1u) / WG;                // key slots an invocation prepares a tile
const uint KS8 = NT * ROW8;                         // staged rows (keys; q's 16 at a time at the start)
const uint SPF = WARPS * HM * NT > WARPS * 256u ? WARPS * HM * NT : WARPS * 256u;
const uint SP0 = KS8, PP0 = KS8 + SPF / 4u;         // regions (uvec4s)
shared uvec4 smem[KS8 + SPF / 4u + HM * PS / 8u];
shared uint kbase[2][NT], kflag[2][NT];             // row start; bit 0: a key, bit 1: raw (kv); by tile parity
shared int kshift[NT], qshift[HM], ra[HM];
shared uint kmx[NT], qmx[HM];
shared float rcorr[HM];
shared vec2 red[WG];

float pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23); }     // 2^e, −126 ≤ e ≤ 127
float finite_abs(float v) {                          // |v|, or 0 for inf / NaN
    float a = abs(v);
    return a <= uintBitsToFloat(0x7F7FFFFFu) ? a : 0.0;
}
float finite_max(vec4 v) { return max(max(finite_abs(v.x), finite_abs(v.y)), max(finite_abs(v.z), finite_abs(v.w))); }
int row_shift(float m) {                             // min(15 − e, 126), 2^(e−1) ≤ m < 2^e (m finite ≥ 0)
    return min(15 - (int(floatBitsToUint(m) >> 23) - 126), 126);
}
float times_pow2(float v, int s) {                   // v · 2^s, −381 ≤ s ≤ 381: three factors in range
    int a = s / 3, b = (s - a) / 2;
    return v * pow2(a) * pow2(b) * pow2(s - a - b);
}
float sp_get(uint f) { return uintBitsToFloat(smem[SP0 + f / 4u][f % 4u]); }
void sp_set(uint f, float v) { smem[SP0 + f / 4u][f % 4u] = floatBitsToUint(v); }
float half_at(uint h) { return unpackHalf2x16(smem[h / 8u][(h / 2u) % 4u])[h % 2u]; }   // halves from 0

// The 4 channels from c of the key row at b (zeros past hd).
vec4 load4(bool raw, uint b, uint c) {
    if (ROWS4) return c < p.hd ? (raw ? kv4[(b + c) / 4u] : ent4[(b + c) / 4u]) : vec4(0.0);
    vec4 v = vec4(0.0);
    [[unroll]] for (uint j = 0; j < 4; ++j)
        if (c + j < p.hd) v[j] = raw ? kv[b + c + j] : ent[b + c + j];
    return v;
}
// Halves c .. c + 3 of staging row r: v · f as fp16.
void stage4(uint r, uint c, vec4 v, float f) {
    uint h = r * ROWH + c;
    smem[h / 8u][(h / 2u) % 4u] = packHalf2x16(v.xy * f);
    smem[h / 8u][(h / 2u) % 4u + 1u] = packHalf2x16(v.zw * f);
}

// CSA: the entry of slot sk of the token's key list (idx), else 0.
int slot_entry(uint t, uint sk, uint n, uint n_raw) {
#if defined(MODE_CSA)
    if (sk < n && sk >= n_raw) return idx[p.i_off + t * p.i_s0 + (sk - n_raw)];
#endif
    return 0;
}
// Slot sk of the list (entry we for CSA) as row k of a tile: its row start and flags, into buffer buf.
void set_slot(uint buf, uint k, uint sk, int we, uint n, uint n_raw, uint j0) {
    uint b = 0u;
    bool ok = sk < n, raw = sk < n_raw;
    if (ok && raw) {
        b = p.kv_off + ((j0 + sk) % p.kv_rows) * p.kv_s0;
    } else if (ok) {
#if defined(MODE_CSA)
        ok = we >= 0 && uint(we) < p.n_ent;          // −1: no entry
        b = p.e_off + uint(max(we, 0)) * p.e_s0;
#else
        b = p.e_off + (sk - n_raw) * p.e_s0;
#endif
    }
    kbase[buf][k] = b;
    kflag[buf][k] = (ok ? 1u : 0u) | (raw ? 2u : 0u);
}

#if defined(CM_NV)
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#endif
void sync_warp() {                                   // the warp's scratch: its own lanes only
#if defined(CM_NV)
    subgroupMemoryBarrierShared();
    subgroupBarrier();
#else
    barrier();                                       // (a warp may span several subgroups here)
#endif
}

void main() {
    uint groups = (p.H + HM - 1u) / HM;
    uint g = flat_group();
    if (g >= p.T * groups) return;                   // the whole workgroup leaves together
    uint lid = gl_LocalInvocationID.x;
#if defined(CM_NV)
    uint w = gl_SubgroupID, lane = gl_SubgroupInvocationID;
#else
    uint w = lid / 32u, lane = lid % 32u;
#endif
    uint t = g / groups, h0 = (g % groups) * HM;
    int pp = pos[p.pos_off] + int(t);
    if (pp < 0 || uint(pp) >= p.capacity) {          // uniform per workgroup
        for (uint e = lid; e < HM * p.hd; e += WG) {
            uint h = h0 + e / p.hd;
            if (h < p.H) o[p.o_off + t * p.o_s0 + h * p.o_s1 + e % p.hd] = uintBitsToFloat(0x7FC00000u);
        }
        return;
    }
    uint sr = lid / LR, sc = lid % LR;               // staging: row of a pass, first vec4

    // q's rows: loaded (a partial last group's idle heads load head H − 1), normed and rotated, scaled
    for (uint r = lid; r < HM; r += WG) qmx[r] = 0u;
    barrier();
#if defined(CM_NV)
    MAT_A qa[HT * CT];
#else
    float qa[HT][CT][8];                             // lane l: elements l + 32·m of each A tile
#endif
    UNROLL for (uint ps = 0; ps < HT; ++ps) {
        uint i = 16u * ps + sr;
        uint qb = p.q_off + t * p.q_s0 + min(h0 + i, p.H - 1u) * p.q_s1;
        vec4 v[VX];
        UNROLL for (uint x = 0; x < VX; ++x) {
            uint c = 4u * (sc + LR * x);
            v[x] = vec4(0.0);
            [[unroll]] for (uint j = 0; j < 4; ++j)
                if (c + j < p.hd) v[x][j] = q[qb + c + j];
        }
#if defined(Q_NORM)
        float ss = 0.0;
        UNROLL for (uint x = 0; x < VX; ++x) ss += dot(v[x], v[x]);
        red[lid].x = ss;
        barrier();
        ss = 0.0;
        for (uint j = 0; j < LR; ++j) ss += red[sr * LR + j].x;
        float rn = 1.0 / sqrt(ss / float(p.hd) + p.q_eps);
        uint first = p.hd - 2u * p.q_half;
        UNROLL for (uint x = 0; x < VX; ++x) {
            uint c = 4u * (sc + LR * x);
            vec4 a = v[x] * rn, b = a;
            [[unroll]] for (uint j = 0; j < 4; ++j)
                if (c + j < p.hd)
                    b[j] = rope_channel(a[j], a[j ^ 1u], c + j, first, pp, p.capacity, p.cos_off, p.sin_off,
                                        p.tab_s0, false);
            v[x] = b;
        }
        barrier();                                   // (red read)
#endif
        float m = 0.0;
        UNROLL for (uint x = 0; x < VX; ++x) {
            v[x] *= p.scale;
            m = max(m, finite_max(v[x]));
        }
        atomicMax(qmx[i], floatBitsToUint(m));
        barrier();
        int s = row_shift(uintBitsToFloat(qmx[i]));
        if (sc == 0u) qshift[i] = s;
        UNROLL for (uint x = 0; x < VX; ++x) stage4(sr, 4u * (sc + LR * x), v[x], pow2(s));
        barrier();
        // head tile ps's A tiles from staging rows 0..15
#if defined(CM_NV)
        [[unroll]] for (uint ct = 0; ct < CT; ++ct)
            coopMatLoadNV(qa[ps * CT + ct], smem, (w * CW + 16u * ct) / 8u, ROW8, false);
#else
        for (uint ct = 0; ct < CT; ++ct)
            for (uint m = 0; m < 8u; ++m) {
                uint e = lane + 32u * m;
                qa[ps][ct][m] = half_at((e / 16u) * ROWH + w * CW + 16u * ct + e % 16u);
            }
#endif
        barrier();                                   // (staging rows read before the next pass)
    }
    float acc[HT][CT][8];                            // O: lane l's elements l + 32·m of each tile
    UNROLL for (uint ht = 0; ht < HT; ++ht)           // (unrolled with -D CM_NV: acc stays in registers)
        UNROLL for (uint ct = 0; ct < CT; ++ct)
            UNROLL for (uint m = 0; m < 8u; ++m) acc[ht][ct][m] = 0.0;
    uint si = lid / RT, part = lid % RT;             // softmax: head row, part of the tile's keys
    float mx = sinks[p.sink_off + min(h0 + si, p.H - 1u)];   // the sink: logit only, no value
    float lp = part == 0u ? 1.0 : 0.0;

    uint j0 = uint(max(pp - int(WINDOW) + 1, 0));    // the raw window: n_raw rows from j0
    uint n_raw = uint(pp) + 1u - j0, n = n_raw;
#if defined(MODE_HCA)
    n += min((uint(pp) + 1u) / RATE, p.n_ent);
#elif defined(MODE_CSA)
    n += p.K;
#endif
    // 1. the first tile's slots (each tile's slots are written during the one before it, buffer
    // (tile index) % 2, so that CSA's idx loads wait behind a tile's products, not before its staging)
    for (uint x = 0; x < KPW; ++x) {
        uint k = lid + WG * x;
        if (k < NT) set_slot(0u, k, k, slot_entry(t, k, n, n_raw), n, n_raw, j0);
    }
    for (uint r = lid; r < NT; r += WG) kmx[r] = 0u;
    for (uint s0 = 0; s0 < n; s0 += NT) {           // uniform per workgroup
        uint cb = (s0 / NT) & 1u;                    // this tile's slot buffer
        barrier();                                   // the previous tile's readers are done
        int nxt[KPW];                                // the next tile's CSA entries, in flight
        for (uint x = 0; x < KPW; ++x) nxt[x] = slot_entry(t, s0 + NT + lid + WG * x, n, n_raw);
        bool any = false;                            // (CSA: a tile of −1 slots only is skipped)
        for (uint k = 0; k < NT; ++k) any = any || (kflag[cb][k] & 1u) != 0u;
        if (!any) {                                  // uniform: every lane read the same flags
            for (uint x = 0; x < KPW; ++x) {
                uint k = lid + WG * x;
                if (k < NT) set_slot(cb ^ 1u, k, s0 + NT + k, nxt[x], n, n_raw, j0);
            }
            continue;
        }
        // 2. the key rows, 16 at a time, as fp16 rows at their shifts
        UNROLL for (uint ps = 0; ps < NTN; ++ps) {
            uint k = 16u * ps + sr;
            bool ok = (kflag[cb][k] & 1u) != 0u, raw = (kflag[cb][k] & 2u) != 0u;
            vec4 v[VX];
            UNROLL for (uint x = 0; x < VX; ++x) v[x] = ok ? load4(raw, kbase[cb][k], 4u * (sc + LR * x)) : vec4(0.0);
            float m = 0.0;
            UNROLL for (uint x = 0; x < VX; ++x) m = max(m, finite_max(v[x]));
            atomicMax(kmx[k], floatBitsToUint(m));
            barrier();
            int s = row_shift(uintBitsToFloat(kmx[k]));
            if (sc == 0u) kshift[k] = s;
            UNROLL for (uint x = 0; x < VX; ++x) stage4(k, 4u * (sc + LR * x), v[x], pow2(s));
        }
        barrier();
        // 3. S = Q·Kᵀ over this warp's channels, into SP[w]
#if defined(CM_NV)
        [[unroll]] for (uint ht = 0; ht < HT; ++ht)
            [[unroll]] for (uint nt = 0; nt < NTN; ++nt) {
                MAT_C sa = MAT_C(0.0);
                [[unroll]] for (uint ct = 0; ct < CT; ++ct) {
                    MAT_A b;                         // column-major: B(c, j) at key row j, channel c
                    coopMatLoadNV(b, smem, (16u * nt * ROWH + w * CW + 16u * ct) / 8u, ROW8, true);
                    sa = coopMatMulAddNV(qa[ht * CT + ct], b, sa);
                }
                coopMatStoreNV(sa, smem, SP0 + ((w * HM + 16u * ht) * NT + 16u * nt) / 4u, NT / 4u, false);
            }
#else
        {
            float sa[HT][NTN][8];
            for (uint ht = 0; ht < HT; ++ht) for (uint nt = 0; nt < NTN; ++nt)
                for (uint m = 0; m < 8u; ++m) sa[ht][nt][m] = 0.0;
            uint scr = w * 256u;                     // this warp's scratch (floats of SP)
            [[dont_unroll]] for (uint ct = 0; ct < CT; ++ct)
                [[dont_unroll]] for (uint ht = 0; ht < HT; ++ht) {
                    for (uint m = 0; m < 8u; ++m) sp_set(scr + lane + 32u * m, qa[ht][ct][m]);
                    sync_warp();
                    for (uint nt = 0; nt < NTN; ++nt)
                        for (uint m = 0; m < 8u; ++m) {
                            uint e = lane + 32u * m, r = e / 16u, col = e % 16u;
                            uint kb = (16u * nt + col) * ROWH + w * CW + 16u * ct;
                            float sum = sa[ht][nt][m];
                            for (uint c = 0; c < 16u; ++c) sum = fma(sp_get(scr + 16u * r + c), half_at(kb + c), sum);
                            sa[ht][nt][m] = sum;
                        }
                    sync_warp();
                }
            for (uint ht = 0; ht < HT; ++ht) for (uint nt = 0; nt < NTN; ++nt)
                for (uint m = 0; m < 8u; ++m) {
                    uint e = lane + 32u * m;
                    sp_set((w * HM + 16u * ht + e / 16u) * NT + 16u * nt + e % 16u, sa[ht][nt][m]);
                }
        }
#endif
        // the next tile's slots (buffer cb ^ 1: the previous tile's, read before this one began) and
        // its rows' maxima cleared (this tile's were read in step 2)
        for (uint x = 0; x < KPW; ++x) {
            uint k = lid + WG * x;
            if (k < NT) set_slot(cb ^ 1u, k, s0 + NT + k, nxt[x], n, n_raw, j0);
        }
        for (uint r = lid; r < NT; r += WG) kmx[r] = 0u;
        barrier();
        // 4. the online softmax: row si, keys part·KPT ..
        {
            float sv[KPT];
            float tm = LOWEST, um = LOWEST;
            UNROLL for (uint x = 0; x < KPT; ++x) {
                uint j = part * KPT + x;
                float s = 0.0;
                UNROLL for (uint ww = 0; ww < WARPS; ++ww) s += sp_get((ww * HM + si) * NT + j);
                s = times_pow2(s, -(qshift[si] + kshift[j]));
                sv[x] = s;
                if ((kflag[cb][j] & 1u) != 0u) {
                    tm = max(tm, s);
                    um = max(um, s - float(kshift[j]) * LN2);
                }
            }
            red[lid] = vec2(tm, um);
            barrier();
            for (uint q2 = 0; q2 < RT; ++q2) {
                vec2 r2 = red[si * RT + q2];
                tm = max(tm, r2.x);
                um = max(um, r2.y);
            }
            float mn = max(mx, tm), corr = exp(mx - mn);
            int a = row_shift(finite_abs(exp(um - mn)));
            lp *= corr;
            float pv[KPT];
            UNROLL for (uint x = 0; x < KPT; ++x) {
                uint j = part * KPT + x;
                float e = (kflag[cb][j] & 1u) != 0u ? exp(sv[x] - mn) : 0.0;
                lp += e;
                pv[x] = times_pow2(e, a - kshift[j]);
            }
            UNROLL for (uint x = 0; x < KPT; x += 2u) {
                uint h = PP0 * 8u + si * PS + part * KPT + x;
                smem[h / 8u][(h / 2u) % 4u] = packHalf2x16(vec2(pv[x], pv[x + 1u]));
            }
            if (part == 0u) {
                rcorr[si] = corr;
                ra[si] = a;
            }
            mx = mn;
        }
        barrier();
        // 5. O += P·V over this warp's channels
        UNROLL for (uint ht = 0; ht < HT; ++ht) {
#if defined(CM_NV)
            MAT_A pt[NTN];                           // the head tile's P' tiles, read once for every ct
            [[unroll]] for (uint kt = 0; kt < NTN; ++kt)
                coopMatLoadNV(pt[kt], smem, PP0 + (16u * ht * PS + 16u * kt) / 8u, PS / 8u, false);
#endif
            UNROLL for (uint ct = 0; ct < CT; ++ct) {
#if defined(CM_NV)
                MAT_C pa = MAT_C(0.0);
                [[unroll]] for (uint kt = 0; kt < NTN; ++kt) {
                    MAT_A b;
                    coopMatLoadNV(b, smem, (16u * kt * ROWH + w * CW + 16u * ct) / 8u, ROW8, false);
                    pa = coopMatMulAddNV(pt[kt], b, pa);
                }
                uint scr = SP0 + w * 64u;            // the warp's 16 × 16 f32 scratch (uvec4s)
                coopMatStoreNV(pa, smem, scr, 4u, false);
                sync_warp();
                [[unroll]] for (uint m = 0; m < 8u; ++m) {
                    uint e = lane + 32u * m, i = 16u * ht + e / 16u;
                    float c = uintBitsToFloat(smem[scr + e / 4u][e % 4u]);
                    acc[ht][ct][m] = acc[ht][ct][m] * rcorr[i] + c * pow2(-ra[i]);
                }
                sync_warp();
#else
                for (uint m = 0; m < 8u; ++m) {
                    uint e = lane + 32u * m, r = e / 16u, col = e % 16u, i = 16u * ht + r;
                    float sum = 0.0;
                    for (uint kk = 0; kk < NT; ++kk)
                        sum = fma(half_at(PP0 * 8u + i * PS + kk), half_at(kk * ROWH + w * CW + 16u * ct + col), sum);
                    acc[ht][ct][m] = acc[ht][ct][m] * rcorr[i] + sum * pow2(-ra[i]);
                }
#endif
            }
        }
    }
    barrier();
    red[lid].x = lp;
    barrier();
    UNROLL for (uint ht = 0; ht < HT; ++ht)
        UNROLL for (uint ct = 0; ct < CT; ++ct)
            UNROLL for (uint m = 0; m < 8u; ++m) {
                uint e = lane + 32u * m, i = 16u * ht + e / 16u, ch = w * CW + 16u * ct + e % 16u;
                uint h = h0 + i;
                if (h >= p.H || ch >= p.hd) continue;
                float l = 0.0;
                for (uint q2 = 0; q2 < RT; ++q2) l += red[i * RT + q2].x;
                o[p.o_off + t * p.o_s0 + h * p.o_s1 + ch] = acc[ht][ct][m] / l;
            }
}
