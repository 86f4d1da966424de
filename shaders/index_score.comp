#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS
//! variants: LANES_SHUFFLE SCATTER | LANES_SUBGROUP_OPS SCATTER
//! variants: LANE_ENTRY
#if defined(SCATTER)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// INDEX_SCORE: the lightning indexer's scores of chunk token t (position p = pos[0] + t) against
// the compressed index keys k [n, hd]:
//   score[t, w] = scale · Σ_h wt[t, h] · ReLU(q[t, h]·k[w])    for w < min((p + 1)/RATE, n) (closed windows)
// and nothing else: entries at or past the row's bound (and rows at a position outside [0, capacity))
// are not written — TOPK reads only below the same bound — and workgroups wholly past it leave at
// once, so the work follows the closed windows, not the cache's capacity n.
// Lanes: `groups` workgroups per row (grid T × groups), each taking blocks of WG / LANES entries,
// block g, g + groups, ... below the bound (groups: enough for the capacity, at most the host's
// cap per row, so that neither empty workgroups nor their launches scale with the capacity);
// one cluster of LANES lanes (lanes.glsl) per (t, w); lane l takes channels l, l + LANES,
// ... (PER_LANE of them, the key's kept in registers for every head); one cluster sum per head,
// HEADS heads at a time (their loads and sums issued together, then added in head order: the
// same arithmetic as one head at a time). -D SCATTER (subgroup shuffles, LANES ≤ 32, its array of literal size 32): LANES heads a
// step, each lane's parts of their dot products reduced by a transposing butterfly that leaves head
// h0 + lane's whole dot in lane `lane` (LANES − 1 shuffles per lane for LANES heads, where cluster sums
// take log2(LANES) per head, which were half the kernel's time on the H200), the
// lane's ReLU-weighted heads summed, then one cluster sum. Spec constants: 0 workgroup size, 1 RATE, 2 PER_LANE
// (ceil(hd / LANES)), 3 HEADS. Push: T, nh, hd, n, capacity, q (off, s0, s1), wt (off, s0),
// k (off, s0), out (off, s0), pos_off, scale, groups.
// -D LANE_ENTRY (GPUs; hd % 4 == 0 and q, k rows 16-byte aligned): the cluster kernels read all of
// q (nh·hd floats) from cache for every entry, 64× the entry's own key bytes at V4's widths, which
// bounds them by the cache's bandwidth. Here each workgroup stages row t's q (NH·HD4 vec4s, spec
// constants 4 and 5: nh and hd / 4) and wt once in shared memory, and each invocation takes one
// entry: it reads the key 32 channels a step (a 128-byte line) and adds each head's part of the dot
// product in registers (NH sums), every q vec4 a broadcast shared load serving 4 products; then
// scale·Σ_h wt·ReLU(dot). No reduction across lanes. The sums run in channel order per head.
#include "lanes.glsl"
layout(constant_id = 1) const uint RATE = 4;     // the compression rate m
layout(constant_id = 2) const uint PER_LANE = 1;
layout(constant_id = 3) const uint HEADS = 1;
layout(constant_id = 4) const uint NH = 1;       // LANE_ENTRY: heads (nh)
layout(constant_id = 5) const uint HD4 = 1;      // LANE_ENTRY: hd / 4
layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer Wt { float wt[]; };
layout(binding = 2) readonly buffer K { float k[]; };
#if defined(LANE_ENTRY)
layout(binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(binding = 2) readonly buffer K4 { vec4 k4[]; };
shared vec4 qs[NH * HD4];
shared float ws[NH];
#endif
layout(binding = 3) readonly buffer Pos { int pos[]; };
layout(binding = 4) writeonly buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, nh, hd, n, capacity;
    uint q_off, q_s0, q_s1, w_off, w_s0, k_off, k_s0, o_off, o_s0;
    uint pos_off;
    float scale;
    uint groups;
} p;

#if defined(LANE_ENTRY)
const uint KV = 8u;                                     // vec4s of the key a step: a 128-byte line
void main() {
    uint wg = gl_WorkGroupSize.x, lid = gl_LocalInvocationID.x;
    uint t = flat_group() / p.groups, g = flat_group() % p.groups;
    if (t >= p.T) return;
    int pp = pos[p.pos_off] + int(t);
    uint bound = pp >= 0 && uint(pp) < p.capacity ? min((uint(pp) + 1u) / RATE, p.n) : 0u;
    if (g * wg >= bound) return;                        // uniform per workgroup: nothing below the bound
    for (uint i = lid; i < NH * HD4; i += wg)
        qs[i] = q4[(p.q_off + t * p.q_s0 + (i / HD4) * p.q_s1) / 4u + i % HD4];
    for (uint h = lid; h < NH; h += wg) ws[h] = wt[p.w_off + t * p.w_s0 + h];
    barrier();
    for (uint w0 = g * wg; w0 < bound; w0 += p.groups * wg) {
        uint w = w0 + lid;
        if (w >= bound) break;
        uint kb = (p.k_off + w * p.k_s0) / 4u;
        float part[NH];
        [[unroll]] for (uint h = 0; h < NH; ++h) part[h] = 0.0;
        for (uint c = 0; c < HD4; c += KV) {
            vec4 kv[KV];
            [[unroll]] for (uint i = 0; i < KV; ++i) kv[i] = c + i < HD4 ? k4[kb + c + i] : vec4(0.0);
            [[unroll]] for (uint h = 0; h < NH; ++h) {
                float a = part[h];
                [[unroll]] for (uint i = 0; i < KV; ++i) {
                    if (c + i < HD4) {
                        vec4 qv = qs[h * HD4 + c + i];
                        a = fma(qv.w, kv[i].w, fma(qv.z, kv[i].z, fma(qv.y, kv[i].y, fma(qv.x, kv[i].x, a))));
                    }
                }
                part[h] = a;
            }
        }
        float s = 0.0;
        [[unroll]] for (uint h = 0; h < NH; ++h) s += ws[h] * max(part[h], 0.0);
        o[p.o_off + t * p.o_s0 + w] = s * p.scale;
    }
}
#else
void main() {
    uint per_group = gl_WorkGroupSize.x / LANES;        // clusters (entries) per block
    uint t = flat_group() / p.groups, g = flat_group() % p.groups;
    if (t >= p.T) return;
    int pp = pos[p.pos_off] + int(t);
    uint bound = pp >= 0 && uint(pp) < p.capacity ? min((uint(pp) + 1u) / RATE, p.n) : 0u;
    uint lane = cluster_lane();
    for (uint w0 = g * per_group; w0 < bound; w0 += p.groups * per_group) {    // uniform per workgroup
        uint w = w0 + lane_linear() / LANES;
        if (w >= bound) break;                          // whole cluster leaves together
        float s = 0.0;
        uint kb = p.k_off + w * p.k_s0;
        float kr[PER_LANE];
        [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
            uint c = lane + LANES * m;
            kr[m] = c < p.hd ? k[kb + c] : 0.0;
        }
#if defined(SCATTER)
        for (uint h0 = 0; h0 < p.nh; h0 += LANES) {
            float d[32];                    // LANES ≤ 32 heads: a literal size keeps d in registers
            [[unroll]] for (uint j = 0; j < LANES; ++j) {
                uint qb = p.q_off + t * p.q_s0 + min(h0 + j, p.nh - 1u) * p.q_s1;
                d[j] = 0.0;
                [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
                    uint c = lane + LANES * m;
                    if (c < p.hd) d[j] += q[qb + c] * kr[m];
                }
            }
            // halve the heads at each lane bit m: the lane keeps the half its bit selects and adds the
            // partner's copy of it; after the last step d[0] is head h0 + lane summed over the cluster
            [[unroll]] for (uint m = LANES / 2u; m >= 1u; m >>= 1u) {
                bool up = (lane & m) != 0u;
                [[unroll]] for (uint i = 0u; i < m; ++i) {
                    float send = up ? d[i] : d[i + m];
                    d[i] = (up ? d[i + m] : d[i]) + subgroupShuffleXor(send, m);
                }
            }
            if (h0 + lane < p.nh) s += wt[p.w_off + t * p.w_s0 + h0 + lane] * max(d[0], 0.0);
        }
        s = cluster_sum(s);
#else
        for (uint h0 = 0; h0 < p.nh; h0 += HEADS) {
            float d[HEADS];
            [[unroll]] for (uint j = 0; j < HEADS; ++j) {
                uint qb = p.q_off + t * p.q_s0 + min(h0 + j, p.nh - 1u) * p.q_s1;
                d[j] = 0.0;
                [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
                    uint c = lane + LANES * m;
                    if (c < p.hd) d[j] += q[qb + c] * kr[m];
                }
            }
            [[unroll]] for (uint j = 0; j < HEADS; ++j) d[j] = cluster_sum(d[j]);   // every lane, every j
            [[unroll]] for (uint j = 0; j < HEADS; ++j)
                if (h0 + j < p.nh) s += wt[p.w_off + t * p.w_s0 + h0 + j] * max(d[j], 0.0);
        }
#endif
        s *= p.scale;
        if (lane == 0) o[p.o_off + t * p.o_s0 + w] = s;
    }
}
#endif
