"""SAMPLE: greedy or temperature + top-k sampling on the device with a seeded counter RNG, and the
float64 reference that draws exactly the same tokens.
"""
import numpy as np

from .base import (Launch, OpDef, check_params, cluster_lanes, expect, grid_1d, nonempty, register,
                   unit_last, view_fields)

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



# One cluster scanning a long row top_k times is latency-bound (H200: 1.4 ms for 129,280 logits) and
# on lavapipe returned wrong draws from 8192 logits at top_k ≥ 63 (right ones at 8000): rows from
# SPLIT_MIN_VOCAB go through SAMPLE_CANDIDATES, whose clusters take CHUNK logits each, and SAMPLE
# refuses single-stage rows longer than MAX_SINGLE_STAGE.
SPLIT_MIN_VOCAB = 4096
MAX_SINGLE_STAGE = 8000
CHUNK = 2048


def _launch(device, name, args, writes, T, entries, view, strides, cfg, state_off, out, out_s0, grid, defs,
            extra, chunk=0):
    push = {"T": T, "V": entries, **view_fields("l", view.offset, strides), "cfg_off": cfg.offset, "st_off": state_off,
            **view_fields("o", out.offset, (out_s0,)), "chunk": chunk}
    return Launch("sample", args, writes, push, grid, defines=defs, spec=(Sample.WORKGROUP, MAX_TOP_K),
                  label=name, **extra)


@register
class SampleCandidates(OpDef):
    """SAMPLE_CANDIDATES(logits [T,V], cfg [2]) -> [T, chunks·MAX_TOP_K·2]: per chunk of CHUNK logits
    its top_k finite logits (value, id) in order, unused slots (−inf, −1). SAMPLE over these pairs
    (`candidates=True`) draws the same token as over the logits: the first stage of a long row."""
    name, n_inputs = "SAMPLE_CANDIDATES", 2

    def infer(self, inputs, params):
        lg, cfg = inputs
        nonempty(self.name, [lg])
        check_params(self.name, params, ())
        expect(self.name, "logits (input 0, [T, vocab])", lg, (None, None))
        expect(self.name, "cfg (input 1, (temperature, top_k))", cfg, (2,))
        if lg.shape[1] >= 1 << 24:
            raise ValueError(f"{self.name}: vocab {lg.shape[1]} must be < 2^24 (ids pass through exact floats)")
        return (lg.shape[0], -(-lg.shape[1] // CHUNK) * MAX_TOP_K * 2), "f32"

    def lower(self, node, device):
        lg, cfg = node.inputs
        out = node.output
        unit_last(self.name, "output", out)
        defs, extra = cluster_lanes(device, CHUNK)
        T, V = lg.shape
        chunks = -(-V // CHUNK)
        grid = grid_1d(T * chunks, Sample.WORKGROUP // defs["LANES"])
        return [_launch(device, self.name, [lg, cfg, out], (2,), T, V, lg, lg.strides, cfg, 0, out, out.strides[0],
                        grid, {**defs, "PARTIAL": 1}, extra, CHUNK)]

    def reference(self, logits, cfg):
        lg, cfg = np.asarray(logits, np.float64), np.asarray(cfg, np.float64)
        T, V = lg.shape
        chunks = -(-V // CHUNK)
        out = np.tile(np.array([-np.inf, -1.0]), (T, chunks * MAX_TOP_K))
        for r in range(T):
            for c in range(chunks):
                ids, _ = sample_candidates(lg[r, c * CHUNK:(c + 1) * CHUNK], cfg[0], cfg[1])
                base = 2 * c * MAX_TOP_K
                out[r, base:base + 2 * len(ids):2] = lg[r, c * CHUNK + ids]
                out[r, base + 1:base + 2 * len(ids):2] = c * CHUNK + ids
        return out


def sample(g, logits, cfg, state, out=None):
    """Append SAMPLE for logits [T, V] (two stages, SAMPLE_CANDIDATES then SAMPLE over its pairs, for
    V ≥ SPLIT_MIN_VOCAB); returns the tokens [T] i32 (written into `out` when given)."""
    if logits.shape[-1] >= SPLIT_MIN_VOCAB:
        cands = g.op("SAMPLE_CANDIDATES", logits, cfg)
        return g.op("SAMPLE", cands, cfg, state, candidates=True, out=out)
    return g.op("SAMPLE", logits, cfg, state, out=out)


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
        check_params(self.name, params, ("candidates",))
        expect(self.name, "logits (input 0, [T, vocab])", lg, (None, None))
        expect(self.name, "cfg (input 1, (temperature, top_k))", cfg, (2,))
        expect(self.name, "state (input 2, (seed, counter))", state, (2,), "i32")
        if not params.get("candidates") and lg.shape[1] > MAX_SINGLE_STAGE:
            raise ValueError(f"{self.name}: a row of {lg.shape[1]} logits is longer than {MAX_SINGLE_STAGE}: sample it in "
                             "two stages with dsv4_vk.ops.sample.sample(g, logits, cfg, state)")
        if params.get("candidates") and lg.shape[1] % (2 * MAX_TOP_K):
            raise ValueError(f"{self.name}: candidates=True needs SAMPLE_CANDIDATES pairs ([T, chunks·{2 * MAX_TOP_K}]), "
                             f"got {lg.shape[1]} columns")
        if lg.shape[1] >= 1 << 24:
            raise ValueError(f"{self.name}: vocab {lg.shape[1]} must be < 2^24 (ids pass through exact floats)")
        return (lg.shape[0],), "i32"

    def lower(self, node, device):
        lg, cfg, state = node.inputs
        out = node.output
        T, entries = lg.shape
        if node.params.get("candidates"):
            entries //= 2
            unit_last(self.name, "candidates", lg)
        defs, extra = cluster_lanes(device, entries)
        if node.params.get("candidates"):
            defs["CANDIDATES"] = 1
        return [_launch(device, self.name, [lg, cfg, state, out], (2, 3), T, entries, lg, lg.strides, cfg,
                        state.offset, out, out.strides[0], (1, 1, 1), defs, extra)]

    def reference(self, logits, cfg, state, candidates=False):
        cfg, state = np.asarray(cfg, np.float64), np.asarray(state).astype(np.int64)
        lg = np.asarray(logits, np.float64)
        if candidates:      # back to logit rows: each pair's value at its id, −inf elsewhere
            vals, ids = lg[:, 0::2], lg[:, 1::2]
            V = int(np.max(ids, initial=0)) + 1
            rows = np.full((lg.shape[0], V), -np.inf)
            for r in range(lg.shape[0]):
                ok = ids[r] >= 0
                rows[r, ids[r][ok].astype(np.int64)] = vals[r][ok]
            lg = rows
        return reference_sample(lg, cfg[0], cfg[1], int(state[0]), int(state[1]))
