// A token's running mixes sums — M ≤ 24 dot products with fn rows (M a multiple of 4, spec constant)
// and Σx² — in explicit registers: 6 vec4 and a float, never an indexed array (an array indexed
// in a loop can be placed in local memory, which turned these bandwidth kernels into local-memory
// traffic). Rows past M are dead code once M is specialised.
// The includer defines M and, for mixacc_add, VEC, dot_v(VEC, VEC) and FN(i): the fn chunk at index i
// (a buffer or shared memory), with row j of a chunk at FN(base + j·row_stride); for mixacc_put it
// includes wg_reduce.glsl first.
// MIXACC_ROWS: the rows the add functions form (default M; KSPLIT's row groups set M / RH, the rows of
// one lane, at base's row 0).
#if !defined(MIXACC_ROWS)
#define MIXACC_ROWS M
#endif
struct MixAcc { vec4 a0, a1, a2, a3, a4, a5; float ss; };

MixAcc mixacc_zero() { return MixAcc(vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), 0.0); }

#if defined(FN)
vec4 mix_rows4(VEC xv, uint base, uint sj) {
    return vec4(dot_v(xv, FN(base)), dot_v(xv, FN(base + sj)), dot_v(xv, FN(base + 2u * sj)),
                dot_v(xv, FN(base + 3u * sj)));
}

// A += x·fn[j, chunk] for every row j, and Σx² (with_ss); base: index of row 0's chunk, sj: row stride.
void mixacc_add(inout MixAcc A, VEC xv, uint base, uint sj, bool with_ss) {
    if (with_ss) A.ss += dot_v(xv, xv);
    A.a0 += mix_rows4(xv, base, sj);
    if (MIXACC_ROWS > 4u) A.a1 += mix_rows4(xv, base + 4u * sj, sj);
    if (MIXACC_ROWS > 8u) A.a2 += mix_rows4(xv, base + 8u * sj, sj);
    if (MIXACC_ROWS > 12u) A.a3 += mix_rows4(xv, base + 12u * sj, sj);
    if (MIXACC_ROWS > 16u) A.a4 += mix_rows4(xv, base + 16u * sj, sj);
    if (MIXACC_ROWS > 20u) A.a5 += mix_rows4(xv, base + 20u * sj, sj);
}

// mix_rows4 for two tokens at once: each fn chunk is loaded once for both (half the fn loads per
// product where fn comes from shared memory); the same sums in the same order as mix_rows4.
void mix_rows4_2(VEC xa, VEC xb, uint base, uint sj, inout vec4 a, inout vec4 b) {
    VEC f0 = FN(base), f1 = FN(base + sj), f2 = FN(base + 2u * sj), f3 = FN(base + 3u * sj);
    a += vec4(dot_v(xa, f0), dot_v(xa, f1), dot_v(xa, f2), dot_v(xa, f3));
    b += vec4(dot_v(xb, f0), dot_v(xb, f1), dot_v(xb, f2), dot_v(xb, f3));
}

// mixacc_add(A, xa, ...) and mixacc_add(B, xb, ...) with the fn chunks loaded once (Σx² included).
void mixacc_add2(inout MixAcc A, inout MixAcc B, VEC xa, VEC xb, uint base, uint sj) {
    A.ss += dot_v(xa, xa);
    B.ss += dot_v(xb, xb);
    mix_rows4_2(xa, xb, base, sj, A.a0, B.a0);
    if (MIXACC_ROWS > 4u) mix_rows4_2(xa, xb, base + 4u * sj, sj, A.a1, B.a1);
    if (MIXACC_ROWS > 8u) mix_rows4_2(xa, xb, base + 8u * sj, sj, A.a2, B.a2);
    if (MIXACC_ROWS > 12u) mix_rows4_2(xa, xb, base + 12u * sj, sj, A.a3, B.a3);
    if (MIXACC_ROWS > 16u) mix_rows4_2(xa, xb, base + 16u * sj, sj, A.a4, B.a4);
    if (MIXACC_ROWS > 20u) mix_rows4_2(xa, xb, base + 20u * sj, sj, A.a5, B.a5);
}

// mix_rows4 for four tokens: each fn chunk loaded once serves four products.
void mix_rows4_4(VEC xa, VEC xb, VEC xc, VEC xe, uint base, uint sj, inout vec4 a, inout vec4 b, inout vec4 c,
                 inout vec4 e) {
    VEC f0 = FN(base), f1 = FN(base + sj), f2 = FN(base + 2u * sj), f3 = FN(base + 3u * sj);
    a += vec4(dot_v(xa, f0), dot_v(xa, f1), dot_v(xa, f2), dot_v(xa, f3));
    b += vec4(dot_v(xb, f0), dot_v(xb, f1), dot_v(xb, f2), dot_v(xb, f3));
    c += vec4(dot_v(xc, f0), dot_v(xc, f1), dot_v(xc, f2), dot_v(xc, f3));
    e += vec4(dot_v(xe, f0), dot_v(xe, f1), dot_v(xe, f2), dot_v(xe, f3));
}

// mixacc_add for four tokens with the fn chunks loaded once (the same sums in the same order).
void mixacc_add4(inout MixAcc A, inout MixAcc B, inout MixAcc C, inout MixAcc E, VEC xa, VEC xb, VEC xc,
                 VEC xe, uint base, uint sj) {
    A.ss += dot_v(xa, xa); B.ss += dot_v(xb, xb); C.ss += dot_v(xc, xc); E.ss += dot_v(xe, xe);
    mix_rows4_4(xa, xb, xc, xe, base, sj, A.a0, B.a0, C.a0, E.a0);
    if (MIXACC_ROWS > 4u) mix_rows4_4(xa, xb, xc, xe, base + 4u * sj, sj, A.a1, B.a1, C.a1, E.a1);
    if (MIXACC_ROWS > 8u) mix_rows4_4(xa, xb, xc, xe, base + 8u * sj, sj, A.a2, B.a2, C.a2, E.a2);
    if (MIXACC_ROWS > 12u) mix_rows4_4(xa, xb, xc, xe, base + 12u * sj, sj, A.a3, B.a3, C.a3, E.a3);
    if (MIXACC_ROWS > 16u) mix_rows4_4(xa, xb, xc, xe, base + 16u * sj, sj, A.a4, B.a4, C.a4, E.a4);
    if (MIXACC_ROWS > 20u) mix_rows4_4(xa, xb, xc, xe, base + 20u * sj, sj, A.a5, B.a5, C.a5, E.a5);
}
#endif

// Value k (k < M: mix k, k = M: Σx²) — for constant k, or a k known only at run time (a select).
float mixacc_at(MixAcc A, uint k) {
    if (k == M) return A.ss;
    vec4 v = k < 4u ? A.a0 : k < 8u ? A.a1 : k < 12u ? A.a2 : k < 16u ? A.a3 : k < 20u ? A.a4 : A.a5;
    uint i = k & 3u;
    return i == 0u ? v.x : i == 1u ? v.y : i == 2u ? v.z : v.w;
}

#if defined(WG_NV_MAX)
#if defined(MIXACC_TRANSPOSE)
#extension GL_KHR_shader_subgroup_shuffle : require
// The subgroup's M + 1 sums by a transposing butterfly (the includer enables subgroup shuffles):
// the 8 vec4 slots (a0..a5, (ss, 0, 0, 0), 0) are halved at each of lane bits 0, 1, 2 — a lane keeps
// one half and adds its neighbour's copy of that half — so after 7 vec4 shuffles lane l holds slot
// q = 4·bit0 + 2·bit1 + bit2 summed over its 8 lanes, and the remaining bits are plain butterfly
// steps on one vec4: 7 + log2(subgroup / 8) vec4 shuffles for all 25 sums, against 5 per vec4
// (35) for seven subgroupAdds, and eight lanes store at once. Full subgroups of at least 8 lanes.
vec4 mixacc_swap_add(bool upper, vec4 lo, vec4 hi, uint mask) {
    return (upper ? hi : lo) + subgroupShuffleXor(upper ? lo : hi, mask);
}

void mixacc_put_transposed(MixAcc A) {
    uint l = gl_SubgroupInvocationID;
    bool b0 = (l & 1u) != 0u, b1 = (l & 2u) != 0u, b2 = (l & 4u) != 0u;
    vec4 s6 = vec4(A.ss, 0.0, 0.0, 0.0);
    vec4 k0 = mixacc_swap_add(b0, A.a0, A.a4, 1u), k1 = mixacc_swap_add(b0, A.a1, A.a5, 1u);
    vec4 k2 = mixacc_swap_add(b0, A.a2, s6, 1u), k3 = mixacc_swap_add(b0, A.a3, vec4(0.0), 1u);
    vec4 m0 = mixacc_swap_add(b1, k0, k2, 2u), m1 = mixacc_swap_add(b1, k1, k3, 2u);
    vec4 v = mixacc_swap_add(b2, m0, m1, 4u);
    for (uint o = 8u; o < gl_SubgroupSize; o <<= 1u) v += subgroupShuffleXor(v, o);
    uint q = (b0 ? 4u : 0u) + (b1 ? 2u : 0u) + (b2 ? 1u : 0u);
    uint b = gl_SubgroupID * WG_NV_MAX;
    if (l < 8u && q < M / 4u) {
        wg_red[b + 4u * q] = v.x;
        wg_red[b + 4u * q + 1u] = v.y;
        wg_red[b + 4u * q + 2u] = v.z;
        wg_red[b + 4u * q + 3u] = v.w;
    } else if (l < 8u && q == 6u) {
        wg_red[b + M] = v.x;
    }
}
#endif

// wg_reduce.glsl's first step for all M + 1 sums at once: seven vector subgroupAdds back to back,
// then one elected store of the subgroup's 25 values (not 25 reductions each behind its own branch).
void mixacc_put(MixAcc A) {
#if defined(MIXACC_TRANSPOSE)
    // (uniform) the butterfly reads every lane of the subgroup: a workgroup smaller than the subgroup,
    // or not a multiple of it, may leave lanes inactive, whose shuffled values are undefined
    if (gl_SubgroupSize >= 8u && gl_WorkGroupSize.x % gl_SubgroupSize == 0u) {
        mixacc_put_transposed(A);
        return;
    }
#endif
    A.a0 = subgroupAdd(A.a0);
    if (M > 4u) A.a1 = subgroupAdd(A.a1);
    if (M > 8u) A.a2 = subgroupAdd(A.a2);
    if (M > 12u) A.a3 = subgroupAdd(A.a3);
    if (M > 16u) A.a4 = subgroupAdd(A.a4);
    if (M > 20u) A.a5 = subgroupAdd(A.a5);
    A.ss = subgroupAdd(A.ss);
    if (subgroupElect())
        for (uint k = 0u; k <= M; ++k) wg_red[gl_SubgroupID * WG_NV_MAX + k] = mixacc_at(A, k);
}
#endif
