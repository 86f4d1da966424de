// Power-of-two row scales of the fp16 matrix-unit kernels (mul_mat_coopmat.comp, mul_mat_id_coopmat.comp).
// fp16 holds 2⁻²⁴..65504, f32 values much more, so a row (all of K) is multiplied by 2^s before it is
// rounded to fp16, s = row_shift(m) = min(15 − e, 126) with 2^(e−1) ≤ m < 2^e, m the row's largest
// finite |value|: m·2^s < 2¹⁵ ≤ 65504 and values down to m·2⁻²⁹ stay normal fp16 (11 significant
// bits); a power of two is exact, so fp16's rounding (2⁻¹¹ relative) is the only one. inf and NaN are
// left out of m (finite_abs): they stay inf / NaN through the scale. A product of two scaled rows is
// multiplied back by 2^−(sx+sw) in f32 (unscale: factors each within f32's normal range).
// Folded scale bytes (FP8 / FP4 weights): a row whose codes carry E8M0 scale bytes s is staged as the
// codes' exact halves times 2^(EXP + s − smax) (smax the row's largest byte), its shift TOP − smax:
// FP4 (E2M1 halves code · 2⁻¹⁴) at most 6·2¹³, every nonzero value normal where s ≥ smax − 26; FP8
// (E4M3 halves code · 2⁻⁸) at most 448·2⁷ = 57344, normal where s ≥ smax − 12. A row whose bytes span
// more is flagged (shift + FOLD_FLAG) and its products summed in f32 from the dequantised weights.
float pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23); }     // 2^e, −126 ≤ e ≤ 127
float finite_abs(float v) {                     // |v|, or 0 for inf / NaN
    float a = abs(v);
    return a <= uintBitsToFloat(0x7F7FFFFFu) ? a : 0.0;
}
float finite_max(vec4 v) { return max(max(finite_abs(v.x), finite_abs(v.y)), max(finite_abs(v.z), finite_abs(v.w))); }
float finite_max(mat2x4 v) { return max(finite_max(v[0]), finite_max(v[1])); }
int row_shift(float m) {                        // min(15 − e, 126), 2^(e−1) ≤ m < 2^e (m finite ≥ 0)
    return min(15 - (int(floatBitsToUint(m) >> 23) - 126), 126);
}
float unscale(float v, int s) {                 // v · 2^−s, −240 ≤ s ≤ 270: three factors in f32's normal range
    int a = s / 3, b = (s - a) / 2;
    return v * pow2(-a) * pow2(-b) * pow2(a + b - s);
}
const int FP4_FOLD_TOP = 140, FP4_FOLD_SPREAD = 26, FP4_FOLD_EXP = 27;
const int FP8_FOLD_TOP = 134, FP8_FOLD_SPREAD = 12, FP8_FOLD_EXP = 15;
const int FOLD_FLAG = 4096;
// the folded shift of a row whose scale bytes lie in lo..hi (flagged past `spread` binades)
int fold_shift_of(uint lo, uint hi, int top, int spread) {
    return top - int(hi) + (int(hi) - int(lo) > spread ? FOLD_FLAG : 0);
}
bool fold_flagged(int s) { return s >= FOLD_FLAG / 2; }
int fold_unflag(int s) { return fold_flagged(s) ? s - FOLD_FLAG : s; }
