// The merge of MQA_ATTENTION's SPLITS partial results with the head's sink, one formula for
// mqa_combine.comp (a dispatch of its own) and mqa_attention.comp -D MERGE (the last workgroup of a
// token's head group, same dispatch), so the two forms agree. A part holds acc[hd] (unnormalised),
// its running max and its sum; with M = max(sink, max_s) and f_s = e^(max_s − M) (an empty part has
// max = LOWEST, so f_s = 0):
//   out[c] = Σ_s f_s·acc_s[c] / (e^(sink − M) + Σ_s f_s·sum_s), the parts taken in split order
// (so the result never depends on which workgroup merges). The loops over parts go MERGE_STEP parts
// at a time, unrolled (SPLITS and MERGE_STEP are constants), so those parts' loads of a channel
// (group) are issued together; a step of every part (MERGE_STEP = SPLITS) holds the most loads in
// flight, a shorter one fewer registers; the parts' maxima and sums (one float each) go
// MERGE_STATS_STEP parts at a time. An invocation may merge MERGE_N channels (or vec4s) at once:
// one e^(max_s − M) per part for them all.
// The includer declares the constants SPLITS, MERGE_STEP, MERGE_STATS_STEP and MERGE_N, defines MERGE_T (float, or
// vec4 for four channels at a time) and, before including, the loads of the part whose row starts
// at r: float merge_max(uint r), float merge_sum(uint r), MERGE_T merge_acc(uint r, uint c)
// (channel c, or c .. c + 3; it returns zeros past the row's channels).
// b: the first part's row; stride: elements from one part's row to the next.

// (M, the denominator) of the parts from row b.
vec2 merge_scale(uint b, uint stride, float sink) {
    float M = sink;
    for (uint s0 = 0; s0 < SPLITS; s0 += MERGE_STATS_STEP)
        [[unroll]] for (uint k = 0; k < MERGE_STATS_STEP; ++k)
            if (s0 + k < SPLITS) M = max(M, merge_max(b + (s0 + k) * stride));
    float den = exp(sink - M);
    for (uint s0 = 0; s0 < SPLITS; s0 += MERGE_STATS_STEP)
        [[unroll]] for (uint k = 0; k < MERGE_STATS_STEP; ++k) {
            uint r = b + (s0 + k) * stride;
            if (s0 + k < SPLITS) den += exp(merge_max(r) - M) * merge_sum(r);
        }
    return vec2(M, den);
}

// MERGE_N channels (or vec4s of them) of the merged output, c + j·cstride for j < MERGE_N, into v;
// md: merge_scale's (M, denominator). Each part's weight is computed once for all of them.
void merge_channels(uint b, uint stride, vec2 md, uint c, uint cstride, out MERGE_T v[MERGE_N]) {
    MERGE_T num[MERGE_N];
    [[unroll]] for (uint j = 0; j < MERGE_N; ++j) num[j] = MERGE_T(0.0);
    for (uint s0 = 0; s0 < SPLITS; s0 += MERGE_STEP)
        [[unroll]] for (uint k = 0; k < MERGE_STEP; ++k) {
            uint r = b + (s0 + k) * stride;
            if (s0 + k < SPLITS) {
                float f = exp(merge_max(r) - md.x);
                [[unroll]] for (uint j = 0; j < MERGE_N; ++j) num[j] += f * merge_acc(r, c + j * cstride);
            }
        }
    [[unroll]] for (uint j = 0; j < MERGE_N; ++j) v[j] = num[j] / md.y;
}
