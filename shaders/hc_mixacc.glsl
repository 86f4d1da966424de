// A token's running mixes sums — M ≤ 24 dot products with fn rows (M a multiple of 4, spec constant)
// and Σx² — in explicit registers: 6 vec4 and a float, never an indexed array (an array indexed
// in a loop can be placed in local memory, which turned these bandwidth kernels into local-memory
// traffic). Rows past M are dead code once M is specialised.
// The includer defines VEC, dot_v(VEC, VEC), M, and FN(i): the fn chunk at index i (a buffer or
// shared memory), with row j of a chunk at FN(base + j·row_stride).
struct MixAcc { vec4 a0, a1, a2, a3, a4, a5; float ss; };

MixAcc mixacc_zero() { return MixAcc(vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0), 0.0); }

vec4 mix_rows4(VEC xv, uint base, uint sj) {
    return vec4(dot_v(xv, FN(base)), dot_v(xv, FN(base + sj)), dot_v(xv, FN(base + 2u * sj)),
                dot_v(xv, FN(base + 3u * sj)));
}

// A += x·fn[j, chunk] for every row j, and Σx² (with_ss); base: index of row 0's chunk, sj: row stride.
void mixacc_add(inout MixAcc A, VEC xv, uint base, uint sj, bool with_ss) {
    if (with_ss) A.ss += dot_v(xv, xv);
    A.a0 += mix_rows4(xv, base, sj);
    if (M > 4u) A.a1 += mix_rows4(xv, base + 4u * sj, sj);
    if (M > 8u) A.a2 += mix_rows4(xv, base + 8u * sj, sj);
    if (M > 12u) A.a3 += mix_rows4(xv, base + 12u * sj, sj);
    if (M > 16u) A.a4 += mix_rows4(xv, base + 16u * sj, sj);
    if (M > 20u) A.a5 += mix_rows4(xv, base + 20u * sj, sj);
}

// Value k (k < M: mix k, k = M: Σx²) — for constant k, or a k known only at run time (a select).
float mixacc_at(MixAcc A, uint k) {
    if (k == M) return A.ss;
    vec4 v = k < 4u ? A.a0 : k < 8u ? A.a1 : k < 12u ? A.a2 : k < 16u ? A.a3 : k < 20u ? A.a4 : A.a5;
    uint i = k & 3u;
    return i == 0u ? v.x : i == 1u ? v.y : i == 2u ? v.z : v.w;
}
