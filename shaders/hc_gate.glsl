// A hyper-connection gate from its mix, shared by HC_COEFS / HC_SITE (through hc_math.glsl) and
// HC_PRE_GATE (hc_pre.comp -D GATE), so that every path forms the gates identically.
// pre (j < 4): sigmoid(mix·scale + base) + eps; post: 2·sigmoid(mix·scale + base).
float hc_gate(float mix, float scale, float base, bool is_pre, float eps) {
    float s = 1.0 / (1.0 + exp(-(mix * scale + base)));
    return is_pre ? s + eps : 2.0 * s;
}
