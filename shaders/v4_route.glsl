// DeepSeek-V4's router after the logits, shared by V4_ROUTE (v4_route.comp) and the fused gate
// V4_GATE (v4_gate.comp, the same selection on logits its workgroups computed): scoring, the
// candidate order, the hash table's picks, softmax's statistics, the one-pass ranking (-D RANK)
// and the routes' weights and stores.
// The includer defines SCORE_SQRTSOFTPLUS | SCORE_SIGMOID | SCORE_SOFTMAX, optionally HASH, RANK,
// SERIAL; the macro ROUTE_LOGIT(t, e) (expert e's logit of token t); the constant TOP_K; the
// buffers bias[] (or, with HASH, tid[] and ids[]) and o[]; and a push block p with E, sel_off,
// tid_s0, ids_off, o_off, o_s0, o_s1, o_s2 and route_scale (v4_route.comp's header says what each is).
// Without SERIAL it needs the subgroup extensions (basic, arithmetic) and a workgroup of whole
// subgroups, at most 64 of them.

#if defined(SCORE_SQRTSOFTPLUS)
// log(1 + u) for 0 ≤ u ≤ 1 to f32's relative precision without log(): 1 + u rounds away u's low
// digits and Vulkan's log() is held only to an absolute 2^-21 near 1, so for small u both lose
// most of the result. log(1 + u) = 2·atanh(s), s = u / (2 + u) ≤ 1/3: its odd series through s^15
// (the next term is below 2^-29 of the value).
float log_1p(float u) {
    float s = u / (2.0 + u), z = s * s;
    float q = 1.0 / 15.0;
    q = q * z + 1.0 / 13.0;
    q = q * z + 1.0 / 11.0;
    q = q * z + 1.0 / 9.0;
    q = q * z + 1.0 / 7.0;
    q = q * z + 1.0 / 5.0;
    q = q * z + 1.0 / 3.0;
    return 2.0 * s * (q * z + 1.0);
}
#endif

float score(uint t, uint e, float mx, float den) {
    float x = ROUTE_LOGIT(t, e);
#if defined(SCORE_SQRTSOFTPLUS)
    return sqrt(max(x, 0.0) + log_1p(exp(-abs(x))));        // softplus without overflow or cancellation
#elif defined(SCORE_SIGMOID)
    return 1.0 / (1.0 + exp(-x));
#else
    return exp(x - mx) / den;
#endif
}

#if defined(HASH)
// Route r of token t from the hash table: tid2eid[ids[t], r], −1 when it is no expert.
int hash_pick(uint t, uint r) {
    int e = tid[p.sel_off + uint(ids[p.ids_off + t]) * p.tid_s0 + r];
    return (e >= 0 && uint(e) < p.E) ? e : -1;
}
#endif

// Whether candidate (v, e) ranks before (w, f): a number before NaN, the larger value, then the
// lower id; e < 0 is no candidate.
bool before(float v, int e, float w, int f) {
    if (e < 0) return false;
    if (f < 0) return true;
    bool nv = isnan(v), nw = isnan(w);
    if (nv != nw) return nw;
    if (!nv && v != w) return v > w;
    return e < f;
}

#if !defined(SERIAL)
shared float red_v[64];          // per subgroup (≤ 64 of them): best value / running reduction
shared int red_e[64];            // per subgroup: best expert
shared int picks[64];            // the experts taken so far (TOP_K ≤ 64)
#endif

#if defined(SCORE_SOFTMAX) && !defined(SERIAL)
// Max, then Σ exp(x − max), over the token's experts: subgroup steps, then the subgroups in order.
// Every invocation of the workgroup calls it (barriers).
void softmax_stats(uint t, out float mx, out float den) {
    uint lid = gl_LocalInvocationID.x;
    float m = -3.402823466e38;
    for (uint e = lid; e < p.E; e += gl_WorkGroupSize.x) m = max(m, ROUTE_LOGIT(t, e));
    m = subgroupMax(m);
    if (subgroupElect()) red_v[gl_SubgroupID] = m;
    barrier();
    mx = red_v[0];
    for (uint i = 1u; i < gl_NumSubgroups; ++i) mx = max(mx, red_v[i]);
    barrier();
    float s = 0.0;
    for (uint e = lid; e < p.E; e += gl_WorkGroupSize.x) s += exp(ROUTE_LOGIT(t, e) - mx);
    s = subgroupAdd(s);
    if (subgroupElect()) red_v[gl_SubgroupID] = s;
    barrier();
    den = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) den += red_v[i];
    barrier();
}
#endif

#if defined(RANK)
const uint RANK_MAX = 256;       // experts (the host checks; ≤ the workgroup)
shared float rank_v[RANK_MAX];   // score + bias of every expert
shared float rank_s[RANK_MAX];   // its score (the picks' weights read it back: no second load)

// The one-pass ranking (at most RANK_MAX experts, one per invocation; every invocation calls it):
// each scores its expert once, the scores meet in shared memory (one barrier), and each counts the
// experts that rank before its own: an expert whose rank is below TOP_K is pick `rank` (the order
// is strict, so the ranks are distinct). picks[r] is the r-th expert after it (−1 past E).
void rank_select(uint t, float mx, float den) {
    uint lid = gl_LocalInvocationID.x;
    if (lid < TOP_K) picks[lid] = -1;          // (E < TOP_K: routes past E stay no expert)
    float own = 0.0;
    if (lid < p.E) {
        float sc = score(t, lid, mx, den);
        own = sc + bias[p.sel_off + lid];
        rank_v[lid] = own;
        rank_s[lid] = sc;
    }
    barrier();
    if (lid < p.E) {
        uint rank = 0u, f = 0u;
        for (; f + 4u <= p.E; f += 4u) {       // 4 shared loads issued together
            float v0 = rank_v[f], v1 = rank_v[f + 1u], v2 = rank_v[f + 2u], v3 = rank_v[f + 3u];
            rank += (before(v0, int(f), own, int(lid)) ? 1u : 0u) + (before(v1, int(f + 1u), own, int(lid)) ? 1u : 0u)
                  + (before(v2, int(f + 2u), own, int(lid)) ? 1u : 0u) + (before(v3, int(f + 3u), own, int(lid)) ? 1u : 0u);
        }
        for (; f < p.E; ++f) rank += before(rank_v[f], int(f), own, int(lid)) ? 1u : 0u;
        if (rank < TOP_K) picks[rank] = int(lid);
    }
    barrier();
}
#endif

// Token t's routes from its picks route_pick[r] (the caller's, in one invocation; −1: no expert):
// weights sc[id] / (Σ sc[picked] + 1e-20) · route_scale, the shared expert (id E, weight 1) last.
// With RANK the scores are read back from the ranking's shared memory.
int route_pick[TOP_K];                          // (unrolled loops: constant indices, registers)

void store_routes(uint t, float mx, float den) {
    float wsum = 0.0, w[TOP_K];
    [[unroll]] for (uint r = 0u; r < TOP_K; ++r) {
        int e = route_pick[r];
#if defined(RANK)
        w[r] = e >= 0 ? rank_s[e] : 0.0;
#else
        w[r] = e >= 0 ? score(t, uint(e), mx, den) : 0.0;
#endif
        wsum += w[r];
    }
    float f = p.route_scale / (wsum + 1e-20);
    uint ob = p.o_off + t * p.o_s0;
    [[unroll]] for (uint r = 0u; r < TOP_K; ++r) {
        // an invalid id (a bad tid2eid entry) stays −1: MUL_MAT_ID then writes NaN for the token
        o[ob + r * p.o_s1] = float(route_pick[r]);
        o[ob + r * p.o_s1 + p.o_s2] = route_pick[r] >= 0 ? w[r] * f : 0.0;
    }
    o[ob + TOP_K * p.o_s1] = float(p.E);
    o[ob + TOP_K * p.o_s1 + p.o_s2] = 1.0;
}
