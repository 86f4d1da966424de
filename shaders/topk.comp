#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | PART | MERGE
// TOPK: idx[t, r] = the entry of rank r among the selectable scores of row t, r < K; slots past
// the number of selectable scores get −1. Order: descending score, ties to the lower index (the
// order of torch.topk over the indexer's scores in transformers, model.reference.index_topk).
// Selectable: finite, and inside the row's bound v(t) — with a position buffer (has_pos) the
// indexer's causal bound v = min((p + 1) / rate, n) for p = pos[0] + t in [0, capacity), else 0;
// without, v = n. NaN and ±inf rank after every finite score and are never selected. Nothing at
// or past v(t) is read, so the cost follows the entries that exist, not n (the cache's capacity).
//
// Selection: every score becomes a 64-bit key (order-preserving bits of the score, then the
// complemented index: ties to the lower index), 0 for a non-selectable one; a radix select (8 bits
// a pass, a 256-bin histogram in shared memory, at most 8 passes, stopping at the pass whose bin
// holds exactly the keys still needed) finds the K-th largest key, and the keys at or above it
// are the top K. Keys are unique, so the result does not depend on the order of the lists.
// Variants (one workgroup of WG ≤ 256 invocations each; bins looped when WG < 256):
//   -      one workgroup per row selects from the row's scores and writes idx, sorted (each
//          selected key's rank is the count of selected keys above it, read from shared memory);
//   PART   `groups` workgroups per row, each taking tiles of TILE entries g, g + groups, ... below
//          v(t): a tile's top K keys, unordered, into cand[t, tile] = [count, (key hi, key lo) ×
//          count]; tiles at or past v(t) are neither read nor written;
//   MERGE  one workgroup per row: the top K of the candidates of the row's tiles below v(t),
//          written as the plain variant writes them.
// Spec constants: 0 workgroup size, 1 K (shared memory holds 2·K keys' words), 2 TILE.
// Push: T, n, K, tiles, groups, rate, capacity, has_pos, s (off, s0), pos_off, cand (off, s0), idx (off, s0).
#include "common.glsl"
layout(constant_id = 1) const uint KCAP = 1;
layout(constant_id = 2) const uint TILE = 4096;
layout(binding = 0) readonly buffer S { float sc[]; };
layout(binding = 1) readonly buffer Pos { int pos[]; };
#if defined(PART)
layout(binding = 2) writeonly buffer C { uint cand[]; };
#elif defined(MERGE)
layout(binding = 2) readonly buffer C { uint cand[]; };
layout(binding = 3) writeonly buffer I { int idx[]; };
#else
layout(binding = 2) writeonly buffer I { int idx[]; };
#endif
layout(push_constant) uniform P {
    uint T, n, K, tiles, groups, rate, capacity, has_pos;
    uint s_off, s_s0, pos_off, c_off, c_s0, i_off, i_s0;
} p;

const uint BINS = 256u;
shared uint hist[BINS];
shared uint groups[16];
shared uint st_digit, st_need, st_cnt, st_slot;
#if !defined(PART)
shared uint key_hi[KCAP], key_lo[KCAP];
#endif

// order-preserving bits of a finite score (−0 as +0: equal scores tie by index), 0 if not finite
uint ordered(float x) {
    if (isnan(x) || isinf(x)) return 0u;
    uint b = floatBitsToUint(x == 0.0 ? 0.0 : x);
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

uint valid_entries(uint t) {
    if (p.has_pos == 0u) return p.n;
    int q = pos[p.pos_off] + int(t);
    if (q < 0 || uint(q) >= p.capacity) return 0u;
    return min((uint(q) + 1u) / p.rate, p.n);
}

bool at_least(uvec2 a, uvec2 b) { return a.x > b.x || (a.x == b.x && a.y >= b.y); }

uint row, first, list;          // the workgroup's row; its list: entries first.. (PART), count

// item i of the workgroup's list: its key, (0, 0) when not selectable
uvec2 item(uint i) {
#if defined(MERGE)
    uint base = p.c_off + row * p.c_s0 + (i / KCAP) * (2u * KCAP + 1u);
    uint s = i % KCAP;
    if (s >= cand[base]) return uvec2(0u);
    return uvec2(cand[base + 1u + 2u * s], cand[base + 2u + 2u * s]);
#else
    uint w = first + i;
    return uvec2(ordered(sc[p.s_off + row * p.s_s0 + w]), ~w);
#endif
}

// the top KCAP keys of the workgroup's list (row, first, list set): PART stores them as tile's
// candidates, the others rank them and write idx
void select_list(uint tile) {
    uint l = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    // radix select over the keys: pre holds the digits decided so far (under msk)
    uvec2 pre = uvec2(0u), msk = uvec2(0u);
    uint need = 0u, total = 0u;
    for (uint b = 0u; b < 8u; ++b) {
        for (uint d = l; d < BINS; d += wg) hist[d] = 0u;
        barrier();
        uint sh = 24u - 8u * (b & 3u);
        for (uint i = l; i < list; i += wg) {
            uvec2 it = item(i);
            if (it.x != 0u && (it & msk) == pre) atomicAdd(hist[((b < 4u ? it.x : it.y) >> sh) & 0xFFu], 1u);
        }
        barrier();
        for (uint c = l; c < 16u; c += wg) {
            uint s = 0u;
            for (uint e = 0u; e < 16u; ++e) s += hist[16u * c + e];
            groups[c] = s;
        }
        barrier();
        if (b == 0u) {                                  // every selectable key is in this histogram
            for (uint c = 0u; c < 16u; ++c) total += groups[c];
            need = min(KCAP, total);
            if (need == total) break;                   // all of them (msk = 0 selects every key)
        }
        for (uint d = l; d < BINS; d += wg) {          // keys in bins above d
            uint above = 0u, c = d >> 4u;
            for (uint e = c + 1u; e < 16u; ++e) above += groups[e];
            for (uint e = d + 1u; e < 16u * c + 16u; ++e) above += hist[e];
            if (above < need && need <= above + hist[d]) { st_digit = d; st_need = need - above; st_cnt = hist[d]; }
        }
        barrier();
        uint d = st_digit;
        need = st_need;
        if (b < 4u) { pre.x |= d << sh; msk.x |= 0xFFu << sh; }
        else        { pre.y |= d << sh; msk.y |= 0xFFu << sh; }
        bool done = need == st_cnt;                     // the bin's keys are exactly those still needed
        barrier();                                      // st_* read by all before they change
        if (done) break;
    }
    uint chosen = min(KCAP, total);
    if (l == 0u) st_slot = 0u;
    barrier();
#if defined(PART)
    uint base = p.c_off + row * p.c_s0 + tile * (2u * KCAP + 1u);
    if (l == 0u) cand[base] = chosen;
    for (uint i = l; i < list; i += wg) {
        uvec2 it = item(i);
        if (it.x != 0u && at_least(it & msk, pre)) {
            uint s = atomicAdd(st_slot, 1u);
            cand[base + 1u + 2u * s] = it.x;
            cand[base + 2u + 2u * s] = it.y;
        }
    }
#else
    for (uint i = l; i < list; i += wg) {
        uvec2 it = item(i);
        if (it.x != 0u && at_least(it & msk, pre)) {
            uint s = atomicAdd(st_slot, 1u);
            key_hi[s] = it.x;
            key_lo[s] = it.y;
        }
    }
    barrier();
    uint ib = p.i_off + row * p.i_s0;
    for (uint s = l; s < chosen; s += wg) {             // rank: the selected keys above this one
        uvec2 me = uvec2(key_hi[s], key_lo[s]);
        uint rank = 0u;
        for (uint j = 0u; j < chosen; ++j)
            rank += (key_hi[j] > me.x || (key_hi[j] == me.x && key_lo[j] > me.y)) ? 1u : 0u;
        idx[ib + rank] = int(~me.y);
    }
    for (uint r = chosen + l; r < KCAP; r += wg) idx[ib + r] = -1;
#endif
}

void main() {
    uint g = flat_group();
#if defined(PART)
    row = g / p.groups;
#else
    row = g;
#endif
    if (row >= p.T) return;                             // uniform per workgroup
    uint v = valid_entries(row);
#if defined(PART)
    for (uint tile = g % p.groups; tile * TILE < v; tile += p.groups) {   // none past the row's entries
        first = tile * TILE;
        list = min(TILE, v - first);
        select_list(tile);
    }
#elif defined(MERGE)
    first = 0u;
    list = (v + TILE - 1u) / TILE * KCAP;              // the candidate slots of the tiles below v
    select_list(0u);
#else
    first = 0u;
    list = v;
    select_list(0u);
#endif
}
