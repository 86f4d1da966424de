// TCR's element layout (hc_mix_tcr.comp, hc_mix_fn_split.comp): which entry of its matrices each
// element of a lane is, as the device probe (hc_mix_probe.comp, hc.tcr.tcr_layout) found it. A element
// e is in row g + 8·A_H(e), column 2q + KK(A_F(e)); B element e in row g + 8·(B_F(e) >> 1), column
// 2q + (B_F(e) & 1) (lane l = 4g + q).
layout(constant_id = 2) const uint TCR_AH = 240u;     // spec constants (probed per device; these: the
layout(constant_id = 3) const uint TCR_AF = 58596u;   // H200's, hc.tcr.TCR_H200_LAYOUT)
layout(constant_id = 4) const uint TCR_BF = 228u;
#define A_H(e) ((TCR_AH >> (e)) & 1u)
#define A_F(e) ((TCR_AF >> (2u * (e))) & 3u)
#define B_F(e) ((TCR_BF >> (2u * (e))) & 3u)
#define KK(f) (((f) & 1u) + 8u * ((f) >> 1u))     // a float of the chunk → its logical column 2q + 0, 1, 8, 9
