#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | MERGE ; - | SCAN_SUBGROUP | SCAN_FUSED ; - | SPREAD ; - | SORTED
//! variants: PART ; - | SCAN_SUBGROUP | SCAN_FUSED ; - | SPREAD
// TOPK: idx[t, ·] = the entries of the K largest selectable scores of row t (ties to the lower
// index); slots past the number of selectable scores get −1. Order: ascending entry (the set's
// order in the list), or with -D SORTED descending score, ties to the lower index (the order of
// torch.topk over the indexer's scores in transformers, model.reference.index_topk).
// Selectable: finite, and inside the row's bound v(t) — with a position buffer (has_pos) the
// indexer's causal bound v = min((p + 1) / rate, n) for p = pos[0] + t in [0, capacity), else 0;
// without, v = n. NaN and ±inf rank after every finite score and are never selected. Nothing at
// or past v(t) is read, so the cost follows the entries that exist, not n (the cache's capacity).
//
// Selection: every score becomes a 64-bit key (order-preserving bits of the score, then the
// complemented index: ties to the lower index), 0 for a non-selectable one. A radix select over
// digits of BITS bits from the top finds the K-th largest key: the first pass (a 1 << BITS bin
// histogram in shared memory) reads the list; a second read stages the K-th bin's keys (at most CAND of them) in shared memory, where the
// next digits' passes run until a bin holds exactly the keys still needed (where the bin has more
// than CAND keys, those passes read the list again). Keys are unique, so the result does not depend
// on the order of the lists. A last read of the list takes the keys at or above the K-th one in list
// order: each invocation counts its U consecutive items, a workgroup exclusive sum (subgroup
// operations with SCAN_SUBGROUP, else one invocation over shared counts) places them — no atomics,
// so the output is deterministic. The bin scan (find_bin), by define:
//   -              sums groups of bins (two levels of ~√bins each, serial loops in shared memory);
//   SCAN_SUBGROUP  a suffix sum over the bins with subgroup operations: each invocation sums a
//                  run of BINS / WG bins, subgroupExclusiveAdd across the subgroup, one shared
//                  step across the subgroups (≤ 256 of them);
//   SCAN_FUSED     SCAN_SUBGROUP with two histograms and two copies of the scan's result: the next
//                  pass's histogram is cleared while this one fills, and the scan's result is read
//                  without a barrier before the next pass (3 barriers a pass instead of 5).
// SPREAD: the first pass's digit is not the key's top BITS bits but a linear map of its high word
// (ordered score bits) from the list's least to its greatest onto the bins, so that clustered
// scores (the indexer's ReLU sums share a few exponents) spread over the bins; the map is
// monotone, so the K-th bin's keys are still those between two keys, resolved by the radix passes
// from the highest bit where those keys differ (their AND and OR). Needs subgroup arithmetic.
// Variants (one workgroup of WG invocations a list; each invocation loads U entries a round):
//   -      one workgroup per row selects from the row's scores and writes idx in entry order;
//   SORTED (with - or MERGE) idx by descending score instead: each selected key's rank is the count
//          of selected keys above it (keys in shared memory), split over WG / K parts when the
//          workgroup has more invocations than keys;
//   PART   `groups` workgroups per row, each taking tiles of TILE entries g, g + groups, ... below
//          v(t): a tile's top K keys, in entry order, into cand[t, tile] = [count, (key hi, key lo)
//          × count]; tiles at or past v(t) are neither read nor written;
//   MERGE  one workgroup per row: the top K of the candidates of the row's tiles below v(t) (in
//          entry order, as PART wrote them), written as the plain variant writes them.
// Spec constants: 0 workgroup size, 1 K (shared memory holds 2·K keys' words), 2 TILE, 3 BITS
// (4..16), 4 CAND (keys of the K-th bin staged in shared memory at most).
// Push: T, n, K, tiles, groups, rate, capacity, has_pos, s (off, s0), pos_off, cand (off, s0), idx (off, s0).
#include "common.glsl"
#if defined(SCAN_FUSED)
#define SCAN_SUBGROUP 1
#define NHIST 2u
#else
#define NHIST 1u
#endif
#if defined(SCAN_SUBGROUP) || defined(SPREAD)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
layout(constant_id = 1) const uint KCAP = 1;
layout(constant_id = 2) const uint TILE = 4096;
layout(constant_id = 3) const uint BITS = 11;
layout(constant_id = 4) const uint CAND = 1;
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

const uint BINS = 1u << BITS;
const uint GROUP = 1u << (BITS / 2u);          // bins a group of the scan sums
const uint NGROUPS = BINS / GROUP;
const uint U = 8u;                             // entries an invocation loads before using them
const uint NONE = 0xFFFFFFFFu;
shared uint hist[NHIST * BINS];
#if defined(SCAN_SUBGROUP)
shared uint gsum[256];                         // the subgroups' sums (WG / subgroup size ≤ 256: host)
#else
shared uint gsum[NGROUPS];
#endif
shared uint st_digit[NHIST], st_need[NHIST], st_cnt[NHIST], st_total, st_staged;
shared uint sp_min, sp_max, and_hi, and_lo, or_hi, or_lo;   // SPREAD: the map; the K-th bin's prefix
shared uint stage_hi[CAND], stage_lo[CAND];
#if defined(SORTED)
shared uint key_hi[KCAP], key_lo[KCAP];
#endif
#if !defined(SCAN_SUBGROUP)
shared uint counts[gl_WorkGroupSize.x];        // the compaction's per-invocation counts
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

bool above(uvec2 a, uvec2 b) { return a.x > b.x || (a.x == b.x && a.y > b.y); }

// bits lo .. lo + w − 1 (w ≤ 16) of the 64-bit key (hi, lo)
uint field(uvec2 k, uint lo, uint w) {
    uint v = lo >= 32u ? k.x >> (lo - 32u) : (lo == 0u ? k.y : (k.y >> lo) | (k.x << (32u - lo)));
    return v & ((1u << w) - 1u);
}

// the key's bits lo .. 63
uvec2 high_bits(uvec2 k, uint lo) {
    if (lo >= 64u) return uvec2(0u);
    return lo >= 32u ? uvec2(k.x & (0xFFFFFFFFu << (lo - 32u)), 0u) : uvec2(k.x, k.y & (0xFFFFFFFFu << lo));
}

uint row, first, list, out_base;   // the workgroup's row; its list: entries first.. (PART), count

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

// the first pass's digit of the selectable key k
float sp_scale;
uint first_digit(uvec2 k) {
#if defined(SPREAD)
    return min(BINS - 1u, uint(float(k.x - sp_min) * sp_scale));
#else
    return field(k, 64u - BITS, BITS);
#endif
}

// key i of the list (staged: the K-th bin's keys in shared memory)
uvec2 fetch(bool staged, uint i, uint count) {
    if (i >= count) return uvec2(0u);
    return staged ? uvec2(stage_hi[i], stage_lo[i]) : item(i);
}

// hist[h·BINS ..] filled: the bin d where the keys of the bins above hold fewer than `need` and d's
// hold the rest (st_digit[h], st_need[h] = what d must give, st_cnt[h] = d's keys); st_need[h] is
// NONE when all the bins together hold fewer than need (SCAN_SUBGROUP writes it; the plain scan
// leaves the NONE its caller stored)
#if defined(SCAN_SUBGROUP)
void find_bin(uint need, uint h) {
    uint q = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;   // subgroup order
    uint run = max(1u, BINS / gl_WorkGroupSize.x);
    uint top = q * run < BINS ? h * BINS + BINS - q * run : 0u;           // q's run: top − run .. top − 1
    uint s = 0u;
    if (top != 0u) for (uint e = 1u; e <= run; ++e) s += hist[top - e];
    uint up = subgroupExclusiveAdd(s);                  // the keys of the bins above q's run
    uint tot = subgroupAdd(s);
    if (subgroupElect()) gsum[gl_SubgroupID] = tot;
    barrier();
    for (uint b = 0u; b < gl_SubgroupID; b += gl_SubgroupSize) {          // uniform per subgroup
        uint i = b + gl_SubgroupInvocationID;
        up += subgroupAdd(i < gl_SubgroupID ? gsum[i] : 0u);
    }
    if (up < need && need <= up + s) {
        for (uint e = 1u; e <= run; ++e) {
            uint c = hist[top - e];
            if (need <= up + c) { st_digit[h] = top - e - h * BINS; st_need[h] = need - up; st_cnt[h] = c; break; }
            up += c;
        }
    } else if (q == gl_WorkGroupSize.x - 1u && up + s < need) st_need[h] = NONE;   // q holds the lowest bins
    barrier();
}
#else
void find_bin(uint need, uint h) {
    uint l = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    for (uint g = l; g < NGROUPS; g += wg) {
        uint s = 0u;
        for (uint e = 0u; e < GROUP; ++e) s += hist[g * GROUP + e];
        gsum[g] = s;
    }
    barrier();
    for (uint g = l; g < NGROUPS; g += wg) {
        uint up = 0u;
        for (uint e = g + 1u; e < NGROUPS; ++e) up += gsum[e];
        if (up < need && need <= up + gsum[g]) {
            for (uint d = g * GROUP + GROUP; d-- > g * GROUP;) {
                uint c = hist[d];
                if (need <= up + c) { st_digit[h] = d; st_need[h] = need - up; st_cnt[h] = c; break; }
                up += c;
            }
        }
    }
    barrier();
}
#endif

// the exclusive sum of c over the workgroup's invocations in item order (q), and the total
uint group_offset(uint c, uint q, out uint total) {
#if defined(SCAN_SUBGROUP)
    uint incl = subgroupInclusiveAdd(c), all_sg = subgroupAdd(c);
    if (subgroupElect()) gsum[gl_SubgroupID] = all_sg;  // (a workgroup smaller than a subgroup fills part of it)
    barrier();
    uint below = 0u, all = 0u;
    for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize) {
        uint v = gsum[i];
        all += v;
        if (i < gl_SubgroupID) below += v;
    }
    total = subgroupAdd(all);
    below = subgroupAdd(below);
    barrier();                                          // gsum read by all before it changes
    return below + incl - c;
#else
    counts[q] = c;
    barrier();
    if (q == 0u) {
        uint run = 0u;
        for (uint i = 0u; i < gl_WorkGroupSize.x; ++i) { uint v = counts[i]; counts[i] = run; run += v; }
        st_total = run;
    }
    barrier();
    uint off = counts[q];
    total = st_total;
    barrier();                                          // counts read by all before they change
    return off;
#endif
}

// whether key k is one of the top K: above the K-th bin d0, or in it at or above the K-th key
// (bits lo .. 63 decided as pre, when the radix passes ran)
bool selected(uvec2 k, uint d0, bool ran, uvec2 pre, uint lo) {
    if (k.x == 0u) return false;
    uint f = first_digit(k);
    return f > d0 || (f == d0 && (!ran || !above(pre, high_bits(k, lo))));
}

// the selected keys of the list, in list order, to their slots (PART: cand; SORTED: shared memory for
// the ranks; else idx); returns how many
uint compact(uint d0, bool ran, uvec2 pre, uint lo) {
#if defined(SCAN_SUBGROUP)
    uint q = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;   // subgroup order
#else
    uint q = gl_LocalInvocationID.x;
#endif
    uint base = 0u, wg = gl_WorkGroupSize.x;
#if !defined(PART) && !defined(SORTED)
    uint ib = p.i_off + row * p.i_s0;
#endif
    for (uint b = 0u; b < list; b += wg * U) {
        uvec2 it[U];
        uint mask = 0u, c = 0u, total;
        [[unroll]] for (uint u = 0u; u < U; ++u) {
            it[u] = fetch(false, b + q * U + u, list);
            if (selected(it[u], d0, ran, pre, lo)) { mask |= 1u << u; ++c; }
        }
        uint s = base + group_offset(c, q, total);
        [[unroll]] for (uint u = 0u; u < U; ++u) {
            if ((mask & (1u << u)) == 0u) continue;
            if (s < KCAP) {                             // always (the keys are unique): a guard
#if defined(PART)
                cand[out_base + 1u + 2u * s] = it[u].x;
                cand[out_base + 2u + 2u * s] = it[u].y;
#elif defined(SORTED)
                key_hi[s] = it[u].x;
                key_lo[s] = it[u].y;
#else
                idx[ib + s] = int(~it[u].y);
#endif
            }
            ++s;
        }
        base += total;
    }
    return min(base, KCAP);
}

// the top KCAP keys of the workgroup's list (row, first, list set): PART stores them as the tile's
// candidates, the others rank them and write idx
void select_list() {
    uint l = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    barrier();                                          // the previous tile's state read by all
    for (uint d = l; d < BINS; d += wg) hist[d] = 0u;
    if (l == 0u) {
        st_need[0] = NONE; st_staged = 0u;
        sp_min = NONE; sp_max = 0u; and_hi = NONE; and_lo = NONE; or_hi = 0u; or_lo = 0u;
    }
    barrier();
#if defined(SPREAD)
    {                                                   // the least and greatest selectable high words
        uint mn = NONE, mx = 0u;
        for (uint b = 0u; b < list; b += wg * U) {
            uvec2 it[U];
            [[unroll]] for (uint u = 0u; u < U; ++u) it[u] = fetch(false, b + u * wg + l, list);
            [[unroll]] for (uint u = 0u; u < U; ++u)
                if (it[u].x != 0u) { mn = min(mn, it[u].x); mx = max(mx, it[u].x); }
        }
        mn = subgroupMin(mn);
        mx = subgroupMax(mx);
        if (subgroupElect()) { atomicMin(sp_min, mn); atomicMax(sp_max, mx); }
        barrier();
        sp_scale = float(BINS) / (float(sp_max - sp_min) + 1.0);   // unused when nothing is selectable
    }
#endif
    uint top = 64u - BITS;                              // the first digit: bits top .. 63
    for (uint b = 0u; b < list; b += wg * U) {
        uvec2 it[U];
        [[unroll]] for (uint u = 0u; u < U; ++u) it[u] = fetch(false, b + u * wg + l, list);
        [[unroll]] for (uint u = 0u; u < U; ++u)
            if (it[u].x != 0u) atomicAdd(hist[first_digit(it[u])], 1u);
    }
#if defined(SCAN_FUSED)
    for (uint d = l; d < BINS; d += wg) hist[BINS + d] = 0u;   // the next pass's histogram
#endif
    barrier();
    find_bin(KCAP, 0u);
    // pre: the digits decided so far (bits lo .. 63 of the K-th key); need: keys still needed
    // from those that share them; done: all of those are needed
    uint lo = top, need = st_need[0], cnt = st_cnt[0], d0 = st_digit[0];
    bool done = need == NONE || need == cnt;
    if (need == NONE) d0 = 0u;                          // fewer than K selectable: all of them
    uvec2 pre = uvec2(d0 << (top - 32u), 0u);
    bool staged = !done && cnt <= CAND;
#if !defined(SCAN_FUSED)
    barrier();                                          // st_* read by all before they change
#endif
    for (uint b = 0u; !done && b < list; b += wg * U) {   // stage the K-th bin's keys
        uvec2 it[U];
        [[unroll]] for (uint u = 0u; u < U; ++u) it[u] = fetch(false, b + u * wg + l, list);
        [[unroll]] for (uint u = 0u; u < U; ++u) {
            if (it[u].x == 0u) continue;
            if (first_digit(it[u]) == d0) {
                if (staged) {
                    uint s = atomicAdd(st_staged, 1u);
                    stage_hi[s] = it[u].x;
                    stage_lo[s] = it[u].y;
                }
#if defined(SPREAD)
                atomicAnd(and_hi, it[u].x); atomicAnd(and_lo, it[u].y);
                atomicOr(or_hi, it[u].x); atomicOr(or_lo, it[u].y);
#endif
            }
        }
    }
    uint count = staged ? cnt : list;
    uint hb = 0u;                                       // the pass's histogram (SCAN_FUSED: alternating)
    bool ran = !done;
    barrier();
#if defined(SPREAD)
    if (!done) {                                        // the K-th bin's keys share bits lo .. 63 (≥ 2 unique keys)
        uint xh = or_hi ^ and_hi, xl = or_lo ^ and_lo;
        lo = xh != 0u ? 33u + uint(findMSB(xh)) : uint(findMSB(xl)) + 1u;
        pre = high_bits(uvec2(and_hi, and_lo), lo);
    }
#endif
    while (!done) {                                     // the next digits among the K-th bin's keys
        uint w = min(BITS, lo), nlo = lo - w;
#if defined(SCAN_FUSED)
        hb ^= 1u;                                       // cleared by the previous pass; clear the other
        for (uint d = l; d < BINS; d += wg) hist[(hb ^ 1u) * BINS + d] = 0u;
#else
        for (uint d = l; d < BINS; d += wg) hist[d] = 0u;
        if (l == 0u) st_need[0] = NONE;
        barrier();
#endif
        for (uint b = 0u; b < count; b += wg * U) {
            uvec2 it[U];
            [[unroll]] for (uint u = 0u; u < U; ++u) it[u] = fetch(staged, b + u * wg + l, count);
            [[unroll]] for (uint u = 0u; u < U; ++u)
                if (it[u].x != 0u && high_bits(it[u], lo) == pre
#if defined(SPREAD)
                    && (staged || first_digit(it[u]) == d0)     // bits lo .. 63 alone do not tell the bin
#endif
                   ) atomicAdd(hist[hb * BINS + field(it[u], nlo, w)], 1u);
        }
        barrier();
        find_bin(need, hb);
        uint d = st_digit[hb];
        need = st_need[hb];
        done = need == st_cnt[hb];                      // keys are unique: the last digit ends it
#if !defined(SCAN_FUSED)
        barrier();
#endif
        if (nlo >= 32u) pre.x |= d << (nlo - 32u);
        else { pre.y |= d << nlo; if (nlo > 0u) pre.x |= d >> (32u - nlo); }
        lo = nlo;
    }
    uint chosen = compact(d0, ran, pre, lo);
#if defined(PART)
    if (l == 0u) cand[out_base] = chosen;
#else
    uint ib = p.i_off + row * p.i_s0;
#if defined(SORTED)
    barrier();                                          // the selected keys stored
    uint parts = KCAP <= BINS ? max(1u, wg / KCAP) : 1u;
    if (parts == 1u) {
        for (uint s = l; s < chosen; s += wg) {          // rank: the selected keys above this one
            uvec2 me = uvec2(key_hi[s], key_lo[s]);
            uint rank = 0u, eq = 0u;
            for (uint j = 0u; j < chosen; ++j) { uint h = key_hi[j]; rank += uint(h > me.x); eq += uint(h == me.x); }
            if (eq > 1u) for (uint j = 0u; j < chosen; ++j) rank += uint(key_hi[j] == me.x && key_lo[j] > me.y);
            idx[ib + rank] = int(~me.y);
        }
    } else {                                            // part l / KCAP of key l % KCAP's count
        for (uint d = l; d < chosen; d += wg) hist[d] = 0u;
        barrier();
        uint s = l % KCAP, part = l / KCAP, len = (chosen + parts - 1u) / parts;
        uint j0 = part * len, j1 = min(chosen, j0 + len);
        if (s < chosen && part < parts && j0 < j1) {
            uvec2 me = uvec2(key_hi[s], key_lo[s]);
            uint rank = 0u, eq = 0u;
            for (uint j = j0; j < j1; ++j) { uint h = key_hi[j]; rank += uint(h > me.x); eq += uint(h == me.x); }
            if (eq > uint(j0 <= s && s < j1))
                for (uint j = j0; j < j1; ++j) rank += uint(key_hi[j] == me.x && key_lo[j] > me.y);
            atomicAdd(hist[s], rank);
        }
        barrier();
        for (uint s = l; s < chosen; s += wg) idx[ib + hist[s]] = int(~key_lo[s]);
    }
#endif
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
        out_base = p.c_off + row * p.c_s0 + tile * (2u * KCAP + 1u);
        select_list();
    }
#elif defined(MERGE)
    first = 0u;
    list = (v + TILE - 1u) / TILE * KCAP;              // the candidate slots of the tiles below v
    select_list();
#else
    first = 0u;
    list = v;
    select_list();
#endif
}
