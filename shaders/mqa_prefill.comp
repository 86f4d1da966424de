#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | LANES_SHUFFLE | LANES_SUBGROUP_OPS ; - | MODE_HCA | MODE_CSA ; - | Q_NORM
//! variants: LANES_SUBGROUP_OPS ; - | MODE_HCA | MODE_CSA ; - | Q_NORM ; LITERAL_ARRAYS
// MQA_ATTENTION kernel="prefill": the same attention as mqa_attention.comp (one shared key = value
// head for all H query heads; token t at p = pos[0] + t sees the raw rows p − WINDOW < j ≤ p of the
// ring kv [kv_rows, hd], then MODE_HCA's entries w < min((p + 1)/RATE, n_ent) or MODE_CSA's
// idx[t, s] ≥ 0; out[t, h] = Σ softmax([scale·q·k ..., sink_h]) · k, the sink's probability
// dropped; a position outside [0, capacity) gives NaN), laid out for many query tokens: a token's
// heads all read the same keys, so one workgroup takes one token and HEADS·C of its heads and
// reads each key row from memory once for them all.
// Lanes: the workgroup is C = WG / LANES clusters of LANES lanes (lanes.glsl); cluster c holds heads
// h_i = g·HEADS·C + i·C + c, i < HEADS (spec constant 7), lane l of it channels 4·(l + LANES·m) ..
// + 3, m < PER_LANE, as vec4s: q and the output accumulator in registers, HEADS·PER_LANE vec4 each.
// Tile loop (one per TILE keys of the token's list, uniform per workgroup): the workgroup stages
// the tile's key rows in shared memory (every load issued before any store: one memory latency a
// tile), then each lane takes the scores S[i, k] = q_i · key_k of its heads × the tile (a
// HEADS × TILE × hd product, reduced over the cluster), merges them into each head's online
// softmax (the sink its starting maximum), and adds P[i, k] · key_k into the accumulator: each
// staged vec4 read once a lane for all HEADS heads, in the score and in the value product alike.
// Both products are small GEMMs (heads × keys × channels, heads × channels × keys) over a tile held
// in shared memory; a matrix-unit version replaces the two loops inside the tile loop.
// -D Q_NORM: q as the projection wrote it, each head's row RMS-normalised (no weight, eps q_eps)
// and its trailing 2·q_half channels rotated (rope.glsl, tables cos/sin at bindings 7, 8) as it is
// loaded; a channel's rotation partner (c ^ 1) is in the same vec4.
// Shared memory: TILE·PER_LANE·LANES vec4 + 2·TILE uints (the host sizes TILE to the device).
// Push: T, H, hd, capacity, n_ent, K, q (off, s0, s1), kv_rows, kv (off, s0), ent (off, s0), idx (off, s0),
// out (off, s0, s1), pos_off, sink_off, scale; Q_NORM: q_eps, q_half, cos_off, sin_off, tab_s0.
#include "lanes.glsl"
layout(constant_id = 1) const uint PER_LANE = 1; // ceil(hd / (4·LANES)): vec4s of a row per lane
layout(constant_id = 3) const uint WINDOW = 1;   // sliding_window
layout(constant_id = 4) const uint RATE = 1;     // the compression rate m (MODE_HCA)
layout(constant_id = 6) const uint TILE = 1;     // keys staged in shared memory at a time
layout(constant_id = 7) const uint HEADS = 1;    // heads per cluster
layout(constant_id = 8) const bool ROWS4 = false; // hd, kv's and ent's offsets and row strides are multiples
                                                  // of 4: key rows staged by vec4 loads
// -D LITERAL_ARRAYS (knob mqa_arrays.literal): the per-lane arrays get literal sizes, at least the
// specialization constants their loops run to (PER_LANE ≤ 8, HEADS ≤ 4, TILE ≤ 16, ≤ 32 tile loads
// a lane; whole-subgroup clusters: the host checks), for drivers that keep arrays sized by
// specialization constants in memory.
#if defined(LITERAL_ARRAYS)
#define PL_N 8
#define HEADS_N 4
#define TILE_N 16
#define LOADS_N 32
#else
#define PL_N PER_LANE
#define HEADS_N HEADS
#define TILE_N TILE
#define LOADS_N LOADS
#endif
layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer KV { float kv[]; };
layout(binding = 2) readonly buffer E { float ent[]; };
layout(binding = 1) readonly buffer KV4 { vec4 kv4[]; };      // (the same buffers as vec4s: ROWS4)
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
const uint ROW = PER_LANE * LANES;                   // a staged key row in vec4s (≥ hd/4; zeros past hd)
const uint LOADS = (TILE * ROW + gl_WorkGroupSize.x - 1) / gl_WorkGroupSize.x;
shared vec4 ks[TILE * ROW];
shared uint kbase[TILE], kflag[TILE];                // row start; bit 0: a key, bit 1: raw (kv)

vec4 qv[HEADS_N][PL_N], acc[HEADS_N][PL_N];
float mx[HEADS_N], l[HEADS_N];

// The 4 channels from c of the row at b (zeros past hd).
vec4 load4(bool raw, uint b, uint c) {
    if (ROWS4) return c < p.hd ? (raw ? kv4[(b + c) / 4u] : ent4[(b + c) / 4u]) : vec4(0.0);
    vec4 v = vec4(0.0);
    [[unroll]] for (uint j = 0; j < 4; ++j)
        if (c + j < p.hd) v[j] = raw ? kv[b + c + j] : ent[b + c + j];
    return v;
}

// Head h's query row at position pp into qv[i], scaled; acc[i] zeroed, the sink as the maximum.
void load_q(uint i, uint t, uint h, uint lane, int pp) {
    uint qb = p.q_off + t * p.q_s0 + h * p.q_s1;
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = 4u * (lane + LANES * m);
        vec4 v = vec4(0.0);
        [[unroll]] for (uint j = 0; j < 4; ++j)
            if (c + j < p.hd) v[j] = q[qb + c + j];
        qv[i][m] = v;
        acc[i][m] = vec4(0.0);
    }
#if defined(Q_NORM)
    float ss = 0.0;
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) ss += dot(qv[i][m], qv[i][m]);
    float r = 1.0 / sqrt(cluster_sum(ss) / float(p.hd) + p.q_eps);
    uint first = p.hd - 2u * p.q_half;
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
        uint c = 4u * (lane + LANES * m);
        vec4 v = qv[i][m] * r, w = v;
        [[unroll]] for (uint j = 0; j < 4; ++j)
            if (c + j < p.hd)
                w[j] = rope_channel(v[j], v[j ^ 1u], c + j, first, pp, p.capacity, p.cos_off, p.sin_off, p.tab_s0,
                                    false);
        qv[i][m] = w;
    }
#endif
    [[unroll]] for (uint m = 0; m < PER_LANE; ++m) qv[i][m] *= p.scale;
    mx[i] = sinks[p.sink_off + h];                     // the sink: logit only, no value
    l[i] = 1.0;
}

void main() {
    const uint C = gl_WorkGroupSize.x / LANES, HG = HEADS * C;
    uint groups = (p.H + HG - 1) / HG;
    uint g = flat_group();
    if (g >= p.T * groups) return;                      // the whole workgroup leaves together
    uint lid = lane_linear(), lane = lid % LANES, c = lid / LANES;
    uint t = g / groups, h0 = (g % groups) * HG + c;
    int pp = pos[p.pos_off] + int(t);
    if (pp < 0 || uint(pp) >= p.capacity) {             // uniform per workgroup
        [[unroll]] for (uint i = 0; i < HEADS; ++i) {
            uint h = h0 + i * C;
            if (h < p.H)
                for (uint ch = lane; ch < p.hd; ch += LANES)
                    o[p.o_off + t * p.o_s0 + h * p.o_s1 + ch] = uintBitsToFloat(0x7FC00000u);
        }
        return;
    }
    // a partial last group: its idle heads load head H − 1 and still stage keys and reach barriers
    [[unroll]] for (uint i = 0; i < HEADS; ++i) load_q(i, t, min(h0 + i * C, p.H - 1), lane, pp);

    uint j0 = uint(max(pp - int(WINDOW) + 1, 0));       // the raw window: n_raw rows from j0
    uint n_raw = uint(pp) + 1 - j0, n = n_raw;
#if defined(MODE_HCA)
    n += min((uint(pp) + 1) / RATE, p.n_ent);
#elif defined(MODE_CSA)
    n += p.K;
#endif
    for (uint s = 0; s < n; s += TILE) {                // uniform per workgroup
        uint nk = min(TILE, n - s);
        barrier();                                      // the previous tile's readers are done
        for (uint k = lid; k < nk; k += gl_WorkGroupSize.x) {      // (a small workgroup: TILE may pass it)
            uint sk = s + k, b;
            bool ok = true, raw = sk < n_raw;
            if (raw) {
                b = p.kv_off + ((j0 + sk) % p.kv_rows) * p.kv_s0;
            } else {
#if defined(MODE_CSA)
                int w = idx[p.i_off + t * p.i_s0 + (sk - n_raw)];
                ok = w >= 0 && uint(w) < p.n_ent;       // −1: no entry
                b = p.e_off + uint(max(w, 0)) * p.e_s0;
#else
                b = p.e_off + (sk - n_raw) * p.e_s0;
#endif
            }
            kbase[k] = b;
            kflag[k] = (ok ? 1u : 0u) | (raw ? 2u : 0u);
        }
        barrier();
        bool any = false;                               // (CSA: a tile of −1 slots only is skipped)
        [[unroll]] for (uint k = 0; k < TILE; ++k) any = any || (k < nk && (kflag[k] & 1u) != 0u);
        if (!any) continue;                             // uniform: every lane read the same flags
        vec4 v[LOADS_N];                                // all loads first: one latency per tile
        [[unroll]] for (uint x = 0; x < LOADS; ++x) {
            uint e = lid + x * gl_WorkGroupSize.x, k = e / ROW;
            v[x] = vec4(0.0);
            if (k < nk && (kflag[k] & 1u) != 0u) v[x] = load4((kflag[k] & 2u) != 0u, kbase[k], 4u * (e % ROW));
        }
        [[unroll]] for (uint x = 0; x < LOADS; ++x) {
            uint e = lid + x * gl_WorkGroupSize.x;
            if (e < TILE * ROW) ks[e] = v[x];
        }
        barrier();
        // S = Q · Kᵀ over the tile: HEADS × TILE dot products of this lane's channels, then the cluster's sums
        float sc[TILE_N][HEADS_N];
        [[unroll]] for (uint k = 0; k < TILE; ++k) {
            [[unroll]] for (uint i = 0; i < HEADS; ++i) sc[k][i] = 0.0;
            [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
                vec4 kk = ks[k * ROW + lane + LANES * m];
                [[unroll]] for (uint i = 0; i < HEADS; ++i) sc[k][i] += dot(qv[i][m], kk);
            }
        }
        [[unroll]] for (uint k = 0; k < TILE; ++k)
            [[unroll]] for (uint i = 0; i < HEADS; ++i) sc[k][i] = cluster_sum(sc[k][i]);   // every lane
        // the online softmax: each head's new maximum, its running sums rescaled, P = e^(S − max)
        [[unroll]] for (uint i = 0; i < HEADS; ++i) {
            float tm = LOWEST;
            [[unroll]] for (uint k = 0; k < TILE; ++k)
                if (k < nk && (kflag[k] & 1u) != 0u) tm = max(tm, sc[k][i]);
            float mn = max(mx[i], tm), corr = exp(mx[i] - mn);
            l[i] *= corr;
            [[unroll]] for (uint m = 0; m < PER_LANE; ++m) acc[i][m] *= corr;
            [[unroll]] for (uint k = 0; k < TILE; ++k) {
                float e = k < nk && (kflag[k] & 1u) != 0u ? exp(sc[k][i] - mn) : 0.0;
                sc[k][i] = e;
                l[i] += e;
            }
            mx[i] = mn;
        }
        // O += P · V over the tile (V = K)
        [[unroll]] for (uint k = 0; k < TILE; ++k) {
            [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
                vec4 kk = ks[k * ROW + lane + LANES * m];
                [[unroll]] for (uint i = 0; i < HEADS; ++i) acc[i][m] += sc[k][i] * kk;
            }
        }
    }
    [[unroll]] for (uint i = 0; i < HEADS; ++i) {
        uint h = h0 + i * C;
        if (h >= p.H) continue;
        uint ob = p.o_off + t * p.o_s0 + h * p.o_s1;
        float inv = 1.0 / l[i];
        [[unroll]] for (uint m = 0; m < PER_LANE; ++m) {
            uint ch = 4u * (lane + LANES * m);
            [[unroll]] for (uint j = 0; j < 4; ++j)
                if (ch + j < p.hd) o[ob + ch + j] = acc[i][m][j] * inv;
        }
    }
}
