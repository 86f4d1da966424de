#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: SCORE_SQRTSOFTPLUS | SCORE_SIGMOID | SCORE_SOFTMAX ; - | HASH ; - | W_BF16 | W_F16 ; - | NORM_X
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// V4_GATE: DeepSeek-V4's router at one token in one dispatch: the gate's logits
// lg = (x / rms(x) ⊙ g) · wᵀ (-D NORM_X; without it x · wᵀ), then V4_ROUTE's selection on them
// (v4_route.glsl: the one-pass ranking over score + bias, or with -D HASH the hash table's picks)
// and the same routes [1, TOP_K + 1, 2], the shared expert (id E, weight 1) last.
// Layout: workgroup i computes logits NR·i .. NR·i + NR − 1 (rows past E clamped for loading, not
// stored): lane l takes the vec4s l, l + WG, ... of x (with g, and Σx² beside the sums) and of its
// NR weight rows (weights.glsl: f32, -D W_BF16 or -D W_F16, widened to f32; f32 accumulation),
// UNROLL of them loaded together; the NR sums and Σx² meet in one workgroup reduction
// (wg_reduce.glsl), the logits go to the coherent scratch lgs, and the workgroup that finishes
// last (last_group.glsl: a ticket counter that resets itself) reads all E of them and routes:
// without HASH every invocation ranks its expert (one per invocation: the host keeps E ≤ WG ≤ 256),
// with HASH invocation 0 reads the table (softmax's max and Σexp are workgroup reductions first).
// Needs K % 4 == 0 and x, w rows and g 16-byte aligned (vec4 loads; the host checks).
// Bindings: 0 x, 1 w, 2 bias | 2 tid2eid, 3 ids, then o (the routes), lgs (the logits scratch), the
// counters, g (NORM_X).
// Spec constants: 0 workgroup size WG, 1 TOP_K, 2 NR (rows a workgroup, ≤ 8), 3 UNROLL. Push: D,
// E, x_off, w_off, w_s0 (a row's stride), g_off, eps, sel_off (bias or tid2eid offset), tid_s0,
// ids_off, out (o_off, o_s0, o_s1, o_s2), route_scale, groups (workgroups: ceil(E / NR)), lg_off.
#define VEC4 1
#if !defined(HASH)
#define RANK 1
#endif
#include "common.glsl"
layout(constant_id = 1) const uint TOP_K = 1;
layout(constant_id = 2) const uint NR = 1;
layout(constant_id = 3) const uint UNROLL = 1;
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
#if defined(HASH)
layout(binding = 2) readonly buffer Tid { int tid[]; };
layout(binding = 3) readonly buffer Ids { int ids[]; };
#define B_OUT 4
#else
layout(binding = 2) readonly buffer B { float bias[]; };
#define B_OUT 3
#endif
layout(binding = B_OUT) writeonly buffer O { float o[]; };
layout(binding = B_OUT + 1) coherent buffer Lg { float lgs[]; };
#define LG_BINDING (B_OUT + 2)
#if defined(NORM_X)
layout(binding = B_OUT + 3) readonly buffer G4 { vec4 g4[]; };
#endif
layout(push_constant) uniform P {
    uint D, E, x_off, w_off, w_s0, g_off;
    float eps;
    uint sel_off, tid_s0, ids_off, o_off, o_s0, o_s1, o_s2;
    float route_scale;
    uint groups, lg_off;
} p;
#define W_S3 1u
#include "weights.glsl"
#define WG_NV (NR + 1u)
#define WG_NV_MAX 9
#include "wg_reduce.glsl"
#include "last_group.glsl"
#define ROUTE_LOGIT(t, e) lgs[p.lg_off + (e)]
#include "v4_route.glsl"

void main() {
    uint gi = flat_group();
    if (gi >= p.groups) return;                 // uniform per workgroup (a grid folded into y)
    uint lid = gl_LocalInvocationID.x, KV = p.D / 4u, row0 = gi * NR;
    uint wb[NR];
    float acc[NR];
    [[unroll]] for (uint i = 0u; i < NR; ++i) {
        wb[i] = p.w_off + min(row0 + i, p.E - 1u) * p.w_s0;
        acc[i] = 0.0;
    }
    float ss = 0.0;
    for (uint j0 = lid; j0 < KV; j0 += gl_WorkGroupSize.x * UNROLL) {
        vec4 wv[UNROLL][NR], xv[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {      // every load of the step issued first
            uint j = min(j0 + u * gl_WorkGroupSize.x, KV - 1u);
            xv[u] = x4[p.x_off / 4u + j];
            [[unroll]] for (uint i = 0u; i < NR; ++i) wv[u][i] = W4_ROW(wb[i], j);
        }
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
            uint j = j0 + u * gl_WorkGroupSize.x;
            if (j < KV) {
                vec4 v = xv[u];
#if defined(NORM_X)
                ss += dot(v, v);
                v *= g4[p.g_off / 4u + j];
#endif
                [[unroll]] for (uint i = 0u; i < NR; ++i) acc[i] += dot(v, wv[u][i]);
            }
        }
    }
    [[unroll]] for (uint i = 0u; i < NR; ++i) wg_put(i, acc[i]);
    wg_put(NR, ss);
    barrier();
    if (lid < NR && row0 + lid < p.E) {
        float s = wg_total(lid);
#if defined(NORM_X)
        s = s / sqrt(wg_total(NR) / float(p.D) + p.eps);     // as MUL_MAT's folded norm
#endif
        lgs[p.lg_off + row0 + lid] = s;
    }
    if (!last_group(0u, p.groups)) return;
    // the last workgroup: every logit is stored and visible; V4_ROUTE's selection on them
    float mx = -3.402823466e38, den = 1.0;
#if defined(SCORE_SOFTMAX)
    softmax_stats(0u, mx, den);
#endif
#if defined(RANK)
    rank_select(0u, mx, den);
#endif
    if (lid != 0u) return;
    [[unroll]] for (uint r = 0u; r < TOP_K; ++r) {
#if defined(HASH)
        route_pick[r] = hash_pick(0u, r);
#else
        route_pick[r] = picks[r];
#endif
    }
    store_routes(0u, mx, den);
}
