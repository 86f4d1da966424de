"""V4_GATE: DeepSeek-V4's router at one token in one dispatch — the gate's logits (the FFN's RMS norm
folded in, as MUL_MAT's) and V4_ROUTE's selection on them, in the workgroup that finishes last
(shaders/v4_gate.comp, shaders/last_group.glsl) — with its float64 reference, and `gate_kernel`,
which says where it runs (else the model keeps MUL_MAT then V4_ROUTE).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.tuning import knob_table
from .base import (Launch, OpDef, check_finite, check_params, expect, grid_1d, is_cpu, next_pow2, nonempty, register,
                   unit_last, view_fields, weight_defines, workgroup_pow2, WEIGHT_DTYPES)
from .moe import ROUTE_RANK, check_route_params, reference_v4_route, route_kernel, route_workgroup
from .reduce_rows import reference_rms_norm

GATE = knob_table(
    "v4_gate",
    on=(True, "the router at one token in one dispatch (V4_GATE, v4_gate.comp: the gate's logits with the norm "
              "folded in, then V4_ROUTE's selection in the workgroup that finishes last) where it can run "
              "(ops.v4_gate.gate_kernel); off: MUL_MAT then V4_ROUTE, two dispatches"),
    rows=(None, "gate rows a workgroup computes (1 to 8, spec constant NR; None: 1 on GPUs, 4 on CPU devices)"),
    unroll=(None, "vec4 steps a lane loads together (1 to 8, spec constant UNROLL; None: 4 on GPUs, 1 on CPU devices)"),
    wg=(None, "invocations a workgroup (a power of two ≤ 256, raised to the router's workgroup and, ranking, to the "
              "experts; None: 256 on GPUs, the router's own on CPU devices)"))

COUNTERS = "v4_gate.counters"      # zeroed scratch: the last-workgroup ticket (one; every V4_GATE node's)
LOGITS = "v4_gate.logits"          # the logits the workgroups store and the last one routes


@dataclass(frozen=True)
class GateChoice:
    """Whether the router takes V4_GATE ("fused") or MUL_MAT then V4_ROUTE ("apart"), and why."""
    kernel: str
    reason: str


def layout_refusal(D: int, x_off: int, w_off: int, w_row: int, g_off: int | None) -> str | None:
    """Why V4_GATE's vec4 loads cannot read x [1, D] at x_off, rows of w at w_off + e·w_row and g at
    g_off (None: none of them misaligned)."""
    if D % 4:
        return f"D = {D} is not a multiple of 4 (V4_GATE loads vec4s)"
    bad = [n for n, v in (("x", x_off), ("w", w_off), ("w's row stride", w_row), ("g", g_off)) if v is not None and v % 4]
    return f"{', '.join(bad)} not at a multiple of 4 elements (V4_GATE loads vec4s)" if bad else None


def gate_kernel(device, T: int, E: int, hashed: bool, layout: str | None = None) -> GateChoice:
    """The one place that decides whether a router of T tokens over E experts runs as V4_GATE
    ("fused": knob v4_gate.on, one token, the router's workgroup on this device, the one-pass
    ranking for bias top-k (at most 256 experts) or the hash table) or as MUL_MAT then V4_ROUTE
    ("apart"). layout: layout_refusal's word on the tensors, if any."""
    if not GATE["on"]:
        return GateChoice("apart", "v4_gate.on is off")
    if T != 1:
        return GateChoice("apart", f"T = {T} tokens: V4_GATE routes one token (decode)")
    if route_workgroup(device, E) is None:
        return GateChoice("apart", "the device lacks the subgroup operations of the router's workgroup")
    if not hashed and route_kernel(device, E, False) != "rank":
        why = "route_rank.on is off" if not ROUTE_RANK["on"] else \
            f"{E} experts: more than the one-pass ranking takes (route_rank.max, at most 256 and the workgroup)"
        return GateChoice("apart", why)
    if layout:
        return GateChoice("apart", layout)
    return GateChoice("fused", "one dispatch: the gate's logits, then V4_ROUTE's selection in the workgroup that "
                               "finishes last")


def gate_launch_shape(device, E: int, hashed: bool) -> tuple[int, int, int]:
    """(workgroup size, rows a workgroup, unroll) of V4_GATE on device (the knobs v4_gate.*)."""
    cpu = is_cpu(device)
    wg, rows, unroll = GATE["wg"], GATE["rows"], GATE["unroll"]
    for name, v, hi in (("wg", wg, 256), ("rows", rows, 8), ("unroll", unroll, 8)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi):
            raise ValueError(f"tuning knob 'v4_gate.{name}' must be None or an integer in [1, {hi}], got {v!r}")
    own = route_workgroup(device, E) or 64
    wg = max(wg if wg is not None else own if cpu else 256, own, 1 if hashed else next_pow2(E))
    wg = workgroup_pow2(device, min(next_pow2(wg), 256))
    return wg, rows or (4 if cpu else 1), unroll or (1 if cpu else 4)


def reference_gate_logits(x, w, g=None, rms_eps=None):
    """float64 logits [T, E] of V4_GATE: (x normalised with g when given) @ wᵀ."""
    x = np.asarray(x, np.float64) if g is None else reference_rms_norm(x, g, rms_eps)
    return x @ np.asarray(w, np.float64).T


@register
class V4Gate(OpDef):
    """V4_GATE(x [1,D], w [E,D][, g [D]], bias [E], top_k=, scoring=, route_scale=[, rms_eps=]) or
    V4_GATE(x, w[, g], tid2eid [V,top_k] i32, ids [1] i32, ...) -> [1, top_k + 1, 2]: V4_ROUTE of the
    logits (x / rms(x) ⊙ g) · wᵀ (with rms_eps and g; else x · wᵀ) in one dispatch, w f32, bf16 or
    f16. One token; D % 4 == 0 and x, g, w's rows at multiples of 4 elements (layout_refusal); the
    bias form ranks at most 256 experts (gate_kernel says where it runs)."""
    name, n_inputs = "V4_GATE", None
    dtypes = WEIGHT_DTYPES + ("i32",)

    @staticmethod
    def parts(inputs, params):
        """(x, w, g or None, selection inputs) of a node's inputs."""
        norm = "rms_eps" in params
        x, w = inputs[:2]
        return x, w, (inputs[2] if norm else None), list(inputs[2 + norm:])

    def infer(self, inputs, params):
        check_params(self.name, params, ("top_k", "scoring", "route_scale", "rms_eps"))
        norm = "rms_eps" in params
        if len(inputs) - norm not in (3, 4):
            raise ValueError(f"{self.name} takes (x, w{', g' if norm else ''}, bias) or (x, w{', g' if norm else ''}, "
                             f"tid2eid, ids){' (g: with rms_eps=)' if not norm else ''}, got {len(inputs)} inputs")
        if not norm and len(inputs) == 4 and inputs[2].dtype != "i32":
            raise ValueError(f"{self.name}: 4 inputs without rms_eps= are (x, w, tid2eid, ids); a norm weight g "
                             f"(x, w, g, bias) needs rms_eps=, got input 2 {inputs[2].dtype} {list(inputs[2].shape)}")
        nonempty(self.name, inputs)
        x, w, g, sel = self.parts(inputs, params)
        expect(self.name, "x (input 0, [1, D]: one token)", x, (1, None))
        D = x.shape[1]
        if w.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"{self.name}: w (input 1) must be one of {WEIGHT_DTYPES} (the gate is never quantised), "
                             f"got {w.dtype}")
        expect(self.name, "w (input 1, [experts, D])", w, (None, D), w.dtype)
        E = w.shape[0]
        if g is not None:
            expect(self.name, "norm weight g (input 2, [D])", g, (D,))
            if not check_finite(f"{self.name} rms_eps", params["rms_eps"]) >= 0:
                raise ValueError(f"{self.name}: rms_eps must be a finite number ≥ 0, got {params['rms_eps']!r}")
        k = check_route_params(self.name, params, E)
        s = 2 + (g is not None)
        if len(sel) == 1:
            expect(self.name, f"bias (input {s}, [experts])", sel[0], (E,))
            if E > 256:
                raise ValueError(f"{self.name}: the bias top-k ranks at most 256 experts, got {E} (MUL_MAT then "
                                 "V4_ROUTE takes more)")
        else:
            expect(self.name, f"tid2eid (input {s}, [vocab, top_k])", sel[0], (None, k), "i32")
            expect(self.name, f"ids (input {s + 1}, [1])", sel[1], (1,), "i32")
            unit_last(self.name, "tid2eid", sel[0])
        for what, t in (("x", x), ("w", w)):
            unit_last(self.name, what, t)
        why = layout_refusal(D, x.offset, w.offset, w.strides[0], g.offset if g is not None else None)
        if why:
            raise ValueError(f"{self.name}: {why}")
        return (1, k + 1, 2), "f32"

    def scratch(self, inputs, params):
        return {COUNTERS: (1, "i32", "zeroed"), LOGITS: (inputs[1].shape[0], "f32")}

    def lower(self, node, device):
        x, w, g, sel = self.parts(node.inputs, node.params)
        out, prm = node.output, node.params
        hashed = len(sel) == 2
        D, E = x.shape[1], w.shape[0]
        choice = gate_kernel(device, 1, E, hashed)
        if choice.kernel != "fused":
            raise ValueError(f"{self.name} cannot run here: {choice.reason} (use MUL_MAT then V4_ROUTE)")
        wg, rows, unroll = gate_launch_shape(device, E, hashed)
        groups = -(-E // rows)
        graph = out.graph
        lgs, counters = graph.scratch(LOGITS), graph.scratch(COUNTERS)
        push = {"D": D, "E": E, "x_off": x.offset, "w_off": w.offset, "w_s0": w.strides[0],
                "g_off": g.offset if g is not None else 0, "eps": float(prm.get("rms_eps", 0.0)),
                "sel_off": sel[0].offset, "tid_s0": sel[0].strides[0] if hashed else 0,
                "ids_off": sel[1].offset if hashed else 0, **view_fields("o", out.offset, out.strides),
                "route_scale": float(prm.get("route_scale", 1.0)), "groups": groups, "lg_off": lgs.offset}
        defs = {f"SCORE_{prm.get('scoring', 'sqrtsoftplus').upper()}": 1, **weight_defines(w)}
        if hashed:
            defs["HASH"] = 1
        if g is not None:
            defs["NORM_X"] = 1
        args = [x, w, *sel, out, lgs, counters] + ([g] if g is not None else [])
        o = 2 + len(sel)
        extra = {"full_subgroups": True} if device.caps.subgroup.full_subgroups else {}
        return [Launch("v4_gate", args, (o, o + 1, o + 2), push, grid_1d(groups, 1), defines=defs,
                       spec=(wg, prm["top_k"], rows, unroll), **extra)]

    def reference(self, x, w, *rest, top_k=1, scoring="sqrtsoftplus", route_scale=1.0, rms_eps=None):
        g, sel = (rest[0], rest[1:]) if rms_eps is not None else (None, rest)
        logits = reference_gate_logits(x, w, g, rms_eps)
        return reference_v4_route(logits, sel[0], sel[1] if len(sel) == 2 else None, top_k, scoring, route_scale)


def describe(device, E: int = 256, D: int = 4096) -> dict:
    """What `info` prints of the router at decode on `device` (DeepSeek-V4-Flash: E experts over D):
    V4_GATE or MUL_MAT then V4_ROUTE, why, and V4_GATE's workgroups."""
    c = gate_kernel(device, 1, E, False)
    out = {"experts": E, "D": D, "kernel": c.kernel, "reason": c.reason}
    if c.kernel == "fused":
        wg, rows, unroll = gate_launch_shape(device, E, False)
        out.update(workgroup=wg, rows=rows, unroll=unroll, workgroups=-(-E // rows))
    return out
