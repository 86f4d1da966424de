#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; - | MODE_HCA | MODE_CSA ; - | TILED ; - | Q_NORM
//! variants: LANES_SUBGROUP_OPS | LANES_SHUFFLE ; - | MODE_HCA | MODE_CSA ; - | TILED ; - | Q_NORM ; LITERAL_ARRAYS
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; - | MODE_HCA | MODE_CSA ; - | TILED ; - | Q_NORM ; MERGE | MERGE_ROPE
//! variants: LANES_SUBGROUP_OPS | LANES_SHUFFLE ; - | MODE_HCA | MODE_CSA ; - | TILED ; - | Q_NORM ; MERGE | MERGE_ROPE ; LITERAL_ARRAYS
// MQA_ATTENTION: DeepSeek-V4's attention, one shared key = value head for all H query heads.
// For chunk token t at p = pos[0] + t and head h the key list is
//   raw rows j of kv with p − WINDOW < j ≤ p (the sliding window; kv [kv_rows, hd] is a ring,
//   position j in row j % kv_rows), then
//   MODE_HCA: entries w < min((p + 1)/RATE, n_ent) of ent [*, hd] (the closed windows), or
//   MODE_CSA: entries idx[t, s], s < K, skipping −1 (the indexer's top-k);
// out[t, h] = Σ_keys softmax([scale·q·k ..., sink_h]) · k, the sink's probability dropped.
// SPLITS > 1 (decode with long key lists): the list is cut into SPLITS contiguous parts, one
// cluster each, writing (max, sum, acc[hd]) to out viewed as [T, H, SPLITS, hd + 2] (the sink is
// left to MQA_COMBINE, which merges the parts).
// -D MERGE (SPLITS > 1): the parts merged in this dispatch instead. Workgroups are laid out as the
// TILED kernel's (one per (t, split, group of heads), one cluster per head, with or without TILED);
// each writes its heads' parts to `part` (a coherent scratch buffer, rows of hd + 2 rounded up to a
// multiple of 4 for vec4 loads), then the last workgroup of each (t, head group) to finish
// (last_group.glsl, counters at the binding after `part`) merges its group's SPLITS parts with the
// sinks into out [T, H, hd] (mqa_merge.glsl, MQA_COMBINE's formula and part order), each head by
// its own cluster, a lane taking vec4s of channels, loaded from MERGE_STEP parts together (spec
// constant 7: fewer than SPLITS keeps the merge's registers, which the whole kernel is allocated,
// from growing with the split count).
// -D MERGE_ROPE: MERGE, and the output's trailing 2·q_half channels de-rotated at their position
// (ROPE inverse=True: V carries RoPE), with the tables cos/sin at bindings 7, 8 (those of Q_NORM).
// Lanes: one cluster of LANES lanes (lanes.glsl) per (t, split, h), h fastest; lane l holds channels
// l + LANES·m, m < PER_LANE; online softmax in f32, one cluster sum per key, no shared memory.
// KEYS keys at a time (spec constant 5): their loads, dot products and cluster sums are issued
// together, so that their memory latencies overlap (a decode step is a chain of them), then the
// online softmax takes them one by one in key order — the same arithmetic as one key at a time.
// TILED (decode: few tokens, key lists split into many short parts): one workgroup per
// (t, split, group of heads), one cluster per head; the split's keys are staged TILE at a time in
// shared memory by the whole workgroup (every load of a tile issued together: one memory latency
// per tile instead of one per key, and each key read from memory once per head group, not once
// per head), then each cluster scores the tile's keys against its head (all cluster sums issued
// together) and merges the tile into its online softmax at once.
// -D Q_NORM: q as the projection wrote it; each head's row is RMS-normalised (no weight, eps q_eps)
// and its trailing 2·q_half channels rotated (rope.glsl, tables cos/sin at bindings 7, 8) as it is
// loaded — q's per-head norm and RoPE, a dispatch of their own otherwise. A lane reads its
// channel's partner back from memory (the row is in cache).
// A position outside [0, capacity) gives NaN.
// Push: T, H, hd, capacity, n_ent, K, q (off, s0, s1), kv_rows, kv (off, s0), ent (off, s0), idx (off, s0),
// out (off, s0, s1), pos_off, sink_off, scale; Q_NORM: q_eps; Q_NORM or MERGE_ROPE: q_half, cos_off,
// sin_off, tab_s0; MERGE: part_off (a multiple of 4), cnt_off.
#include "lanes.glsl"
layout(constant_id = 1) const uint PER_LANE = 1; // ceil(hd / LANES): channels per lane
layout(constant_id = 2) const uint SPLITS = 1;   // parts of each key list (decode)
layout(constant_id = 3) const uint WINDOW = 1;   // sliding_window
layout(constant_id = 4) const uint RATE = 1;     // the compression rate m (MODE_HCA)
layout(constant_id = 5) const uint KEYS = 1;     // keys loaded and reduced together
layout(constant_id = 6) const uint TILE = 1;     // TILED: keys staged in shared memory at a time
layout(constant_id = 7) const uint MERGE_STEP = 1;   // MERGE: parts whose loads the merge issues together
// -D LITERAL_ARRAYS: the per-lane arrays get literal sizes (at least the specialization constants
// their loops run to: PER_LANE ≤ 16, KEYS ≤ 4, TILE ≤ 16, ≤ 32 tile loads a lane; the host checks).
// Arrays sized by specialization constants may be kept in memory rather than registers: the
// H200 ran MUL_MAT_ID with a [spec][spec] array slower than with literal sizes.
#if defined(LITERAL_ARRAYS)
#define PL_N 16
#define KEYS_N 4
#define TILE_N 16
#else
#define PL_N PER_LANE
#define KEYS_N KEYS
#define TILE_N TILE
#endif
layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer KV { float kv[]; };
layout(binding = 2) readonly buffer E { float ent[]; };
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
#endif
#if defined(Q_NORM) || defined(MERGE_ROPE)
    uint q_half, cos_off, sin_off, tab_s0;
#endif
#if defined(MERGE) || defined(MERGE_ROPE)
    uint part_off, cnt_off;
#endif
} p;
// (defined after the push block, which the host reads under the launch's defines alone)
#if defined(MERGE_ROPE) && !defined(MERGE)
#define MERGE 1
#endif
#if defined(Q_NORM) || defined(MERGE_ROPE)
#define TABLES 1
#endif
#if defined(TABLES)
layout(binding = 7) readonly buffer Cos { float cos_t[]; };
layout(binding = 8) readonly buffer Sin { float sin_t[]; };
#include "rope.glsl"
#define B_PART 9
#else
#define B_PART 7
#endif
#if defined(MERGE)
// the parts (scratch), read back by the merging workgroup: coherent (last_group.glsl)
layout(binding = B_PART) coherent buffer Part { vec4 part4[]; };
#define LG_BINDING (B_PART + 1)
#include "last_group.glsl"
#define OUT_AT(i) part4[(i) >> 2][(i) & 3u]
#else
#define OUT_AT(i) o[i]
#endif

const float LOWEST = -3.402823466e38;
float qv[PL_N], acc[PL_N];
float mx, l;

void add_key(float s, float vals[PL_N]) {
    float mn = max(mx, s);
    float corr = exp(mx - mn), e = exp(s - mn);
    l = l * corr + e;
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) acc[m] = acc[m] * corr + e * vals[m];
    mx = mn;
}

// Where key sk of token t's list lies (j0, n_raw: its raw window): false for a CSA slot
// without an entry; raw: in kv (else ent); b: the row's first element.
bool key_at(uint t, uint sk, uint j0, uint n_raw, out bool raw, out uint b) {
    raw = sk < n_raw;
    if (raw) {
        b = p.kv_off + ((j0 + sk) % p.kv_rows) * p.kv_s0;
        return true;
    }
#if defined(MODE_CSA)
    int w = idx[p.i_off + t * p.i_s0 + (sk - n_raw)];
    b = p.e_off + uint(max(w, 0)) * p.e_s0;
    return w >= 0 && uint(w) < p.n_ent;                 // −1: no entry
#else
    b = p.e_off + (sk - n_raw) * p.e_s0;
    return true;
#endif
}

// Token t's key list at position pp: its raw window starts at j0 and holds n_raw rows; n keys in all.
void key_list(int pp, out uint j0, out uint n_raw, out uint n) {
    j0 = uint(max(pp - int(WINDOW) + 1, 0));
    n_raw = uint(pp) + 1 - j0;
#if defined(MODE_HCA)
    n = n_raw + min((uint(pp) + 1) / RATE, p.n_ent);
#elif defined(MODE_CSA)
    n = n_raw + p.K;
#else
    n = n_raw;
#endif
}

// Token t's query row of head h at position pp, scaled (every lane of the cluster calls it).
void load_q(uint t, uint h, uint lane, int pp) {
    uint qb = p.q_off + t * p.q_s0 + h * p.q_s1;
#if defined(Q_NORM)
    // the channels and their rotation partners loaded together, before the sum (one latency)
    float ss = 0.0, partner[PL_N];
    uint first = p.hd - 2u * p.q_half;
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = lane + LANES * m;
        qv[m] = c < p.hd ? q[qb + c] : 0.0;
        partner[m] = c < p.hd && c >= first ? q[qb + (c ^ 1u)] : 0.0;
        ss += qv[m] * qv[m];
    }
    float r = 1.0 / sqrt(cluster_sum(ss) / float(p.hd) + p.q_eps);
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = lane + LANES * m;
        float v = qv[m] * r;
        if (c < p.hd && c >= first)
            v = rope_channel(v, partner[m] * r, c, first, pp, p.capacity, p.cos_off, p.sin_off, p.tab_s0, false);
        qv[m] = v * p.scale;
        acc[m] = 0.0;
    }
#else
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = lane + LANES * m;
        qv[m] = c < p.hd ? q[qb + c] * p.scale : 0.0;
        acc[m] = 0.0;
    }
#endif
    if (SPLITS > 1) { mx = LOWEST; l = 0.0; }
    else { mx = sinks[p.sink_off + h]; l = 1.0; }       // the sink: logit only, no value
}

void store_out(uint ob, uint lane) {
    float inv = SPLITS > 1 ? 1.0 : 1.0 / l;             // parts stay unnormalised for MQA_COMBINE
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = lane + LANES * m;
        if (c < p.hd) OUT_AT(ob + c) = acc[m] * inv;
    }
    if (SPLITS > 1 && lane == 0) { OUT_AT(ob + p.hd) = mx; OUT_AT(ob + p.hd + 1) = l; }
}

// n values of out from ob: NaN (a position outside [0, capacity))
void store_nan(uint ob, uint lane, uint n) {
    for (uint c = lane; c < n; c += LANES) o[ob + c] = uintBitsToFloat(0x7FC00000u);
}

#if defined(TILED)
const uint ROW = PER_LANE * LANES;                  // a staged key row (≥ hd; the rest zeros)
const uint LOADS = (TILE * ROW + gl_WorkGroupSize.x - 1) / gl_WorkGroupSize.x;
#if defined(LITERAL_ARRAYS)
#define LOADS_N 32
#else
#define LOADS_N LOADS
#endif
shared float ks[TILE * ROW];
shared uint kbase[TILE], kflag[TILE];                // row start; bit 0: a key, bit 1: raw (kv)

// Token t's part `split` for head h at position pp into its row at ob: the whole workgroup stages
// the keys (the clusters of idle heads, head false, too: they reach the barriers).
void attend(uint t, uint split, uint h, bool head, uint lid, uint lane, int pp, uint ob) {
    load_q(t, h, lane, pp);
    uint j0, n_raw, n;
    key_list(pp, j0, n_raw, n);
    uint per = (n + SPLITS - 1) / SPLITS;
    uint s0 = min(split * per, n), s1 = min(s0 + per, n);
    for (uint s = s0; s < s1; s += TILE) {              // uniform per workgroup
        uint nk = min(TILE, s1 - s);
        barrier();                                      // the previous tile's readers are done
        if (lid < nk) {
            bool raw;
            uint b;
            bool ok = key_at(t, s + lid, j0, n_raw, raw, b);
            kbase[lid] = b;
            kflag[lid] = (ok ? 1u : 0u) | (raw ? 2u : 0u);
        }
        barrier();
        float v[LOADS_N];                               // all loads first: one latency per tile
        [[unroll]] for (uint i = 0; i < LOADS; ++i) {
            uint e = lid + i * gl_WorkGroupSize.x, k = e / ROW, c = e % ROW;
            v[i] = 0.0;
            if (k < nk && c < p.hd && (kflag[k] & 1u) != 0u)
                v[i] = (kflag[k] & 2u) != 0u ? kv[kbase[k] + c] : ent[kbase[k] + c];
        }
        [[unroll]] for (uint i = 0; i < LOADS; ++i) {
            uint e = lid + i * gl_WorkGroupSize.x;
            if (e < TILE * ROW) ks[e] = v[i];
        }
        barrier();
        float sc[TILE_N];
        [[unroll]] for (uint k = 0; k < TILE; ++k) {
            float d = 0.0;
            [[unroll]] for (uint m = 0; m < PER_LANE; ++m) d += qv[m] * ks[k * ROW + lane + LANES * m];
            sc[k] = d;
        }
        [[unroll]] for (uint k = 0; k < TILE; ++k) sc[k] = cluster_sum(sc[k]);   // every lane, every k
        float tm = LOWEST;
        [[unroll]] for (uint k = 0; k < TILE; ++k)
            if (k < nk && (kflag[k] & 1u) != 0u) tm = max(tm, sc[k]);
        float mn = max(mx, tm), corr = exp(mx - mn);
        l *= corr;
        [[unroll]] for (uint m = 0; m < PER_LANE; ++m) acc[m] *= corr;
        [[unroll]] for (uint k = 0; k < TILE; ++k) {
            if (k < nk && (kflag[k] & 1u) != 0u) {
                float e = exp(sc[k] - mn);
                l += e;
                [[unroll]] for (uint m = 0; m < PER_LANE; ++m) acc[m] += e * ks[k * ROW + lane + LANES * m];
            }
        }
        mx = mn;
    }
    if (head) store_out(ob, lane);
}
#else
// Token t's part `split` for head h at position pp into its row at ob: the cluster reads its keys
// itself (an idle head's cluster, head false, has nothing to do).
void attend(uint t, uint split, uint h, bool head, uint lid, uint lane, int pp, uint ob) {
    if (!head) return;                                  // whole cluster leaves together
    load_q(t, h, lane, pp);
    uint j0, n_raw, n;
    key_list(pp, j0, n_raw, n);
    uint per = (n + SPLITS - 1) / SPLITS;
    uint s0 = min(split * per, n), s1 = min(s0 + per, n);
    for (uint s = s0; s < s1; s += KEYS) {
        float vals[KEYS_N][PL_N];
        float d[KEYS_N];
        bool ok[KEYS_N];
        // (the key's row found inline, not through key_at: with its out parameters behind a
        // short-circuit test this loop ran several times slower on the H200)
        [[unroll]] for (uint k = 0; k < KEYS; ++k) {
            uint sk = s + k;
            ok[k] = sk < s1;                              // uniform per cluster, as every test here
            bool raw = sk < n_raw;
            uint b = 0u;
            if (ok[k] && raw) {
                b = p.kv_off + ((j0 + sk) % p.kv_rows) * p.kv_s0;
            } else if (ok[k]) {
#if defined(MODE_CSA)
                int w = idx[p.i_off + t * p.i_s0 + (sk - n_raw)];
                ok[k] = w >= 0 && uint(w) < p.n_ent;      // −1: no entry
                b = p.e_off + uint(max(w, 0)) * p.e_s0;
#else
                b = p.e_off + (sk - n_raw) * p.e_s0;
#endif
            }
            d[k] = 0.0;
            [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
                uint c = lane + LANES * m;
                float v = 0.0;
                if (ok[k] && c < p.hd) v = raw ? kv[b + c] : ent[b + c];
                vals[k][m] = v;
                d[k] += qv[m] * v;
            }
        }
        [[unroll]] for (uint k = 0; k < KEYS; ++k) d[k] = cluster_sum(d[k]);   // every lane, every k
        [[unroll]] for (uint k = 0; k < KEYS; ++k)
            if (ok[k]) add_key(d[k], vals[k]);
    }
    store_out(ob, lane);
}
#endif

#if defined(MERGE)
float merge_max(uint r) { return OUT_AT(r + p.hd); }
float merge_sum(uint r) { return OUT_AT(r + p.hd + 1u); }
vec4 merge_acc(uint r, uint c) { return c < p.hd ? part4[(r + c) >> 2] : vec4(0.0); }
#define MERGE_T vec4
const uint MERGE_N = (PER_LANE + 3u) / 4u;              // vec4s a lane: a head's hd channels over LANES lanes
// maxima and sums (a float each) in the registers of MERGE_STEP parts' vec4s, at most every part
const uint MERGE_STATS_STEP = SPLITS < 2u * MERGE_N * MERGE_STEP ? SPLITS : 2u * MERGE_N * MERGE_STEP;
#include "mqa_merge.glsl"

uint part_stride() { return (p.hd + 5u) & ~3u; }        // hd + 2 rounded up to vec4s
uint part_row(uint t, uint h, uint split) { return p.part_off + ((t * p.H + h) * SPLITS + split) * part_stride(); }

// In the merging workgroup, head h's cluster merges the head's parts of token t at position pp:
// lane `lane` takes the vec4s of channels 4·(lane + LANES·j), j < MERGE_N (side by side across lanes).
void merge_head(uint t, uint h, uint lane, int pp) {
    uint b = part_row(t, h, 0u);
    vec2 md = merge_scale(b, part_stride(), sinks[p.sink_off + h]);
    vec4 v[MERGE_N];
    merge_channels(b, part_stride(), md, 4u * lane, 4u * LANES, v);
    uint ob = p.o_off + t * p.o_s0 + h * p.o_s1;
    [[unroll]] for (uint j = 0; j < MERGE_N; ++j) {
        uint c = 4u * (lane + LANES * j);
#if defined(MERGE_ROPE)
        uint first = p.hd - 2u * p.q_half;              // even: a vec4 holds whole pairs
        vec4 r;
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            r[i] = rope_channel(v[j][i], v[j][i ^ 1u], c + i, first, pp, p.capacity, p.cos_off, p.sin_off, p.tab_s0,
                                true);                  // the inverse rotation
        v[j] = r;
#endif
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (c + i < p.hd) o[ob + c + i] = v[j][i];  // (past hd: max, sum, padding)
    }
}
#endif

#if defined(TILED) || defined(MERGE)
void main() {
    uint heads_per_group = gl_WorkGroupSize.x / LANES;
    uint groups = (p.H + heads_per_group - 1) / heads_per_group;
    uint g = flat_group();
    if (g >= p.T * SPLITS * groups) return;             // the whole workgroup leaves together
    uint lid = lane_linear(), lane = lid % LANES;
    uint grp = g % groups, split = (g / groups) % SPLITS, t = g / groups / SPLITS;
    uint h = grp * heads_per_group + lid / LANES;
    bool head = h < p.H;                                 // a partial last group: idle clusters
    h = min(h, p.H - 1);                                // ... still stage keys and reach barriers
    int pp = pos[p.pos_off] + int(t);
#if defined(MERGE)
    if (pp < 0 || uint(pp) >= p.capacity) {             // uniform per token: no workgroup of the set
        if (split == 0u && head) store_nan(p.o_off + t * p.o_s0 + h * p.o_s1, lane, p.hd);   // counts
        return;
    }
    attend(t, split, h, head, lid, lane, pp, part_row(t, h, split));
    if (last_group(p.cnt_off + t * groups + grp, SPLITS) && head) merge_head(t, h, lane, pp);
#else
    uint ob = p.o_off + t * p.o_s0 + h * p.o_s1 + split * (p.hd + 2);
    if (pp < 0 || uint(pp) >= p.capacity) {             // uniform per workgroup
        if (head) store_nan(ob, lane, p.hd + (SPLITS > 1 ? 2 : 0));
        return;
    }
    attend(t, split, h, head, lid, lane, pp, ob);
#endif
}
#else
void main() {
    uint item = cluster_id();
    if (item >= p.T * p.H * SPLITS) return;             // whole cluster leaves together
    uint lane = cluster_lane();
    uint h = item % p.H, ts = item / p.H;               // heads fastest: a workgroup's clusters
    uint split = ts % SPLITS, t = ts / SPLITS;          // read the same keys (shared in L1)
    int pp = pos[p.pos_off] + int(t);
    uint ob = p.o_off + t * p.o_s0 + h * p.o_s1 + split * (p.hd + 2);
    if (pp < 0 || uint(pp) >= p.capacity) {             // uniform per cluster
        store_nan(ob, lane, p.hd + (SPLITS > 1 ? 2 : 0));
        return;
    }
    attend(t, split, h, true, lane_linear(), lane, pp, ob);
}
#endif
