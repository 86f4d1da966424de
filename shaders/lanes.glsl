// Reductions over clusters of LANES consecutive subgroup lanes, without shared memory or barriers.
// LANES, a power of two no larger than the subgroup, is specialization constant 15 (named: the host
// passes it as a define, shader.specialize), chosen on the host from the device caps
// (ops.base.cluster_lanes); a define picks how a cluster reduces, since each gates an extension:
//   none                         LANES is 1, no subgroup operation at all: the fallback for devices
//                                without them;
//   -D LANES_SUBGROUP_OPS        the cluster is the whole subgroup: subgroupAdd / subgroupMax;
//   -D LANES_SHUFFLE             a butterfly of subgroupShuffleXor by 1, 2, .. LANES/2 (unrolled by
//                                the driver once LANES is known).
// A cluster never straddles two subgroups (LANES divides the subgroup size and the workgroup is
// launched as full subgroups), so the shuffles only read lanes of the same cluster. A cluster is
// active or inactive as a whole, so callers may return early per cluster.
// -D LANES_WORKGROUP instead: the cluster is the whole workgroup (one row per workgroup,
// for few long rows such as one token's D = 4096 at decode): LANES is the workgroup size, sums and
// maxima are subgroup reductions plus one shared-memory step (wg_reduce.glsl), with a barrier
// before it so that one reduction may follow another. Every invocation of the workgroup must call
// them (a workgroup is active or inactive as a whole).
#if defined(LANES_WORKGROUP)
#include "common.glsl"
#define WG_NV 2u
#define WG_NV_MAX 2
#include "wg_reduce.glsl"
#define LANES gl_WorkGroupSize.x
uint cluster_id() { return flat_group(); }
uint cluster_lane() { return gl_LocalInvocationID.x; }

float cluster_sum(float v) {
    v = subgroupAdd(v);
    barrier();                  // the previous reduction's readers are done with the shared step
    wg_store(0u, v);
    barrier();
    return wg_total(0u);
}

float cluster_max(float v) {
    v = subgroupMax(v);
    barrier();
    wg_store(0u, v);
    barrier();
    return wg_max(0u);
}

// Two sums in one shared-memory step (one barrier pair, not two: a decode GEMV's dot product and
// its folded norm's Σx²).
vec2 cluster_sum2(vec2 v) {
    v = subgroupAdd(v);
    barrier();
    wg_store(0u, v.x);
    wg_store(1u, v.y);
    barrier();
    return vec2(wg_total(0u), wg_total(1u));
}
#else
#if defined(LANES_SUBGROUP_OPS) || defined(LANES_SHUFFLE)
#define LANES_CLUSTER 1
#extension GL_KHR_shader_subgroup_basic : require
#if defined(LANES_SUBGROUP_OPS)
#extension GL_KHR_shader_subgroup_arithmetic : require
#else
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#endif
#include "common.glsl"
#if defined(LANES_CLUSTER)
layout(constant_id = 15) const uint LANES = 2;
#else
const uint LANES = 1u;
#endif

// Position of this invocation in its workgroup in subgroup order, so that LANES consecutive
// positions are LANES consecutive lanes of one subgroup whatever the driver's lane mapping.
uint lane_linear() {
#if defined(LANES_CLUSTER)
    return gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
#else
    return gl_LocalInvocationID.x;
#endif
}

uint cluster_id() { return flat_group() * (gl_WorkGroupSize.x / LANES) + lane_linear() / LANES; }
uint cluster_lane() { return lane_linear() % LANES; }

// v summed over the cluster, in place, for a float or a vector (GLSL has no generic functions).
#if defined(LANES_SUBGROUP_OPS)
#define CLUSTER_ADD(v) v = subgroupAdd(v)
#elif defined(LANES_SHUFFLE)
#define CLUSTER_ADD(v) [[unroll]] for (uint m = 1; m < LANES; m <<= 1) v += subgroupShuffleXor(v, m)
#else
#define CLUSTER_ADD(v)
#endif

float cluster_sum(float v) { CLUSTER_ADD(v); return v; }

vec2 cluster_sum2(vec2 v) { CLUSTER_ADD(v); return v; }

float cluster_max(float v) {
#if defined(LANES_SUBGROUP_OPS)
    v = subgroupMax(v);
#elif defined(LANES_SHUFFLE)
    [[unroll]] for (uint m = 1; m < LANES; m <<= 1) v = max(v, subgroupShuffleXor(v, m));
#endif
    return v;
}
#endif
