// The last workgroup of a set to finish: a ticket counter, so that one dispatch both computes
// partial results in many workgroups and combines them (no second dispatch, no barrier between).
//
// The includer defines LG_BINDING (the binding of the counters: a "zeroed" scratch pool, see
// OpDef.scratch) and declares the buffer its partial results go to `coherent` (so the last
// workgroup's loads see other workgroups' stores instead of a stale cache line). Each workgroup of
// a set stores its partial results, then every invocation calls last_group(c, n) (uniform control
// flow: it holds two barriers): it returns true in every invocation of the one workgroup that
// arrives n-th at counter c, false elsewhere. That workgroup may then read every partial result of
// the set; it sets the counter back to 0 (all n have arrived, nobody else touches it in this
// dispatch), so the next dispatch, after the recorder's barrier, finds it zero again.
//
// Order: each invocation's stores, then memoryBarrierBuffer() (its stores made visible before what
// follows), the workgroup barrier, then one atomic add per workgroup; the last workgroup fences
// again after its atomic before any invocation reads (the pattern of CUDA's __threadfence()
// reduction). The result never depends on which workgroup is last: the combining code reads the
// partials in a fixed order.
layout(binding = LG_BINDING) coherent buffer LastGroupCounters { uint lg_counters[]; };
shared uint lg_ticket;

bool last_group(uint c, uint n) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        uint before = atomicAdd(lg_counters[c], 1u);
        if (before == n - 1u) lg_counters[c] = 0u;
        lg_ticket = before;
        memoryBarrierBuffer();
    }
    barrier();
    bool last = lg_ticket == n - 1u;
    if (last) memoryBarrierBuffer();
    return last;
}
