#version 450
#extension GL_GOOGLE_include_directive : require
// MUL_MAT_ID's routing sort, for its grouped kernel (mul_mat_id_grouped.comp): the route slots
// s = t·R + r of route [T, R, 2] (MOE_ROUTE / V4_ROUTE's table, ids as exact floats) ordered by
// bucket, a counting sort that is stable (within a bucket, slots increase: tokens in order).
// Bucket of a slot: its expert's index in this dispatch's weights, 0 .. EL − 1 (experts id_base ..
// id_base + E − 1 of a split stack as 0 .. E − 1; with p.shared_id = 1, the shared expert n_ids − 1,
// held in a tensor of its own, as E; EL = E + p.shared_id), else EL: a route this dispatch does not
// compute (another part's expert, or an invalid id). B = EL + 1 buckets (spec constant 2).
// Result (i32 at binding 1, offsets from p.s_off; ops/moe_grouped.py lays it out):
//   [0]                 tiles: how many tiles of at most BT slots the buckets make
//   [CNT + b]           slots of bucket b            [OFF + b]   exclusive prefix sum of the counts
//   [TOFF + b]          first tile of bucket b
//   [TILE0 + 3i ..]     tile i: bucket, first position in the list, slots (≤ BT)
//   [LIST0 + j]         the slots, bucket by bucket
// Layout: one workgroup (spec constant 0 invocations), no device-memory atomics. The slots go by
// blocks of CH (spec constant 1), their buckets staged in shared memory. Count: shared-memory
// atomic adds (a count does not depend on their order). Place: slot j of a block lands at its
// bucket's cursor plus its rank, the number of earlier slots of the block in the same bucket
// (a scan of the staged block: O(CH) reads a slot, all independent, no read-modify-write chain),
// so within a bucket the slots keep their order whatever the timing; then the cursors advance by
// the block's counts. Every invocation takes slots j = i, i + WG, ... of a block.
// Push block: T, R, E, id_base, n_ids, shared_id; r_off, r_s0, r_s1 (the ids; weights are not
// read); s_off; BT (tile slots); the layout's offsets CNT, OFF, TOFF, TILE0, LIST0 (from s_off).
#include "common.glsl"
layout(constant_id = 1) const uint CH = 1024;
layout(constant_id = 2) const uint B = 2;
layout(binding = 0) readonly buffer R { float route[]; };
layout(binding = 1) writeonly buffer S { int sr[]; };
layout(push_constant) uniform P {
    uint T, R, E, id_base, n_ids, shared_id;
    uint r_off, r_s0, r_s1;
    uint s_off, BT;
    uint CNT, OFF, TOFF, TILE0, LIST0;
} p;

shared uint sb[CH];
shared int cnt[B], cur[B], toff[B];

uint bucket_of(uint s) {
    uint t = s / p.R, r = s - t * p.R, EL = B - 1u;
    float f = route[p.r_off + t * p.r_s0 + r * p.r_s1];
    if (!(f >= 0.0 && f < float(p.n_ids) && f == floor(f))) return EL;
    uint id = uint(f);
    if (p.shared_id != 0u && id == p.n_ids - 1u) return p.E;
    return (id >= p.id_base && id - p.id_base < p.E) ? id - p.id_base : EL;
}

void main() {
    uint i = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    uint S = p.T * p.R, base = p.s_off;
    for (uint b = i; b < B; b += WG) cnt[b] = 0;
    barrier();
    for (uint c0 = 0; c0 < S; c0 += CH) {               // count
        uint n = min(CH, S - c0);
        for (uint j = i; j < n; j += WG) atomicAdd(cnt[bucket_of(c0 + j)], 1);
    }
    barrier();
    if (i == 0u) {                                       // B is small: one invocation's prefix sums
        int off = 0, tiles = 0;
        for (uint b = 0; b < B; ++b) {
            cur[b] = off;
            toff[b] = tiles;
            off += cnt[b];
            tiles += (cnt[b] + int(p.BT) - 1) / int(p.BT);
        }
        sr[base] = tiles;
    }
    barrier();
    for (uint b = i; b < B; b += WG) {                   // counts, offsets, tiles
        int c = cnt[b], off = cur[b], t0 = toff[b];
        sr[base + p.CNT + b] = c;
        sr[base + p.OFF + b] = off;
        sr[base + p.TOFF + b] = t0;
        for (int k = 0; k * int(p.BT) < c; ++k) {
            uint at = base + p.TILE0 + 3u * uint(t0 + k);
            sr[at] = int(b);
            sr[at + 1u] = off + k * int(p.BT);
            sr[at + 2u] = min(int(p.BT), c - k * int(p.BT));
        }
    }
    for (uint c0 = 0; c0 < S; c0 += CH) {               // place, block by block
        uint n = min(CH, S - c0);
        for (uint j = i; j < n; j += WG) sb[j] = bucket_of(c0 + j);
        barrier();                                       // (also: the cursors' last advance is done)
        for (uint j = i; j < n; j += WG) {
            uint b = sb[j];
            int rank = 0;
            for (uint k = 0; k < j; ++k) rank += sb[k] == b ? 1 : 0;
            sr[base + p.LIST0 + uint(cur[b] + rank)] = int(c0 + j);
        }
        barrier();                                       // every slot placed from the cursors
        for (uint j = i; j < n; j += WG) atomicAdd(cur[sb[j]], 1);
        barrier();                                       // cursors advanced before sb is staged again
    }
}
