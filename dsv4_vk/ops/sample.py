"""SAMPLE: greedy or temperature + top-k sampling on the device with a seeded counter RNG, and the
float64 reference that draws exactly the same tokens.
"""
import numpy as np

from .base import Launch, OpDef, check_params, cluster_lanes, expect, grid_1d, nonempty, pack_push, register

MAX_TOP_K = 64

def pcg(v):
    """The PCG hash of sample.comp on uint32 values (Python ints)."""
    s = (v * 747796405 + 2891336453) & 0xFFFFFFFF
    word = (((s >> ((s >> 28) + 4)) ^ s) * 277803737) & 0xFFFFFFFF
    return (word >> 22) ^ word


def sample_uniform(seed, counter):
    """The draw u ∈ [0, 1) of SAMPLE for state (seed, counter)."""
    return (pcg((seed & 0xFFFFFFFF) ^ pcg(counter & 0xFFFFFFFF)) >> 8) / 16777216.0


def sample_candidates(row, temperature, top_k):
    """(ids, probabilities) SAMPLE draws from for one row of logits (finite logits only)."""
    row = np.asarray(row, np.float64)
    k = 1 if not temperature > 0 else min(max(int(top_k), 1), MAX_TOP_K)
    finite = np.flatnonzero(np.isfinite(row))
    ids = finite[np.lexsort((finite, -row[finite]))][:k]
    if len(ids) <= 1:
        return ids, np.ones(len(ids))
    w = np.exp((row[ids] - row[ids[0]]) / temperature)
    return ids, w / w.sum()


def reference_sample(logits, temperature, top_k, seed, counter):
    """Tokens [T] (int) exactly as SAMPLE draws them, u of row r from (seed, counter + r)."""
    out = []
    for r, row in enumerate(np.asarray(logits, np.float64)):
        ids, p = sample_candidates(row, temperature, top_k)
        if len(ids) == 0:
            out.append(-1)
            continue
        u = sample_uniform(seed, counter + r)
        j = int(np.searchsorted(np.cumsum(p), u, side="right"))
        out.append(int(ids[min(j, len(ids) - 1)]))
    return np.array(out, np.int64)



@register
class Sample(OpDef):
    """SAMPLE(logits [T,V], cfg [2] f32 = (temperature, top_k), state [2] i32 = (seed, counter)) -> [T] i32.
    Advances state's counter by T on the device (state is read and written)."""
    name, n_inputs = "SAMPLE", 3
    dtypes = ("f32", "i32")
    WORKGROUP = 64

    def infer(self, inputs, params):
        lg, cfg, state = inputs
        nonempty(self.name, [lg])
        check_params(self.name, params, ())
        expect(self.name, "logits (input 0, [T, vocab])", lg, (None, None))
        expect(self.name, "cfg (input 1, (temperature, top_k))", cfg, (2,))
        expect(self.name, "state (input 2, (seed, counter))", state, (2,), "i32")
        if lg.shape[1] >= 1 << 24:
            raise ValueError(f"{self.name}: vocab {lg.shape[1]} must be < 2^24 (ids pass through exact floats)")
        return (lg.shape[0],), "i32"

    def lower(self, node, device):
        lg, cfg, state = node.inputs
        out = node.output
        defs, extra = cluster_lanes(device, lg.shape[1])
        push = pack_push([lg.shape[0], lg.shape[1], lg.offset, *lg.strides, cfg.offset, state.offset,
                      out.offset, out.strides[0]])
        return [Launch("sample", [lg, cfg, state, out], (2, 3), push, (1, 1, 1), defines=defs,
                       spec=(self.WORKGROUP, MAX_TOP_K), **extra)]

    def reference(self, logits, cfg, state):
        cfg, state = np.asarray(cfg, np.float64), np.asarray(state).astype(np.int64)
        return reference_sample(logits, cfg[0], cfg[1], int(state[0]), int(state[1]))
