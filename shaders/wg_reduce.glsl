// Sums of WG_NV floats across a whole workgroup: subgroupAdd per value, then one shared-memory
// step (a single barrier) across the workgroup's subgroups.
//   for (k < WG_NV) wg_put(k, v[k]);  barrier();  total_k = wg_total(k)
// The includer defines WG_NV (a constant or specialization-constant expression) and includes
// common.glsl first (workgroup size = spec constant 0). Subgroups have ≥ 4 lanes, so a workgroup has at
// most gl_WorkGroupSize.x / 4 of them. wg_put must be reached by every invocation in uniform
// control flow (subgroupAdd, then the caller's barrier): no early return before it.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

shared float wg_red[(gl_WorkGroupSize.x / 4u) * (WG_NV)];

// Value k of this subgroup, already reduced over the subgroup (by any subgroup operation).
void wg_store(uint k, float subgroup_value) {
    if (subgroupElect()) wg_red[gl_SubgroupID * (WG_NV) + k] = subgroup_value;
}

void wg_put(uint k, float v) { wg_store(k, subgroupAdd(v)); }

// After the barrier: subgroup i's value k; the workgroup's total or maximum of value k (every
// invocation may ask for any k).
float wg_at(uint i, uint k) { return wg_red[i * (WG_NV) + k]; }

float wg_total(uint k) {
    float s = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) s += wg_at(i, k);
    return s;
}

float wg_max(uint k) {
    float m = wg_at(0u, k);
    for (uint i = 1u; i < gl_NumSubgroups; ++i) m = max(m, wg_at(i, k));
    return m;
}
