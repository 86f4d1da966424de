// RoPE's rotation of one channel: rows whose trailing channels from `first` (even) rotate by
// interleaved pairs (c, c ^ 1), pair i = (c − first) / 2 at angle pp·θ_i (tables cos_t / sin_t
// [capacity, half], row stride tab_s0; inverse: angle −pp·θ_i). v: channel c's value, other: its
// partner's. Channels before `first` pass through; a position outside [0, capacity) gives NaN.
// The includer declares the readonly float buffers cos_t[] and sin_t[]. Used by rope.comp and by
// the kernels that rotate as they write (reduce_rows.comp and mqa_combine.comp with -D ROPE).
float rope_channel(float v, float other, uint c, uint first, int pp, uint capacity, uint cos_off, uint sin_off,
                   uint tab_s0, bool inverse) {
    if (c < first) return v;
    if (pp < 0 || uint(pp) >= capacity) return uintBitsToFloat(0x7FC00000u);
    uint i = (c - first) / 2u;
    float cs = cos_t[cos_off + uint(pp) * tab_s0 + i];
    float sn = sin_t[sin_off + uint(pp) * tab_s0 + i];
    if (inverse) sn = -sn;
    return (c & 1u) == 0u ? v * cs - other * sn : other * sn + v * cs;
}
