"""The plan of an HC op on a device for a shape: which kernel runs, in which launch layout, and why.

`plan(op, device, T, D)` is the one place that decides. It weighs what the device can run and the
environment switches (`policy`), the shape, and the tuning tables below (`SITE_TUNING`,
`PREFILL_CARRY`; `mix_kernels.MIX_TUNING` for the mixes kernels' layouts). The graph functions
(`composite`) build what it returns, run stats record it, and `dsv4_vk info` prints it.

| op | path (`Plan.path`) |
|---|---|
| HC_COMB | `fused:sg16`, `fused:rows4`, `unfused` |
| HC_PRE, HC_POST | `fused`, `unfused` |
| HC_SITE | `fused:site` (the whole-site kernels), `three-op`, `unfused` |
| HC_MIX | `fused:tcr`, `fused:ksplit`, `fused:token`, `fused:tc`, `unfused`; layout: the node params |
| HC_POST_MIX | `fused:decode` / `fused:prefill` (the post carries the next site's mixes), `none`; layout: the node params |
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..core.tuning import knob_table
from . import kernels, mix_kernels, policy, tcr
from .policy import THREE_OP, ksplit_preferred, mix_supported

OPS = ("HC_COMB", "HC_PRE", "HC_POST", "HC_SITE", "HC_MIX", "HC_POST_MIX")

# A site's post carries the next site's mixes through HC_POST_MIX up to this T (decode): its
# workgroups each read the slice of fn they need, once per token; beyond it the next site reads X
# again, or the prefill carry runs (PREFILL_CARRY).
CARRY_MAX_T = 8
# The whole-site kernels run up to this T and the three fused ops beyond: with many tokens HC_SITE's
# per-token reduction and Sinkhorn cost more than the dispatches they save (measured on the H200).
SITE_MAX_T = CARRY_MAX_T
# From this many tokens the mixes stage fn in shared memory per D split (KSPLIT) and stream blocks of
# tokens through it; below, each workgroup reads its fn slice from memory (the per-token kernel).
KSPLIT_MIN_T = 64
# "post_wg": HC_POST_MIX's workgroup at decode, one chunk an invocation, so D/4/post_wg workgroups a
# token. "site_wg": HC_SITE's up to CARRY_MAX_T tokens (HC_PRE's layout beyond): 64, more and smaller
# workgroups each reducing the partials over fewer subgroups. tools/hc_tune.py sweeps both.
SITE_TUNING = knob_table(
    "site",
    post_wg=(64, "HC_POST_MIX's workgroup at decode (one chunk an invocation)"),
    site_wg=(64, "HC_SITE's workgroup up to CARRY_MAX_T tokens (4 to 256, a multiple of 4)"))
# The prefill carry: past CARRY_MAX_T a site's post may carry the next site's mixes too (HC_POST_MIX in
# KSPLIT's layout: the new streams made, written and reduced with the next fn's slices in one pass),
# so that the next site starts from HC_MIX_REDUCE and never reads X_new for its mixes.
# "prefill": None (auto) carries except where the next site's mixes would run on TCR, which reads X
# again in less time than the carry adds to the post (results/h200/hc_tune_carry_tcr_h200.txt);
# True (1) wherever it can; False (0) never.
# "kernel": "ksplit", or "tc" (the tensor-core kernel where the streams are vec4-aligned; slower on the H200).
# "tb", "lpt", "tpl", "rh": KSPLIT's layout for the carry on GPUs (None: HC_MIX's own): blocks of 128
# tokens, 2 lanes a token, one token a lane group, one row group — the fastest swept for the post.
PREFILL_CARRY = knob_table(
    "carry",
    prefill=(None, "the prefill carry: None (auto), True (wherever it can) or False (never)"),
    kernel=("ksplit", "the carry's kernel: ksplit or tc"),
    tb=(128, "KSPLIT tokens a block for the carry on GPUs (None: HC_MIX's own)"),
    lpt=(2, "KSPLIT lanes a token for the carry on GPUs (None: HC_MIX's own)"),
    tpl=(1, "KSPLIT tokens a lane group for the carry on GPUs (None: HC_MIX's own)"),
    rh=(1, "KSPLIT row groups for the carry on GPUs (None: HC_MIX's own)"))
CARRY_KERNELS = ("ksplit", "tc")


@dataclass(frozen=True)
class Plan:
    """What runs for one HC op: `fused` and `variant` (the kernel), the launch `layout` (node
    params, empty where the kernel takes none) and the `reason`, as `info` prints it."""
    op: str
    fused: bool
    variant: str | None
    reason: str
    layout: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def path(self) -> str:
        if not self.fused:
            return self.variant or "unfused"
        return f"fused:{self.variant}" if self.variant != "fused" else "fused"

    @property
    def params(self) -> dict:
        """The layout as node params (a fresh dict)."""
        return dict(self.layout)


def _frozen(layout: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(layout))


def contiguous_chunks(D: int) -> int:
    """Chunks per stream of a contiguous hidden size D: vec4 chunks where D allows, else floats."""
    return D // 4 if D % 4 == 0 else D


def mix_kernel(device, T: int, chunks: int) -> tuple[str, str]:
    """(kernel, reason) of the mixes of T tokens of `chunks` chunks a stream: MIX_TUNING's kernel or
    split where set, else TCR from TCR_MIN_T tokens where the device's cooperative matrices have its
    element layout and D has whole 16-chunk steps, KSPLIT from KSPLIT_MIN_T tokens where the device
    runs it well, else the per-token kernel."""
    t = mix_kernels.MIX_TUNING
    kernel = t["kernel"]
    if kernel is not None:
        if kernel not in mix_kernels.MIX_KERNELS:
            raise ValueError(f"the mixes kernel must be one of {mix_kernels.MIX_KERNELS} or None, got {kernel!r}")
        return kernel, f"tuning knob 'mix.kernel' = {kernel!r}"
    if t["split"] == 0:
        return "token", "tuning knob 'mix.split' = 0: the per-token kernel"
    if t["split"]:
        return "ksplit", f"tuning knob 'mix.split' = {t['split']}: KSPLIT"
    lay = tcr.tcr_layout(device) if T >= tcr.TCR_MIN_T and chunks % 16 == 0 else None
    if isinstance(lay, tuple):
        return "tcr", f"TCR from {tcr.TCR_MIN_T} tokens (tensor cores, element layout {lay})"
    if T >= KSPLIT_MIN_T and ksplit_preferred(device):
        why = f"; TCR {lay}" if isinstance(lay, str) else ""
        return "ksplit", f"KSPLIT from {KSPLIT_MIN_T} tokens (fn staged in shared memory){why}"
    return "token", "the per-token kernel (a token's fn slices read from memory, D split over workgroups)"


def mix_layout(device, T: int, chunks: int, kernel: str | None = None) -> dict:
    """The mixes kernels' node params for T tokens of `chunks` chunks a stream (kernel None: mix_kernel's)."""
    return mix_kernels.mix_layout(device, T, chunks, kernel or mix_kernel(device, T, chunks)[0])


def _site(device, T: int, fused, site) -> Plan:
    if site is not None and not isinstance(site, (bool, np.bool_)):
        raise ValueError(f"site must be None, True or False, got {site!r}")
    if fused is False:
        if site:
            raise ValueError("site=True runs fused kernels, but fused=False was requested")
        return Plan("HC_SITE", False, None, "unfused requested by the caller (fused=False)")
    if site is False:
        return Plan("HC_SITE", False, THREE_OP, "three-op path requested by the caller (site=False)")
    c = policy.choose("HC_SITE", device, True if site else None)
    if c.fused and site is None and T > SITE_MAX_T:
        return Plan("HC_SITE", False, THREE_OP, f"T = {T} > {SITE_MAX_T} tokens: the three fused ops")
    layout = {"wg": SITE_TUNING["site_wg"] if T <= CARRY_MAX_T else None} if c.fused else {}
    return Plan("HC_SITE", c.fused, c.variant, c.reason, _frozen(layout))


def _mixes(device, T: int, chunks: int, fused) -> Plan:
    if fused is False:
        return Plan("HC_MIX", False, None, "unfused requested by the caller (fused=False): RMS_NORM → MUL_MAT")
    why = mix_supported(device)
    if why is not None:
        return Plan("HC_MIX", False, None, f"device cannot run the mixes kernels ({why}): RMS_NORM → MUL_MAT")
    kernel, reason = mix_kernel(device, T, chunks)
    return Plan("HC_MIX", True, kernel, reason, _frozen(mix_kernels.mix_layout(device, T, chunks, kernel)))


def _prefill_carry_kernel(vec4: bool) -> str:
    kernel = PREFILL_CARRY["kernel"]
    if kernel not in CARRY_KERNELS:
        raise ValueError(f"tuning knob 'carry.kernel' must be one of {CARRY_KERNELS}, got {kernel!r}")
    return kernel if vec4 else "ksplit"


def _carry_layout(device, T: int, chunks: int, vec4: bool) -> dict:
    """HC_POST_MIX's node params: the decode workgroup, or the prefill carry kernel's layout (KSPLIT:
    two tokens a lane group at most; on GPUs PREFILL_CARRY's own blocks and lanes)."""
    if T <= CARRY_MAX_T:
        return {"wg": SITE_TUNING["post_wg"]}
    kernel = _prefill_carry_kernel(vec4)
    lay = mix_kernels.mix_layout(device, T, chunks, kernel)
    out = {k: lay[k] for k in ("wg", "split", "lpt", "tb")} | {"tpl": min(lay["tpl"], 2)} \
        | ({"tc": lay["tc"]} if kernel == "tc" else {"rh": lay["rh"]})
    if kernel == "ksplit" and not device.caps.is_cpu:
        out |= {k: PREFILL_CARRY[k] for k in ("tb", "lpt", "tpl", "rh") if PREFILL_CARRY[k] is not None}
    return out


def _carry(device, T: int, D: int, chunks: int, fused, site) -> Plan:
    s = _site(device, T, fused, site)
    vec4 = chunks * 4 == D
    if T <= CARRY_MAX_T:
        if s.fused:
            return Plan("HC_POST_MIX", True, "decode", "the site path carries the next site's mixes at decode",
                        _frozen(_carry_layout(device, T, chunks, vec4)))
        return Plan("HC_POST_MIX", False, "none", f"no site kernels at decode ({s.reason})")
    mode = PREFILL_CARRY["prefill"]
    if mode is not None and (not isinstance(mode, int) or mode not in (0, 1)):    # (bool is an int: 0/1 as tools set it)
        raise ValueError(f"tuning knob 'carry.prefill' must be None (auto), True or False, got {mode!r}")
    if mode is not None and not mode:
        return Plan("HC_POST_MIX", False, "none", "tuning knob 'carry.prefill' off")
    if fused is False:
        return Plan("HC_POST_MIX", False, "none", "unfused requested by the caller (fused=False)")
    if mode is None and mix_kernel(device, T, contiguous_chunks(D))[0] == "tcr":
        return Plan("HC_POST_MIX", False, "none", "the next site's mixes run on TCR, which reads X again in "
                                                  "less time than the carry adds to the post")
    ok = (s.fused or s.variant == THREE_OP) and mix_supported(device) is None and ksplit_preferred(device) \
        and policy.choose("HC_POST", device, fused).fused and policy.choose("HC_COMB", device, fused).fused
    if not ok:
        return Plan("HC_POST_MIX", False, "none", "the post, the comb or KSPLIT's mixes do not run fused here")
    return Plan("HC_POST_MIX", True, "prefill", "the prefill carry: the post in KSPLIT's layout reduces the new "
                                                "streams with the next fn", _frozen(_carry_layout(device, T, chunks, vec4)))


def plan(op: str, device=None, T: int = 1, D: int = 4096, *, chunks: int | None = None, fused: bool | None = None,
         variant: str | None = None, site: bool | None = None) -> Plan:
    """The Plan of HC op `op` on `device` (default: the default device) for T tokens of hidden size D.

    `chunks`: the chunks a stream of the tensors at hand (D/4 where they allow vec4 loads, else D;
    default: D's own). `fused`, `variant`, `site`: a caller's override, as the graph functions take it
    (`fused=True` or a variant the device cannot run raises HCUnsupported)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if device is None:
        from ..vk import default_device
        device = default_device()
    chunks = contiguous_chunks(D) if chunks is None else chunks
    if op in ("HC_COMB", "HC_PRE", "HC_POST"):
        c = policy.choose(op, device, fused, variant)
        return Plan(op, c.fused, c.variant, c.reason)
    if op == "HC_SITE":
        return _site(device, T, fused, site)
    if op == "HC_MIX":
        return _mixes(device, T, chunks, fused)
    return _carry(device, T, D, chunks, fused, site)


def describe(device) -> dict:
    """What `info` prints: {op: {"path", "reason"}} at decode for the four ops, plus the mixes of
    many tokens (`hc_mix`) and where the post carries (`hc_carry`, at D = 4096)."""
    out = {"hc": policy.describe(device)}
    lay = tcr.tcr_layout(device)                # (a probe dispatch where the device has the shapes)
    out["hc_mix"] = ({"kernel": "tcr", "from_tokens": tcr.TCR_MIN_T, "layout": list(lay)} if isinstance(lay, tuple)
                     else {"kernel": "ksplit", "tcr": lay})
    out["hc_carry"] = carry_summary(device)
    return out


def carry_summary(device, D: int = 4096) -> dict:
    """Where a site's post carries the next site's mixes at hidden size D: at decode (T ≤ CARRY_MAX_T),
    past it below TCR_MIN_T, and from TCR_MIN_T tokens."""
    spans = {f"1-{CARRY_MAX_T}": 1, f"{CARRY_MAX_T + 1}-{tcr.TCR_MIN_T - 1}": CARRY_MAX_T + 1,
             f">={tcr.TCR_MIN_T}": tcr.TCR_MIN_T}
    return {"D": D, **{span: plan("HC_POST_MIX", device, T, D).fused for span, T in spans.items()}}


def carries(device, fused, T: int, D: int, site=None) -> bool:
    """Whether a site's post carries the next site's mixes partials at T tokens of hidden size D."""
    return plan("HC_POST_MIX", device, T, D, fused=fused, site=site).fused


def carry_split_chunks(T: int, D: int) -> int:
    """Chunks per D split of the mixes partials a post carries at T tokens of contiguous hidden size
    D: a HC_POST_MIX workgroup's post_wg/4 at decode, the prefill carry kernel's split past CARRY_MAX_T."""
    if T <= CARRY_MAX_T:
        return kernels.post_mix_split(SITE_TUNING["post_wg"])
    return mix_kernels.TC_SPLIT if _prefill_carry_kernel(D % 4 == 0) == "tc" else mix_kernels.KSPLIT_S


def carry_splits(T: int, D: int) -> int:
    """The number of D splits G in the mixes partials [T, G, m+1] that a post carries at T tokens
    of contiguous hidden size D (chunks of 4 floats where D allows)."""
    return -(-contiguous_chunks(D) // carry_split_chunks(T, D))
