// Sums of WG_NV floats across a whole workgroup: subgroupAdd per value, then one shared-memory
// step (a single barrier) across the workgroup's subgroups.
//   for (k < WG_NV) wg_put(k, v[k]);  barrier();  total_k = wg_total(k)
// The includer defines WG_NV (a constant or specialization-constant expression), WG_NV_MAX (a
// literal ≥ WG_NV) and includes common.glsl first. The shared array has a literal size — 64
// subgroups (a workgroup of ≤ 256 invocations, subgroups of ≥ 4 lanes) × WG_NV_MAX — rather than one
// computed from specialization constants, so that every driver sees a fixed footprint. wg_put must
// be reached by every invocation in uniform control flow (subgroupAdd, then the caller's barrier):
// no early return before it.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

shared float wg_red[64 * WG_NV_MAX];

// Value k of this subgroup, already reduced over the subgroup (by any subgroup operation).
void wg_store(uint k, float subgroup_value) {
    if (subgroupElect()) wg_red[gl_SubgroupID * WG_NV_MAX + k] = subgroup_value;
}

void wg_put(uint k, float v) { wg_store(k, subgroupAdd(v)); }

// After the barrier: subgroup i's value k; the workgroup's total or maximum of value k (every
// invocation may ask for any k).
float wg_at(uint i, uint k) { return wg_red[i * WG_NV_MAX + k]; }

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
