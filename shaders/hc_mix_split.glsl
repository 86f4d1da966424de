// The fp16 hi/lo split of the tensor-core mixes kernels (hc_mix_tc.comp, hc_mix_tcr.comp,
// hc_mix_fn_split.comp): x is scaled by X_SIGMA = 2⁻⁸ (so that |x| up to 2²⁴ stays in fp16's range),
// fn by 1; lo is scaled by LO = 2¹¹, which keeps it out of fp16's subnormals wherever hi is normal.
const float X_SIGMA = 1.0 / 256.0, LO = 2048.0;
// v·σ split into fp16 parts: hi = v·σ on fp16's grid and lo = (v·σ − hi)·2¹¹ (exact in fp32; rounded
// when staged). hi is rounded by integer arithmetic to 11 significant bits (multiples of 2⁻²⁴ below
// fp16's normal range), so that converting it to fp16 is exact. Not f32(f16(a)): the H200's compiler
// folds that round trip to a (unpackHalf2x16(packHalf2x16(a)) too), lo was then 0 and the sums had
// fp16's 2⁻¹¹ relative error.
void split16(vec4 v, float sigma, out vec4 hi, out vec4 lo) {
    vec4 a = v * sigma;
    vec4 normal = uintBitsToFloat((floatBitsToUint(a) + 0x1000u) & 0xFFFFE000u);   // |a| rounded, sign kept
    vec4 sub = round(a * 16777216.0) * (1.0 / 16777216.0);
    hi = mix(normal, sub, lessThan(abs(a), vec4(1.0 / 16384.0)));
    lo = (a - hi) * LO;
}
