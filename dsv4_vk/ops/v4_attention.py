"""DeepSeek-V4 attention: MQA_ATTENTION (one shared key = value head, sliding window, learned sinks,
plus compressed entries: HCA's closed windows or CSA's top-k; at decode its key lists split and
merged in the same dispatch) and MQA_COMBINE (the split key lists merged by a dispatch of its own).
Positions come from a device buffer, as for ROPE (ops.rope).
"""
from __future__ import annotations

import numpy as np

from ..core.tuning import knob_table
from .base import (WORKGROUP, Launch, OpDef, coopmat_unavailable, check_finite, check_flag, check_params, cluster_lanes,
                   expect, grid_1d, is_cpu, next_pow2, nonempty, register, unit_last, view_fields)
from .rope import NAN, Rope, check_rope_tables, positions, positive_int, rope_fields


def reference_q_norm(q, pos, cos, sin, eps):
    """float64 q [T, H, hd] with each head's row RMS-normalised (no weight), then RoPE at its position."""
    q = np.asarray(q, np.float64)
    return Rope().reference(q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + eps), pos, cos, sin)


def reference_mqa(q, kv, pos, sinks, ent=None, idx=None, *, scale, window, mode="sliding", rate=1, capacity=None):
    """float64 MQA_ATTENTION: q [T,H,hd], kv [rows,hd] (position j in row j % rows), ent [n,hd],
    idx [T,K] i32 (−1: none); positions outside [0, capacity) give NaN."""
    q, kv = np.asarray(q, np.float64), np.asarray(kv, np.float64)
    T, H, hd = q.shape
    p, ok = positions(pos, T, kv.shape[0] if capacity is None else capacity)
    out = np.full(q.shape, NAN)
    for t in np.flatnonzero(ok):
        keys = [kv[np.arange(max(p[t] - window + 1, 0), p[t] + 1) % kv.shape[0]]]
        if mode == "hca":
            keys.append(np.asarray(ent, np.float64)[:min((p[t] + 1) // rate, len(ent))])
        elif mode == "csa":
            sel = [w for w in np.asarray(idx)[t] if 0 <= w < len(ent)]
            keys.append(np.asarray(ent, np.float64)[sel].reshape(-1, hd))
        k = np.concatenate(keys)
        s = np.concatenate([q[t] @ k.T * scale, np.asarray(sinks, np.float64)[:, None]], axis=1)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out[t] = (e[:, :-1] @ k) / e.sum(axis=1, keepdims=True)
    return out


MODES = ("sliding", "hca", "csa")
MQA_KEYS = knob_table("mqa", keys=(None, "MQA_ATTENTION keys per step (None: from channels per lane)"))
MQA_ARRAYS = knob_table(
    "mqa_arrays",
    literal=(False, "MQA_ATTENTION's per-lane arrays with literal sizes (-D LITERAL_ARRAYS) where they fit, "
                    "instead of sizes from specialization constants, which a driver may keep in memory: not yet "
                    "measured, so off (tools/model_gpu_bench.py --variants mqa_literal=1)"))
LITERAL_MAX = {"per_lane": 16, "keys": 4, "tile": 16, "loads": 32}     # the shader's literal sizes
COOPMAT_PREFILL_KERNELS = ("prefill_coopmat", "prefill_coopmat_fma")
MQA_KERNELS = ("auto", "tiled", "cluster", "prefill") + COOPMAT_PREFILL_KERNELS
TILED_MAX_TOKENS = 4           # auto: the tiled kernel up to this many query tokens (decode)
MQA_PREFILL = knob_table(
    "mqa_prefill",
    on=(None, "MQA_ATTENTION kernel='auto' over more than TILED_MAX_TOKENS tokens (prefill) takes the prefill kernel "
              "(shaders/mqa_prefill.comp: a workgroup takes one token and many of its heads, each key row staged "
              "once for them all): None on GPUs (CPU devices keep the cluster kernel), "
              "True everywhere, False nowhere (the cluster kernel: one cluster per token and head)"),
    heads=(None, "heads per cluster of the prefill kernel (each staged channel read once for that many heads; "
                 "None: 4 on GPUs, 2 on CPU devices)"),
    keys=(4, "keys the prefill kernel scores and sums at a time, their channels held in registers for both "
             "products"),
    tile=(None, "keys the prefill kernel stages at a time, where shared memory allows, else as many as fit "
                "(None: 8)"),
    coopmat=(None, "the prefill kernel's two products on 16-bit matrix units (shaders/mqa_prefill_coopmat.comp, "
                   "kernel 'prefill_coopmat': fp16 inputs scaled per row by powers of two, f32 sums): None (the "
                   "default) where the device has VK_NV_cooperative_matrix's 16 × 16 × 16 fp16 shape (as MUL_MAT's "
                   "coopmat kernel; DSV4_VK_DISABLE_COOPMAT=1 leaves it off), else the f32 prefill kernel; False "
                   "the f32 prefill kernel everywhere; True the matrix units, else their FMA twin "
                   "'prefill_coopmat_fma' (the same data flow and fp16 rounding on any device, for tests)"),
    cm_head_tiles=(1, "the matrix-unit prefill kernel's heads a workgroup, in tiles of 16 (its q and output slices "
                      "are held in registers: 1, 2 or 4)"),
    cm_warps=(4, "the matrix-unit prefill kernel's 32-lane warps a workgroup, each owning head_dim / warps "
                 "channels of both products"),
    cm_tile=(None, "keys the matrix-unit prefill kernel stages at a time (a multiple of 16), where shared memory "
                   "allows, else as many as fit (None: 32 on GPUs, 16 on CPU devices)"))
PREFILL_WORKGROUP = 256
PREFILL_LITERAL_MAX = {"per_lane": 8, "heads": 4, "keys": 8, "loads": 32}    # mqa_prefill.comp's literal sizes
# keys a tiled workgroup stages at a time, where shared memory allows: 8 (twice the decode splits of
# 16) measured faster than 16 on the H200, alone and in the model: the dispatch's fixed cost bounds
# it, not any part of its work (results/h200/ablate_mqa_h200.txt)
MAX_DECODE_SPLITS = 64
MQA_TILE = knob_table("mqa_tile",
                      keys=(8, "keys a tiled MQA_ATTENTION workgroup stages at a time, where shared memory allows"),
                      max_splits=(MAX_DECODE_SPLITS, "key-list splits of a decode token at most (1 to 64): each split a "
                                  "workgroup per head group, which writes its part (hd + 2 floats a head) for "
                                  "MQA_COMBINE; at the default a split is one tile, so 640 keys make 64 parts a head "
                                  "(8.4 MB at V4-Flash's 64 heads of 512), fewer splits walk several tiles a "
                                  "workgroup and write fewer parts; not yet measured (tools/model_gpu_bench.py "
                                  "--variants mqa_splits=16)"))
MQA_MERGE = knob_table(
    "mqa_merge",
    on=(False, "the model's decode attention merges its split key lists inside MQA_ATTENTION (merge=True: the "
               "last workgroup of each token's head group merges the parts, one dispatch and one barrier a layer "
               "fewer) instead of in an MQA_COMBINE dispatch after it; off by default: on the H200 the decode "
               "step was 1.09-1.11x faster with MQA_COMBINE (results/h200/quant/model_flash43_h200.txt; "
               "tools/model_gpu_bench.py "
               "--variants mqa_merge=1)"),
    step=(4, "parts whose loads MQA_ATTENTION merge=True's merging workgroup issues together (at most the "
             "splits; a lane loads its head's hd / (4·lanes) vec4s of each): more loads in flight, or fewer "
             "registers, which the whole kernel is allocated; not yet measured (tools/model_gpu_bench.py "
             "--variants mqa_merge_step=16)"))
PART_POOL, TICKET_POOL = "mqa_parts", "mqa_tickets"      # merge=True's scratch: parts, last-group counters


def merge_part_stride(hd: int) -> int:
    """Floats from one part's row to the next in merge=True's scratch: hd + 2 (acc, max, sum)
    rounded up to whole vec4s."""
    return -(-(hd + 2) // 4) * 4


def _mqa_lanes(device, hd):
    lanes, extra = cluster_lanes(device, hd, per_lane=4)
    return lanes, extra, -(-hd // lanes["LANES"])


def mqa_tile_keys(device, hd: int) -> int:
    """Keys the tiled MQA_ATTENTION stages at a time on this device (0: a key row does not fit
    its shared memory)."""
    lanes, _, per_lane = _mqa_lanes(device, hd)
    row = 4 * per_lane * lanes["LANES"] + 8                       # a staged row + its base and flags
    return min(int(MQA_TILE["keys"]), (device.caps.limits.max_shared_memory - 64) // row)


def mqa_decode_splits(device, hd: int, n_keys: int) -> int:
    """Key-list splits for one decode token with at most n_keys keys: one tiled workgroup's tile
    each (more parallel work, one memory latency per split), at most the knob mqa_tile.max_splits."""
    most = MQA_TILE["max_splits"]
    if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_DECODE_SPLITS:
        raise ValueError(f"tuning knob 'mqa_tile.max_splits' must be an integer from 1 to {MAX_DECODE_SPLITS}, "
                         f"got {most!r}")
    tile = (not is_cpu(device) and mqa_tile_keys(device, hd)) or 128
    return max(1, min(most, -(-int(n_keys) // tile)))


def mqa_prefill_plan(device, hd: int, H: int) -> dict:
    """The prefill kernel's shape on this device for H heads of hd channels: its lanes (defines and
    launch kwargs), vec4s a lane (per_lane), heads a cluster, clusters a workgroup and keys a staged
    tile (tile 0: one key row does not fit the device's shared memory), and the shared bytes used."""
    lanes, extra = cluster_lanes(device, -(-hd // 4), per_lane=4)
    L = lanes["LANES"]
    per_lane = -(-hd // (4 * L))
    # GPUs: 4 heads a cluster and tiles of 8 keys, the fastest on the H200 of 1, 2 or 4 heads and 8 or 16
    # keys (a 512-token chunk at 4k over V4-Flash's 4 flash-1gpu layers: 11.6 ms against 13.2 for 2 and
    # 16, results/h200/prefill/prefill_h200.txt); CPU devices: 2 and 8
    heads = min(positive_int("mqa_prefill", "heads", MQA_PREFILL["heads"] or (2 if is_cpu(device) else 4)), H)
    want = -(-H // heads)                                   # clusters for every head of a token
    wg = min(PREFILL_WORKGROUP, max(device.caps.subgroup.max_size, next_pow2(L * want)))
    row = 16 * per_lane * L + 8                             # a staged row (vec4s) and its base and flags
    fit = max(0, device.caps.limits.max_shared_memory - 64) // row
    want_tile = MQA_PREFILL["tile"] or 8
    tile = min(positive_int("mqa_prefill", "tile", want_tile), fit)
    keys = min(positive_int("mqa_prefill", "keys", MQA_PREFILL["keys"]), max(tile, 1))
    return {"lanes": lanes, "extra": extra, "per_lane": per_lane, "heads": heads, "workgroup": wg,
            "clusters": wg // L, "tile": tile, "keys": keys, "shared_bytes": tile * row}


def _cm_knob(key: str, allowed: tuple) -> int:
    v = MQA_PREFILL[key]
    if isinstance(v, bool) or v not in allowed:
        raise ValueError(f"tuning knob 'mqa_prefill.{key}' must be one of {allowed}, got {v!r}")
    return v


def mqa_prefill_coopmat_plan(device, hd: int, H: int) -> dict:
    """The matrix-unit prefill kernel's shape on this device for H heads of hd channels: warps (of 32
    invocations) and workgroup, head tiles of 16, hd padded to 16·warps, keys a staged tile (0: not
    even 16 fit the device's shared memory) and the shared bytes used (shaders/mqa_prefill_coopmat.comp's
    layout)."""
    warps = _cm_knob("cm_warps", (1, 2, 4, 8))
    head_tiles = _cm_knob("cm_head_tiles", (1, 2, 4))
    wg, hm = 32 * warps, 16 * head_tiles
    if wg % hm:
        raise ValueError(f"mqa_prefill: {warps} warps cannot share the rows of {hm} heads (cm_head_tiles ≤ 2·cm_warps)")
    rt = wg // hm                                           # invocations of a head row in the softmax
    hd_pad = -(-hd // (16 * warps)) * 16 * warps
    want = MQA_PREFILL["cm_tile"] or (16 if is_cpu(device) else 32)
    if isinstance(want, bool) or not isinstance(want, int) or want < 16 or want % 16:
        raise ValueError(f"tuning knob 'mqa_prefill.cm_tile' must be a multiple of 16, got {want!r}")
    step = max(16, 2 * rt)                                  # (each invocation writes pairs of P' halves)
    lim = device.caps.limits

    def shared(nt):                                         # the shader's arrays
        return (nt * (hd_pad + 8) * 2 + max(warps * hm * nt, warps * 256) * 4 + hm * (nt + 8) * 2
                + nt * 24 + hm * 16 + wg * 8)
    tile = (want // step) * step
    while tile and shared(tile) > lim.max_shared_memory:
        tile -= step
    if min(lim.max_workgroup_invocations, lim.max_workgroup_size[0]) < wg:
        tile = 0
    return {"warps": warps, "workgroup": wg, "head_tiles": head_tiles, "hd_pad": hd_pad, "tile": tile,
            "shared_bytes": shared(tile) if tile else 0}


def prefill_coopmat_choice(device, hd: int, H: int) -> tuple[str | None, str]:
    """(the matrix-unit prefill kernel the knob mqa_prefill.coopmat picks on this device, or None for
    the f32 prefill kernel, and why)."""
    on = MQA_PREFILL["coopmat"]
    if on is False:
        return None, "mqa_prefill.coopmat=False"
    if on not in (None, True):
        raise ValueError(f"tuning knob 'mqa_prefill.coopmat' must be None, True or False, got {on!r}")
    plan = mqa_prefill_coopmat_plan(device, hd, H)
    if not plan["tile"]:
        return None, (f"16 staged key rows of {plan['hd_pad']} halves and {16 * plan['head_tiles']} heads' scores "
                      f"do not fit {device.caps.limits.max_shared_memory} B of shared memory")
    why = coopmat_unavailable(device)
    if why is None:
        return "prefill_coopmat", "matrix units"
    if on:
        return "prefill_coopmat_fma", f"the FMA twin (mqa_prefill.coopmat=True): {why}"
    return None, why


def prefill_on(device) -> bool:
    """Whether the knob mqa_prefill.on lets auto take the prefill kernel on this device."""
    on = MQA_PREFILL["on"]
    return not is_cpu(device) if on is None else bool(on)


def describe(device, hd: int = 512, H: int = 64) -> dict:
    """MQA_ATTENTION's kernels on this device at DeepSeek-V4-Flash's widths (python -m dsv4_vk info),
    and where the model's decode attention merges its split key lists (knob mqa_merge.on)."""
    plan = mqa_prefill_plan(device, hd, H)
    pre = "prefill" if prefill_on(device) and plan["tile"] else "cluster"
    cm, cm_why = prefill_coopmat_choice(device, hd, H) if pre == "prefill" else (None, "")
    shared = f"{plan['shared_bytes']} B of {device.caps.limits.max_shared_memory} B shared memory"
    why = (f"prefill: {plan['heads'] * plan['clusters']} heads a workgroup share each staged key row, "
           f"{plan['tile']} keys a tile ({shared})" if pre == "prefill"
           else f"prefill: a key row of {hd} floats does not fit {device.caps.limits.max_shared_memory} B of "
                "shared memory" if not plan["tile"]
           else "prefill: the cluster kernel on CPU devices (mqa_prefill.on=True takes the prefill kernel)"
           if MQA_PREFILL["on"] is None else "prefill: the cluster kernel (mqa_prefill.on=False)")
    if cm:
        cp = mqa_prefill_coopmat_plan(device, hd, H)
        pre, why = cm, (f"prefill: {cm_why}, {16 * cp['head_tiles']} heads a workgroup × {cp['tile']} keys a tile "
                        f"({cp['shared_bytes']} B of {device.caps.limits.max_shared_memory} B shared memory)")
    elif pre == "prefill":
        why += f"; f32 lanes: {cm_why}"
    dec = "tiled" if mqa_tile_keys(device, hd) and not is_cpu(device) else "cluster"
    merge = "merged in the dispatch" if MQA_MERGE["on"] else "merged by MQA_COMBINE, mqa_merge.on=False"
    return {"heads": H, "head_dim": hd, "decode": dec, "decode_splits": merge, "prefill": pre, "reason": why}


@register
class MqaAttention(OpDef):
    """MQA_ATTENTION(q [T,H,hd], kv [rows,hd], pos [1] i32, sinks [H][, ent [n,hd][, idx [T,K] i32]]
    [, cos, sin], scale=, window=, mode="sliding"|"hca"|"csa", rate=, splits=1, capacity=rows,
    kernel="auto", q_norm_eps=, merge=False, inverse_rope=False) -> [T,H,hd]: DeepSeek-V4's attention
    over the raw window plus compressed entries (shaders/mqa_attention.comp). splits > 1 cuts each key
    list into that many parts on separate workgroups or clusters: the result is then the parts
    [T, H, splits·(hd + 2)] (acc, max, sum), merged by MQA_COMBINE, or with merge=True the merged
    [T, H, hd] itself (the last workgroup of each token's group of heads merges them, MQA_COMBINE's
    formula; kernels "tiled" and "cluster"), and with inverse_rope=True (merge only; the tables cos,
    sin last) its trailing channels de-rotated as MQA_COMBINE rope=True does. kernel: "tiled" (keys staged in shared
    memory per group of heads; auto up to TILED_MAX_TOKENS tokens), "cluster" (one cluster per head
    reads its keys itself), "prefill" (shaders/mqa_prefill.comp: one workgroup per token and group of
    heads, splits=1 only; auto past TILED_MAX_TOKENS tokens while the knob mqa_prefill.on is set),
    "prefill_coopmat" (shaders/mqa_prefill_coopmat.comp: the same with its products on the matrix
    units; auto instead of "prefill" as the knob mqa_prefill.coopmat says), "prefill_coopmat_fma"
    (its FMA twin, any device), "auto". q_norm_eps= (with the RoPE tables cos, sin [≥ capacity, half]
    last): q is the projection's output, each head's row RMS-normalised and rotated at its position
    as it is loaded (q's per-head norm and RoPE in this dispatch, as RMS_NORM rope=True would)."""
    name, n_inputs = "MQA_ATTENTION", None
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        check_params(self.name, params, ("scale", "window", "mode", "rate", "splits", "capacity", "kernel",
                                         "q_norm_eps", "merge", "inverse_rope"))
        merge, unrope = check_flag(self.name, params, "merge"), check_flag(self.name, params, "inverse_rope")
        if params.get("kernel", "auto") not in MQA_KERNELS:
            raise ValueError(f"{self.name}: kernel must be one of {MQA_KERNELS}, got {params['kernel']!r}")
        mode = params.get("mode", "sliding")
        if mode not in MODES:
            raise ValueError(f"{self.name}: mode must be one of {MODES}, got {mode!r}")
        q_norm = "q_norm_eps" in params
        tables = q_norm or unrope
        want = {"sliding": 4, "hca": 5, "csa": 6}[mode] + (2 if tables else 0)
        if len(inputs) != want:
            raise ValueError(f"{self.name} mode={mode} takes {want} inputs (q, kv, pos, sinks[, ent[, idx]]"
                             f"{', cos, sin' if tables else ''}), got {len(inputs)}")
        if unrope and not merge:
            raise ValueError(f"{self.name}: inverse_rope=True de-rotates the merged output, so it needs "
                             "merge=True (unmerged parts: MQA_COMBINE rope=True)")
        nonempty(self.name, inputs)
        q, kv, pos, sinks = inputs[:4]
        if q_norm and check_finite(f"{self.name} q_norm_eps", params["q_norm_eps"]) <= 0:
            raise ValueError(f"{self.name}: q_norm_eps must be > 0, got {params['q_norm_eps']!r}")
        if tables:
            check_rope_tables(self.name, pos, *inputs[-2:], q.shape[2])
        expect(self.name, "q (input 0, [T, heads, head_dim])", q, (None, None, None))
        T, H, hd = q.shape
        expect(self.name, "kv (input 1, [rows, head_dim])", kv, (None, hd))
        expect(self.name, "pos (input 2)", pos, (1,), "i32")
        expect(self.name, "sinks (input 3, [heads])", sinks, (H,))
        if mode != "sliding":
            expect(self.name, "ent (input 4, [entries, head_dim])", inputs[4], (None, hd))
            unit_last(self.name, "ent", inputs[4])
        if mode == "csa":
            expect(self.name, "idx (input 5, [T, K])", inputs[5], (T, None), "i32")
            unit_last(self.name, "idx", inputs[5])
        for what, t in (("q", q), ("kv", kv)):
            unit_last(self.name, what, t)
        if "scale" not in params:
            raise ValueError(f"{self.name} needs scale=<finite number> (head_dim^-0.5)")
        check_finite(f"{self.name} scale", params["scale"])
        for k in ("window", "rate", "splits", "capacity"):
            v = params.get(k, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{self.name}: {k} must be an integer ≥ 1, got {v!r}")
        if "window" not in params:
            raise ValueError(f"{self.name} needs window=<sliding window in tokens>")
        capacity = params.get("capacity", kv.shape[0])
        if tables and capacity > inputs[-2].shape[0]:         # (capacity checked as an integer above)
            raise ValueError(f"{self.name}: the RoPE tables have {inputs[-2].shape[0]} rows, fewer than the "
                             f"capacity {capacity}")
        S = params.get("splits", 1)
        if merge and S < 2:
            raise ValueError(f"{self.name}: merge=True merges split key lists, so it needs splits ≥ 2, got "
                             f"splits={S}")
        if merge and params.get("kernel", "auto") not in ("auto", "tiled", "cluster"):
            raise ValueError(f"{self.name}: merge=True runs on kernel 'tiled' or 'cluster' (or 'auto'), got "
                             f"kernel={params['kernel']!r}")
        return (q.shape if S == 1 or merge else (T, H, S * (hd + 2))), "f32"

    def scratch(self, inputs, params):
        if not params.get("merge", False):
            return {}
        T, H, hd = inputs[0].shape
        S = params["splits"]
        # the counters: one per token and group of heads, at most one group per head (any lane count)
        return {PART_POOL: (T * H * S * merge_part_stride(hd), "f32"), TICKET_POOL: (T * H, "i32", "zeroed")}

    def lower(self, node, device):
        prm = node.params
        S = prm.get("splits", 1)
        T, H, hd = node.inputs[0].shape
        lanes, extra, per_lane = _mqa_lanes(device, hd)
        # keys in flight per cluster: their values stay in registers (KEYS·PER_LANE floats a lane)
        keys = 4 if per_lane <= 16 else 2 if per_lane <= 32 else 1
        tile = mqa_tile_keys(device, hd)
        kernel = prm.get("kernel", "auto")
        if kernel == "auto":
            if T > TILED_MAX_TOKENS:        # prefill: a token's heads share each key row it stages
                kernel = ("prefill" if prefill_on(device) and S == 1 and mqa_prefill_plan(device, hd, H)["tile"]
                          else "cluster")
                if kernel == "prefill":
                    kernel = prefill_coopmat_choice(device, hd, H)[0] or kernel
            else:                           # CPU devices: barriers cost more than the loads they save
                kernel = "tiled" if tile and not is_cpu(device) else "cluster"
        if kernel == "prefill":
            return [self._prefill(node, device)]
        if kernel in COOPMAT_PREFILL_KERNELS:
            return [self._prefill_coopmat(node, device, kernel)]
        if kernel == "tiled" and not tile:
            raise ValueError(f"{self.name}: kernel='tiled' stages key rows of {hd} floats in shared memory; "
                             f"{device.name} has {device.caps.limits.max_shared_memory} B, too little for one")
        keys = MQA_KEYS.get("keys") or keys
        merge = prm.get("merge", False)
        step = min(S, positive_int("mqa_merge", "step", MQA_MERGE["step"])) if merge else 1
        spec = (256, per_lane, S, prm["window"], prm.get("rate", 1), keys, tile or 1, step)
        args, push, defs = self._bindings(node)
        defs |= lanes
        writes = (6,)
        if kernel == "tiled":
            defs["TILED"] = 1
        if merge:
            defs["MERGE_ROPE" if prm.get("inverse_rope", False) else "MERGE"] = 1
            part, tickets = node.output.graph.scratch(PART_POOL), node.output.graph.scratch(TICKET_POOL)
            if part.offset % 4:
                raise ValueError(f"{self.name}: the parts' scratch must start on a vec4, got offset {part.offset}")
            writes = (6, len(args), len(args) + 1)
            args += [part, tickets]
            push |= {"part_off": part.offset, "cnt_off": tickets.offset}
        loads = -(-(tile or 1) * per_lane * lanes["LANES"] // 256)
        if MQA_ARRAYS["literal"] and 2 <= lanes["LANES"] <= 32 and per_lane <= LITERAL_MAX["per_lane"] and \
                keys <= LITERAL_MAX["keys"] and (tile or 1) <= LITERAL_MAX["tile"] and loads <= LITERAL_MAX["loads"]:
            defs["LITERAL_ARRAYS"] = 1
        heads_per_group = 256 // lanes["LANES"]
        grid = (grid_1d(T * S * -(-H // heads_per_group), 1) if kernel == "tiled" or merge
                else grid_1d(T * H * S, heads_per_group))
        return [Launch("mqa_attention", args, writes, push, grid, defines=defs, spec=spec, **extra)]

    def _prefill(self, node, device):
        """The launch of shaders/mqa_prefill.comp (kernel="prefill")."""
        prm = node.params
        if prm.get("splits", 1) != 1:
            raise ValueError(f"{self.name}: kernel='prefill' takes whole key lists (splits=1), got "
                             f"splits={prm['splits']}")
        T, H, hd = node.inputs[0].shape
        plan = mqa_prefill_plan(device, hd, H)
        if not plan["tile"]:
            raise ValueError(f"{self.name}: kernel='prefill' stages key rows of {hd} floats in shared memory; "
                             f"{device.name} has {device.caps.limits.max_shared_memory} B, too little for one")
        args, push, defs = self._bindings(node)
        rows4 = hd % 4 == 0 and all(push[f] % 4 == 0 for f in ("kv_off", "kv_s0", "e_off", "e_s0"))
        spec = (plan["workgroup"], plan["per_lane"], 1, prm["window"], prm.get("rate", 1), plan["keys"],
                plan["tile"], plan["heads"], int(rows4))
        loads = -(-plan["tile"] * plan["per_lane"] * plan["lanes"]["LANES"] // plan["workgroup"])
        if MQA_ARRAYS["literal"] and "LANES_SUBGROUP_OPS" in plan["lanes"] and \
                plan["per_lane"] <= PREFILL_LITERAL_MAX["per_lane"] and \
                plan["heads"] <= PREFILL_LITERAL_MAX["heads"] and plan["keys"] <= PREFILL_LITERAL_MAX["keys"] and \
                loads <= PREFILL_LITERAL_MAX["loads"]:
            defs["LITERAL_ARRAYS"] = 1
        groups = -(-H // (plan["heads"] * plan["clusters"]))
        return Launch("mqa_prefill", args, (6,), push, grid_1d(T * groups, 1), defines=defs | plan["lanes"],
                      spec=spec, **plan["extra"])

    def _prefill_coopmat(self, node, device, kernel):
        """The launch of shaders/mqa_prefill_coopmat.comp (kernel="prefill_coopmat" or its FMA twin
        "prefill_coopmat_fma")."""
        prm = node.params
        if prm.get("splits", 1) != 1:
            raise ValueError(f"{self.name}: kernel={kernel!r} takes whole key lists (splits=1), got "
                             f"splits={prm['splits']}")
        T, H, hd = node.inputs[0].shape
        if kernel == "prefill_coopmat":
            why = coopmat_unavailable(device)
            if why:
                raise ValueError(f"{self.name}: kernel='prefill_coopmat' cannot run on {device.name}: {why} "
                                 "(kernel='prefill_coopmat_fma' runs its FMA twin anywhere)")
        plan = mqa_prefill_coopmat_plan(device, hd, H)
        if not plan["tile"]:
            raise ValueError(f"{self.name}: kernel={kernel!r} stages 16 key rows of {plan['hd_pad']} halves and "
                             f"{16 * plan['head_tiles']} heads' scores in shared memory; {device.name} has "
                             f"{device.caps.limits.max_shared_memory} B, too little")
        args, push, defs = self._bindings(node)
        rows4 = hd % 4 == 0 and all(push[f] % 4 == 0 for f in ("kv_off", "kv_s0", "e_off", "e_s0"))
        spec = (plan["workgroup"], plan["hd_pad"], plan["head_tiles"], prm["window"], prm.get("rate", 1),
                plan["tile"], int(rows4))
        if kernel == "prefill_coopmat":
            defs["CM_NV"] = 1
        groups = -(-H // (16 * plan["head_tiles"]))
        return Launch("mqa_prefill_coopmat", args, (6,), push, grid_1d(T * groups, 1), defines=defs, spec=spec,
                      full_subgroups=kernel == "prefill_coopmat")

    def _bindings(self, node):
        """(args, push fields, defines) that mqa_attention.comp and mqa_prefill.comp share."""
        q, kv, pos, sinks = node.inputs[:4]
        prm, out = node.params, node.output
        mode = prm.get("mode", "sliding")
        ent = node.inputs[4] if mode != "sliding" else kv            # bound but unread without entries
        idx = node.inputs[5] if mode == "csa" else pos
        T, H, hd = q.shape
        defs = {f"MODE_{mode.upper()}": 1} if mode != "sliding" else {}
        n_ent = ent.shape[0] if mode != "sliding" else 0
        K = idx.shape[1] if mode == "csa" else 0
        i_s0 = idx.strides[0] if mode == "csa" else 0
        push = {"T": T, "H": H, "hd": hd, "capacity": prm.get("capacity", kv.shape[0]), "n_ent": n_ent, "K": K,
                **view_fields("q", q.offset, q.strides[:2]), "kv_rows": kv.shape[0],
                **view_fields("kv", kv.offset, kv.strides[:1]), **view_fields("e", ent.offset, ent.strides[:1]),
                **view_fields("i", idx.offset, (i_s0,)), **view_fields("o", out.offset, out.strides[:2]),
                "pos_off": pos.offset, "sink_off": sinks.offset, "scale": float(prm["scale"])}
        args = [q, kv, ent, idx, pos, sinks, out]
        if "q_norm_eps" in prm:
            defs["Q_NORM"] = 1
            push["q_eps"] = float(prm["q_norm_eps"])
        if "q_norm_eps" in prm or prm.get("inverse_rope", False):
            cos, sin = node.inputs[-2:]
            args += [cos, sin]
            push |= {"q_half": cos.shape[1], "cos_off": cos.offset, "sin_off": sin.offset, "tab_s0": cos.strides[0]}
        return args, push, defs

    def reference(self, q, kv, pos, sinks, *rest, scale=1.0, window=1, mode="sliding", rate=1, splits=1,
                  capacity=None, kernel="auto", q_norm_eps=None, merge=False, inverse_rope=False):
        if splits != 1 and not merge:
            raise ValueError("the reference of a split MQA_ATTENTION is that of MQA_COMBINE over it")
        if q_norm_eps is not None or inverse_rope:
            *rest, cos, sin = rest
        if q_norm_eps is not None:
            q = reference_q_norm(q, pos, cos, sin, q_norm_eps)
        ent, idx = (list(rest) + [None, None])[:2]
        out = reference_mqa(q, kv, pos, sinks, ent, idx, scale=scale, window=window, mode=mode, rate=rate,
                            capacity=capacity)
        return Rope().reference(out, pos, cos, sin, inverse=True) if inverse_rope else out


@register
class MqaCombine(OpDef):
    """MQA_COMBINE(part [T, H, S·(hd+2)] from MQA_ATTENTION splits=S, sinks [H], splits=S) -> [T,H,hd].
    rope=True: three more inputs pos [1] i32, cos, sin [capacity, half], and the result de-rotated
    as ROPE inverse=True does (the attention output's RoPE removed in the same dispatch)."""
    name, n_inputs = "MQA_COMBINE", None
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        check_params(self.name, params, ("splits", "rope"))
        rope = check_flag(self.name, params, "rope")
        if len(inputs) != (5 if rope else 2):
            raise ValueError(f"{self.name} takes part, sinks{', pos, cos, sin (rope=True)' if rope else ''}; "
                             f"got {len(inputs)} inputs")
        part, sinks = inputs[:2]
        nonempty(self.name, inputs)
        S = params.get("splits")
        if isinstance(S, bool) or not isinstance(S, int) or S < 1:
            raise ValueError(f"{self.name}: splits must be an integer ≥ 1, got {S!r}")
        expect(self.name, "part (input 0, [T, heads, splits·(head_dim+2)])", part, (None, None, None))
        T, H, n = part.shape
        if n % S or n // S < 3 or not part.is_contiguous:
            raise ValueError(f"{self.name}: part rows of {n} values are not {S} contiguous splits of head_dim + 2")
        expect(self.name, "sinks (input 1, [heads])", sinks, (H,))
        if rope:
            check_rope_tables(self.name, *inputs[2:], n // S - 2)
        return (T, H, n // S - 2), "f32"

    def lower(self, node, device):
        part, sinks = node.inputs[:2]
        out = node.output
        T, H, hd = out.shape
        push = {"T": T, "H": H, "hd": hd, "splits": node.params["splits"], "part_off": part.offset,
                **view_fields("o", out.offset, out.strides[:2]), "sink_off": sinks.offset}
        spec = (WORKGROUP, node.params["splits"])
        if node.params.get("rope", False):
            push |= rope_fields(*node.inputs[2:])
            return [Launch("mqa_combine", [part, sinks, out, *node.inputs[2:]], (2,), push, grid_1d(T * H * hd),
                           defines={"ROPE": 1}, spec=spec)]
        return [Launch("mqa_combine", [part, sinks, out], (2,), push, grid_1d(T * H * hd), spec=spec)]

    def reference(self, part, sinks, pos=None, cos=None, sin=None, splits=1, rope=False):
        out = self._merge(part, sinks, splits)
        return Rope().reference(out, pos, cos, sin, inverse=True) if rope else out

    @staticmethod
    def _merge(part, sinks, splits):
        part, sinks = np.asarray(part, np.float64), np.asarray(sinks, np.float64)
        T, H, n = part.shape
        hd = n // splits - 2
        p = part.reshape(T, H, splits, hd + 2)
        M = np.maximum(sinks[None, :], p[..., hd].max(axis=-1))
        f = np.exp(p[..., hd] - M[..., None])
        den = np.exp(sinks[None, :] - M) + (f * p[..., hd + 1]).sum(-1)
        return (f[..., None] * p[..., :hd]).sum(2) / den[..., None]
