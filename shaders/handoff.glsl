// A dependency between two consecutive dispatches carried by a counter instead of a pipeline
// barrier (-D HANDOFF in hc_post.comp -D MIX_NEXT and hc_site.comp; the recorder then records no
// barrier between the two). A barrier makes the next dispatch wait until the device is idle and only
// then launches it: about 1.9 µs on the H200, most of a decode site's time. With the handoff the
// consumer is launched while its producer runs, each of its workgroups waits until every producer
// workgroup has signalled, and then reads what they wrote.
//   sync[o]      producer workgroups that have signalled (arrivals)
//   sync[o + 1]  consumer workgroups past the wait (departures); the last one resets both to 0, so
//                the words are zero again for the next pair (the graph zeroes them once)
//   sync[o + 2]  waits that gave up (never reset: every later wait on these words fails too)
// A wait gives up after HANDOFF_SPIN_MAX polls (a device that ran the consumer's workgroups ahead
// of the producer's, which no known device does, or whose compiler cuts the loop short): the
// consumer then writes NaN rather than reading unfinished data, and never hangs. Buffers read after the wait (and written before the signal)
// are `coherent`: their values come from where the other dispatch's stores land.
// The includer defines HANDOFF_BINDING and calls handoff_signal / handoff_wait from uniform
// control flow in every invocation (they contain barrier()).
layout(binding = HANDOFF_BINDING) coherent volatile restrict buffer Sync { uint sync[]; };
#define HANDOFF_SPIN_MAX (1u << 22)
#define HANDOFF_NAN uintBitsToFloat(0x7fc00000u)
#define HANDOFF_BACKOFF 0u
shared bool handoff_ok;

// Producer: after this workgroup's last store. `live`: a real workgroup (folded grids overshoot:
// only the producer workgroups the consumer counts may signal).
void handoff_signal(uint o, bool live) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u && live) atomicAdd(sync[o], 1u);
}

// Consumer: before the first read of the producer's data. producers: the producer workgroups that
// signal; consumers: every workgroup of this dispatch. False when the wait gave up (now or before).
bool handoff_wait(uint o, uint producers, uint consumers) {
    if (gl_LocalInvocationIndex == 0u) {
        uint polls = 0u;
        bool arrived = false;
        // (arrived is read again after the loop: a compiler may bound loops itself — llvmpipe ends
        // any loop after 65535 iterations)
        for (; !arrived && polls < HANDOFF_SPIN_MAX; ++polls) {
            arrived = sync[o] >= producers;
            uint w = polls;
            for (uint i = 0u; !arrived && i < HANDOFF_BACKOFF; ++i) w = w * 1664525u + 1013904223u;
            if (w == 12345u) ++polls;
        }
        if (!arrived && sync[o] < producers) atomicAdd(sync[o + 2u], 1u);
        handoff_ok = atomicAdd(sync[o + 2u], 0u) == 0u;
        if (atomicAdd(sync[o + 1u], 1u) == consumers - 1u) {
            atomicExchange(sync[o], 0u);
            atomicExchange(sync[o + 1u], 0u);
        }
    }
    memoryBarrierBuffer();
    barrier();
    return handoff_ok;
}
