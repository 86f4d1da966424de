// x rows staged in shared memory for the X_SHARED kernels (mul_mat.comp, mul_mat_id.comp). The
// includer declares x4 (x as vec4s), with NORM_X g4 (the norm weight) and p.g_off, p.K, the
// specialization constant XS (vec4s of a staged row) and `shared vec4 xs[]`, and includes
// weights.glsl first (Q_XV: the vec4s of x a uvec4 of codes covers).
// Layout: vec4 c of uvec4 j's inputs of staged row m at xs[m·XS + c·KU + j] (KU uvec4s of codes a
// row), so that consecutive lanes, at consecutive uvec4s, read consecutive vec4s; zeros past K.
const uint STAGE_UNROLL = 8u;           // loads an invocation issues together (x comes from L2)

// Stages the x rows starting at elements xb0 + m·xs1 (m < n, 16-byte aligned) as rows m, x·g with
// NORM_X; returns this invocation's share of their Σx².
float stage_x(uint xb0, uint xs1, uint n, uint KU) {
    float s2 = 0.0;
    uint total = n * XS, W = gl_WorkGroupSize.x;
    for (uint q0 = gl_LocalInvocationID.x; q0 < total; q0 += STAGE_UNROLL * W) {
        vec4 v[STAGE_UNROLL];
#if defined(NORM_X)
        vec4 gv[STAGE_UNROLL];
#endif
        [[unroll]] for (uint u = 0; u < STAGE_UNROLL; ++u) {
            uint q = q0 + u * W, m = q / XS, i = q - m * XS;
            v[u] = vec4(0.0);
            if (q < total && 4u * i < p.K) {
                v[u] = x4[(xb0 + m * xs1) / 4u + i];
#if defined(NORM_X)
                gv[u] = g4[p.g_off / 4u + i];
#endif
            }
        }
        [[unroll]] for (uint u = 0; u < STAGE_UNROLL; ++u) {
            uint q = q0 + u * W, m = q / XS, i = q - m * XS;
            if (q < total) {
#if defined(NORM_X)
                if (4u * i < p.K) {
                    s2 += dot(v[u], v[u]);
                    v[u] *= gv[u];
                }
#endif
                xs[m * XS + (i % Q_XV) * KU + i / Q_XV] = v[u];
            }
        }
    }
    return s2;
}
