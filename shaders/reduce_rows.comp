#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; OP_SUM_ROWS | OP_RMS_NORM | OP_RMS_NORM HAS_WEIGHT | OP_RMS_NORM ROPE | OP_RMS_NORM HAS_WEIGHT ROPE | OP_RMS_NORM HAS_WEIGHT ROPE RING | OP_RMS_NORM ROPE RING
//! variants: LANES_WORKGROUP ; OP_SUM_ROWS | OP_RMS_NORM | OP_RMS_NORM HAS_WEIGHT | OP_RMS_NORM ROPE | OP_RMS_NORM HAS_WEIGHT ROPE | OP_RMS_NORM HAS_WEIGHT ROPE RING | OP_RMS_NORM ROPE RING
// Reductions over the last axis of a 4-D strided view x[ne0, ne1, ne2, ne3] (rows of ne3 values).
// Variants (-D): OP_SUM_ROWS   d[r, 0] = Σ_j x[r, j]
//                OP_RMS_NORM   d[r, j] = x[r, j] / sqrt(Σ_j x[r, j]² / ne3 + eps) (· w[j] with HAS_WEIGHT)
//                ROPE          (with OP_RMS_NORM) then the trailing 2·half columns rotated by
//                              interleaved pairs (j, j+1) at position pos[0] + row / rows_per_token
//                              (tables cos/sin [capacity, half]; rope.comp's rotation; a position
//                              outside [0, capacity) gives NaN there): q's and kv's RMS_NORM → ROPE
//                              in one dispatch. A lane reads its column's partner back from memory
//                              (the row is in cache), so any lane layout works.
//                RING          (with ROPE, x [T, n]) row t is stored at row (pos[0] + t) % ring_rows
//                              of d [ring_rows, n] if its position is in [0, capacity), else not at
//                              all: STORE_ROWS of the result in the same dispatch (kv's norm, RoPE
//                              and cache write).
// Layout: one cluster of LANES lanes per row (lanes.glsl; -D LANES_WORKGROUP: the whole workgroup,
// for few long rows); lane l takes columns l, l+LANES, ...
// so neighbouring lanes read neighbouring elements. Accumulation in f32.
#include "lanes.glsl"
const uint RMS_CACHE = 16u;     // values a lane keeps in registers (OP_RMS_NORM)
layout(binding = 0) readonly buffer X { float x[]; };
#if defined(HAS_WEIGHT)
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) buffer D { float d[]; };
#define ROPE_BINDING 3
#else
layout(binding = 1) buffer D { float d[]; };
#define ROPE_BINDING 2
#endif
#if defined(ROPE)
layout(binding = ROPE_BINDING) readonly buffer Pos { int pos[]; };
layout(binding = ROPE_BINDING + 1) readonly buffer Cos { float cos_t[]; };
layout(binding = ROPE_BINDING + 2) readonly buffer Sin { float sin_t[]; };
#endif
layout(push_constant) uniform P {
    uint ne0, ne1, ne2, ne3;
    uint x_off, x_s0, x_s1, x_s2, x_s3;
    uint d_off, d_s0, d_s1, d_s2, d_s3;
    float eps;
    uint w_off, w_s;
#if defined(ROPE)
    uint rows_per_token, half_rd, capacity, pos_off, cos_off, sin_off, tab_s0;
#endif
#if defined(RING)
    uint ring_rows;
#endif
} p;

#if defined(ROPE)
#include "rope.glsl"
#endif

#if defined(OP_RMS_NORM)
float weight(uint j) {
#if defined(HAS_WEIGHT)
    return w[p.w_off + j * p.w_s];
#else
    return 1.0;
#endif
}

// Writes column j of the normalised row (value v = x·r·w there), rotated where ROPE asks.
void put(uint xb, uint db, uint j, float v, float r, int pp) {
#if defined(ROPE)
    uint first = p.ne3 - 2u * p.half_rd;                // even: pairs (even, odd)
    if (j >= first) {
        uint jp = j ^ 1u;
        v = rope_channel(v, x[xb + jp * p.x_s3] * r * weight(jp), j, first, pp, p.capacity, p.cos_off, p.sin_off,
                         p.tab_s0, false);
    }
#endif
    d[db + j * p.d_s3] = v;
}
#endif

void main() {
    uint row = cluster_id();
    if (row >= p.ne0 * p.ne1 * p.ne2) return;           // whole cluster leaves together
    uint lane = cluster_lane();
    uvec4 c = uvec4(unravel4(row, 1, p.ne0, p.ne1, p.ne2).yzw, 0);
    uint xb = at4(c, p.x_off, p.x_s0, p.x_s1, p.x_s2, 0);
    uint db = at4(c, p.d_off, p.d_s0, p.d_s1, p.d_s2, 0);
#if defined(OP_SUM_ROWS)
    float acc = 0.0;
    for (uint j = lane; j < p.ne3; j += LANES) acc += x[xb + j * p.x_s3];
    acc = cluster_sum(acc);
    if (lane == 0) d[db] = acc;
#elif defined(OP_RMS_NORM)
    // A lane's first CACHE values (and weights) are loaded once, before the reduction, and kept in
    // registers: the weights' memory latency overlaps the sum instead of following it, and x is not
    // read twice (a row of D = 4096 on a workgroup of 256 is 16 values a lane). Values past the
    // cache take the loops below. Same sums in the same order as without the cache.
    float xc[RMS_CACHE];
#if defined(HAS_WEIGHT)
    float wc[RMS_CACHE];
#endif
    float acc = 0.0;
    [[unroll]] for (uint k = 0u; k < RMS_CACHE; ++k) {
        uint j = lane + k * LANES;
        float v = j < p.ne3 ? x[xb + j * p.x_s3] : 0.0;
        xc[k] = v;
        acc += v * v;
#if defined(HAS_WEIGHT)
        wc[k] = j < p.ne3 ? w[p.w_off + j * p.w_s] : 0.0;
#endif
    }
    for (uint j = lane + RMS_CACHE * LANES; j < p.ne3; j += LANES) { float v = x[xb + j * p.x_s3]; acc += v * v; }
    float r = 1.0 / sqrt(cluster_sum(acc) / float(p.ne3) + p.eps);
#if defined(ROPE)
    int pp = pos[p.pos_off] + int(row / p.rows_per_token);
#else
    int pp = 0;
#endif
#if defined(RING)
    if (pp < 0 || uint(pp) >= p.capacity) return;        // (uniform per cluster, after its last sum)
    db = p.d_off + (uint(pp) % p.ring_rows) * p.d_s2;
#endif
    [[unroll]] for (uint k = 0u; k < RMS_CACHE; ++k) {
        uint j = lane + k * LANES;
        if (j >= p.ne3) break;
#if defined(HAS_WEIGHT)
        put(xb, db, j, xc[k] * r * wc[k], r, pp);
#else
        put(xb, db, j, xc[k] * r, r, pp);
#endif
    }
    for (uint j = lane + RMS_CACHE * LANES; j < p.ne3; j += LANES)
        put(xb, db, j, x[xb + j * p.x_s3] * r * weight(j), r, pp);
#else
#error "define OP_SUM_ROWS or OP_RMS_NORM"
#endif
}
