#version 450
#extension GL_GOOGLE_include_directive : require
//! variants: - | OVERLAP ; - | NEW_ROWS
// COMPRESS: the KV compressor of DeepSeek-V4's compressed layers. state [rows, 2·W] holds per
// position the projections c (channels [0, W)) and the gate logits z (channels [W, 2W)), written
// by STORE_ROWS (a ring: position q in row q % rows, rows ≥ the 2·RATE (CSA) or RATE (HCA) rows a
// window reads plus the chunk); W = d (HCA) or 2d (CSA, OVERLAP). For each chunk token t at p = pos[0] + t that
// closes a window ((p + 1) % RATE == 0), entry w = (p + 1)/RATE − 1 of `out` [*, d] becomes
//   e[ch] = Σ_slots softmax_slots(z + ape)[ch] · c[ch]             (per channel)
//   HCA: slots = rows w·RATE + j, channel ch, ape[j, ch]
//   CSA: slots = rows (w−1)·RATE + j at channel ch (ape[j, ch]; absent for w = 0), then rows
//        w·RATE + j at channel d + ch (ape[j, d + ch])
//   entry = RoPE(RMSNorm(e) · norm_w) on the trailing 2·half channels at position w·RATE.
// Tokens that close no window write nothing (decode: most steps). Lanes: one workgroup per chunk
// token (a power of two ≤ 256 invocations: a channel's slots are a chain of memory latencies, so
// the fewer channels an invocation walks the shorter the step); invocation l pools channels l,
// l + WG, ... into shared memory, then a shared-memory sum of squares, then norm + RoPE per pair.
// -D NEW_ROWS: the chunk's projections xs [T, 2·W] (binding 7) are stored into the state here
// (each token's workgroup its row, as STORE_ROWS would: a dispatch fewer), and a window reads
// this chunk's positions from xs, earlier ones from the state: no workgroup reads a row another
// writes in this dispatch (the ring holds the rows a chunk reads back besides those it writes).
// Push: T, d, capacity, half, n_out, rows, st (off, s0), ape (off, s0), norm_off, out (off, s0),
// pos_off, cos_off, sin_off, tab_s0, eps; NEW_ROWS: xs (off, s0).
#include "common.glsl"
#if defined(NEW_ROWS)
layout(binding = 0) buffer S { float st[]; };
layout(binding = 7) readonly buffer Xs { float xs[]; };
#else
layout(binding = 0) readonly buffer S { float st[]; };
#endif
layout(binding = 1) readonly buffer A { float ape[]; };
layout(binding = 2) readonly buffer Nw { float nw[]; };
layout(binding = 3) readonly buffer Pos { int pos[]; };
layout(binding = 4) readonly buffer Cos { float cos_t[]; };
layout(binding = 5) readonly buffer Sin { float sin_t[]; };
layout(binding = 6) buffer O { float o[]; };
layout(push_constant) uniform P {
    uint T, d, capacity, half_rd, n_out, rows;
    uint s_off, s_s0, a_off, a_s0, n_off, o_off, o_s0;
    uint pos_off, cos_off, sin_off, tab_s0;
    float eps;
#if defined(NEW_ROWS)
    uint x_off, x_s0;
#endif
} p;

layout(constant_id = 1) const uint RATE = 4;     // the compression rate m
layout(constant_id = 2) const uint D_MAX = 512;  // the entry width d
shared float pooled[D_MAX];
shared float part[256];

#if defined(OVERLAP)
const uint W_MULT = 2;
#else
const uint W_MULT = 1;
#endif

int chunk_pos;      // pos[0], the chunk's first position

// Channel ch of position q's state row (q ≤ this token's position, so at most this chunk's last).
float st_at(uint q, uint ch) {
#if defined(NEW_ROWS)
    // Both loads unconditional, the value selected after: behind a branch the loads of a window
    // were issued one memory latency at a time. For this chunk's rows the
    // state load reads the row after the chunk's, which no workgroup writes in this dispatch.
    int k = int(q) - chunk_pos;
    uint row = k >= 0 ? (uint(max(chunk_pos, 0)) + p.T) % p.rows : q % p.rows;
    float s = st[p.s_off + row * p.s_s0 + ch];
    float x = xs[p.x_off + uint(clamp(k, 0, int(p.T) - 1)) * p.x_s0 + ch];
    return k >= 0 ? x : s;
#else
    return st[p.s_off + (q % p.rows) * p.s_s0 + ch];
#endif
}

void main() {
    uint t = flat_group();
    uint l = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    chunk_pos = pos[p.pos_off];
    int pp = chunk_pos + int(t);
#if defined(NEW_ROWS)
    if (t < p.T && pp >= 0 && uint(pp) < p.capacity)
        for (uint c = l; c < 2u * W_MULT * p.d; c += wg)
            st[p.s_off + (uint(pp) % p.rows) * p.s_s0 + c] = xs[p.x_off + t * p.x_s0 + c];
#endif
    // uniform per workgroup: leave together, before any barrier
    if (t >= p.T || pp < 0 || uint(pp) >= p.capacity || (uint(pp) + 1) % RATE != 0) return;
    uint w = (uint(pp) + 1) / RATE - 1;
    if (w >= p.n_out) return;
    uint W = W_MULT * p.d;
    float ss = 0.0;
    for (uint ch = l; ch < p.d; ch += wg) {
        float mx = -3.402823466e38;
#if defined(OVERLAP)
        if (w > 0)
            for (uint j = 0; j < RATE; ++j)
                mx = max(mx, st_at((w - 1) * RATE + j, W + ch) + ape[p.a_off + j * p.a_s0 + ch]);
        uint cur = p.d;                                 // the current window's channels
#else
        uint cur = 0;
#endif
        for (uint j = 0; j < RATE; ++j)
            mx = max(mx, st_at(w * RATE + j, W + cur + ch) + ape[p.a_off + j * p.a_s0 + cur + ch]);
        float den = 0.0, num = 0.0;
#if defined(OVERLAP)
        if (w > 0)
            for (uint j = 0; j < RATE; ++j) {
                uint q = (w - 1) * RATE + j;
                float e = exp(st_at(q, W + ch) + ape[p.a_off + j * p.a_s0 + ch] - mx);
                den += e;
                num += e * st_at(q, ch);
            }
#endif
        for (uint j = 0; j < RATE; ++j) {
            uint q = w * RATE + j;
            float e = exp(st_at(q, W + cur + ch) + ape[p.a_off + j * p.a_s0 + cur + ch] - mx);
            den += e;
            num += e * st_at(q, cur + ch);
        }
        float v = num / den;
        pooled[ch] = v;
        ss += v * v;
    }
    part[l] = ss;
    barrier();
    for (uint s = wg / 2; s > 0; s >>= 1) {
        if (l < s) part[l] += part[l + s];
        barrier();
    }
    float r = inversesqrt(part[0] / float(p.d) + p.eps);
    uint first = p.d / 2 - p.half_rd;                   // the first rotated pair
    uint row = w * RATE;
    uint ob = p.o_off + w * p.o_s0;
    for (uint c = l; c < p.d / 2; c += wg) {
        vec2 a = vec2(pooled[2 * c] * r * nw[p.n_off + 2 * c], pooled[2 * c + 1] * r * nw[p.n_off + 2 * c + 1]);
        if (c >= first) {
            float cs = cos_t[p.cos_off + row * p.tab_s0 + c - first];
            float sn = sin_t[p.sin_off + row * p.tab_s0 + c - first];
            a = vec2(a.x * cs - a.y * sn, a.x * sn + a.y * cs);
        }
        o[ob + 2 * c] = a.x;
        o[ob + 2 * c + 1] = a.y;
    }
}
