// The merge of MQA_ATTENTION's SPLITS partial results with the head's sink, one formula for
// mqa_combine.comp (a dispatch of its own) and mqa_attention.comp -D MERGE (the last workgroup of a
// token's head group, same dispatch), so the two forms agree. A part holds acc[hd] (unnormalised),
// its running max and its sum; with M = max(sink, max_s) and f_s = e^(max_s − M) (an empty part has
// max = LOWEST, so f_s = 0):
//   out[c] = Σ_s f_s·acc_s[c] / (e^(sink − M) + Σ_s f_s·sum_s), the parts taken in split order
// (so the result never depends on which workgroup merges). The loops over parts unroll (SPLITS is a
// specialization constant), so every part's load of a channel (group) is issued together.
// The includer declares the spec constant SPLITS, defines MERGE_T (float, or vec4 for four channels
// at a time) and, before including, the loads of the part whose row starts at element r:
//   float merge_max(uint r), float merge_sum(uint r), MERGE_T merge_acc(uint r, uint c) (channel c,
//   or c .. c + 3).
// b: the first part's row; stride: elements from one part's row to the next.

// The parts' weights f (out) and the denominator (returned).
float merge_weights(uint b, uint stride, float sink, out float f[SPLITS]) {
    float m[SPLITS];
    float M = sink;
    [[unroll]] for (uint s = 0; s < SPLITS; ++s) {
        m[s] = merge_max(b + s * stride);
        M = max(M, m[s]);
    }
    float den = exp(sink - M);
    [[unroll]] for (uint s = 0; s < SPLITS; ++s) {
        f[s] = exp(m[s] - M);
        den += f[s] * merge_sum(b + s * stride);
    }
    return den;
}

// Channel c (or channels c .. c + 3) of the merged output.
MERGE_T merge_channels(uint b, uint stride, float f[SPLITS], float den, uint c) {
    MERGE_T num = MERGE_T(0.0);
    [[unroll]] for (uint s = 0; s < SPLITS; ++s) num += f[s] * merge_acc(b + s * stride, c);
    return num / den;
}
