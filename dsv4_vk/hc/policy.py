"""Which hyper-connection kernels run on a device, and why.

Resolved once per device and process from the environment and the device's capabilities:
- `DSV4_VK_DISABLE_HC` (all three ops), `DSV4_VK_DISABLE_HC_COMB` / `_PRE` / `_POST` (one each):
  1/true/yes/on disable the fused kernel (the unfused chain runs), 0/false/no/off/empty keep it;
  any other value is a ValueError.
- `DSV4_VK_DISABLE_HC_SITE` (same values): the whole-site kernels (HC_MIX_PART / HC_SITE /
  HC_POST_MIX: a site in two dispatches at decode) off; sites then run the three-op path (HC_MIX,
  HC_COEFS, HC_PRE, HC_POST), which keeps its own switches. The site also runs only where all
  three ops run fused (a switch that disables one of them, or `DSV4_VK_DISABLE_HC`, disables it).
- `DSV4_VK_HC_COMB_VARIANT=sg16|rows4` forces the HC_COMB kernel variant.
- Device contract: `sg16` (16 lanes per token) needs subgroup size ≥ 16, shuffles and required full
  subgroups; `rows4` (4 lanes per token) needs shuffles and subgroup size ≥ 4. A 16-lane shuffle
  kernel is never run on a smaller subgroup (it returns garbage without any error).
Per call, `fused=True/False` overrides the environment; `fused=True` (or a variant) that the
device cannot run raises HCUnsupported instead of falling back.
"""
import functools
import logging
import os
import weakref
from dataclasses import dataclass

import numpy as np

from ..vk import env

log = logging.getLogger("dsv4_vk")

OPS = ("HC_COMB", "HC_PRE", "HC_POST", "HC_SITE")
THREE_OP = "three-op"     # HC_SITE's fallback path
COMB_VARIANTS = ("sg16", "rows4")
ALL_ENV = "DSV4_VK_DISABLE_HC"
VARIANT_ENV = "DSV4_VK_HC_COMB_VARIANT"


class HCUnsupported(ValueError):
    """A fused HC kernel (or variant) was requested that this device cannot run."""


@dataclass(frozen=True)
class Choice:
    fused: bool
    variant: str | None  # "sg16" / "rows4" for HC_COMB, "fused" for PRE/POST, "site" for HC_SITE;
                        # None when unfused (HC_SITE off: "three-op")
    reason: str

    @property
    def path(self) -> str:
        if not self.fused:
            return self.variant or "unfused"
        return f"fused:{self.variant}" if self.variant != "fused" else "fused"


def env_switch(name):
    """True when env `name` disables, False when unset or it keeps enabled; ValueError otherwise."""
    return env.flag(name, "disable")


def disabled_by(op):
    """'NAME=value' of the variable that disables `op`'s fused kernel, or None. Both are validated."""
    own = f"{ALL_ENV}_{op[3:]}"
    hit = None
    for name in (ALL_ENV, own):
        if env_switch(name) and hit is None:
            hit = f"{name}={os.environ[name]}"
    return hit


def forced_variant():
    raw = os.environ.get(VARIANT_ENV)
    if raw is None or raw.strip() == "":
        return None
    v = raw.strip().lower()
    if v not in COMB_VARIANTS:
        raise ValueError(f"environment variable {VARIANT_ENV}={raw!r} is not understood: expected one of "
                         f"{', '.join(COMB_VARIANTS)} (or unset)")
    return v


# --- device capabilities ---------------------------------------------------------------------------

def sg16_subgroup_size(device):
    """Subgroup size the sg16 kernel would run at (≥ 16), or None."""
    sg = device.caps.subgroup
    if device.subgroup_size >= 16:
        return device.subgroup_size
    if sg.size_control and sg.required_size_compute and sg.max_size >= 16:
        return max(16, sg.min_size)
    return None


def required_subgroup_size(device, size):
    """`size` when the device can pin a pipeline's subgroup size to it, else None."""
    sg = device.caps.subgroup
    if sg.size_control and sg.required_size_compute and sg.min_size <= size <= sg.max_size:
        return size
    return None


def comb_support(device):
    """{variant: None if the device can run it, else why not}."""
    sgc = device.caps.subgroup
    size = device.subgroup_size
    shuffle = device.supports_subgroup_op("shuffle")
    out = {}
    if not shuffle:
        out["sg16"] = out["rows4"] = "no subgroup shuffle in compute shaders"
        return out
    sg16 = sg16_subgroup_size(device)
    if sg16 is None:
        out["sg16"] = f"subgroup size {size} < 16"
    elif not sgc.full_subgroups:
        out["sg16"] = f"subgroup size {size} but full subgroups cannot be required"
    elif sg16 != size and required_subgroup_size(device, sg16) is None:
        out["sg16"] = f"subgroup size {size} < 16 and it cannot be pinned to {sg16}"
    else:
        out["sg16"] = None
    out["rows4"] = None if size >= 4 and size % 4 == 0 else f"subgroup size {size} is not a multiple of 4 lanes"
    return out


def mix_supported(device):
    """The HC_MIX kernels reduce with subgroupAdd: None when the device can run them, else why not."""
    ok = device.supports_subgroup_op("basic") and device.supports_subgroup_op("arithmetic")
    return None if ok else "no subgroup arithmetic in compute shaders"


def ksplit_runs(device):
    """KSPLIT sums a token's lanes with shuffles inside full subgroups: whether the device can run it."""
    return device.supports_subgroup_op("shuffle") and device.caps.subgroup.full_subgroups


def ksplit_preferred(device):
    """Whether many tokens' mixes take KSPLIT by default (it runs, with subgroups of ≥ 4 lanes)."""
    return ksplit_runs(device) and device.caps.subgroup.min_size >= 4


def full_subgroups_for(device, wg):
    """Whether a pipeline of workgroup size wg may ask for full subgroups: the device can require
    them, and wg is a multiple of its largest subgroup (Vulkan's condition for the request; a smaller
    workgroup runs as one partial subgroup, which the kernels' reductions allow for)."""
    sg = device.caps.subgroup
    return bool(sg.full_subgroups and wg % sg.max_size == 0)


def site_supported(device):
    """HC_SITE / HC_POST_MIX need subgroup arithmetic and the ROWS4 Sinkhorn (shuffles, subgroups of a
    multiple of 4 lanes): None when the device can run them, else why not."""
    return mix_supported(device) or comb_support(device)["rows4"]


def variants(device):
    """Kernel variants this device can run, per op."""
    sup = comb_support(device)
    return {"HC_COMB": [v for v in COMB_VARIANTS if sup[v] is None], "HC_PRE": ["fused"], "HC_POST": ["fused"],
            "HC_SITE": ["site"] if site_supported(device) is None else []}


# --- resolution ----------------------------------------------------------------------------------------

_resolved: dict[int, tuple] = {}     # id(device) -> (the device by weak reference where it takes one, {op: Choice})
_generation = [0]


def generation():
    """Bumped by clear(): cached programs built under older choices are not reused."""
    return _generation[0]


def _resolve_comb(device):
    env = disabled_by("HC_COMB")
    forced = forced_variant()
    if env:
        return Choice(False, None, f"disabled by environment ({env})")
    sup = comb_support(device)
    size = device.subgroup_size
    if forced:
        if sup[forced] is not None:
            raise HCUnsupported(f"{VARIANT_ENV}={forced} but this device cannot run HC_COMB variant {forced}: "
                                f"{sup[forced]}")
        return Choice(True, forced, f"{VARIANT_ENV}={forced}: HC_COMB uses variant {forced}")
    if sup["sg16"] is None:
        size16 = sg16_subgroup_size(device)
        pinned = f" (pinned; default {size})" if size16 != size else ""
        return Choice(True, "sg16", f"subgroup size {size16}{pinned} ≥ 16 with shuffle and full subgroups: "
                                    "HC_COMB uses variant sg16")
    if sup["rows4"] is None:
        return Choice(True, "rows4", f"{sup['sg16']}: HC_COMB uses variant rows4")
    return Choice(False, None, f"device cannot run a fused HC_COMB ({sup['rows4']}): unfused chain")


def _resolve_plain(op):
    env = disabled_by(op)
    if env:
        return Choice(False, None, f"disabled by environment ({env})")
    return Choice(True, "fused", "fused kernel (vec4 loads where D % 4 == 0), any device")


def _resolve_site(device, parts):
    """HC_SITE from its own switch, the three ops' choices `parts` and the device."""
    env = disabled_by("HC_SITE")
    if env:
        return Choice(False, THREE_OP, f"disabled by environment ({env}): three-op path")
    off = [f"{op} {c.path} ({c.reason})" for op, c in parts.items() if not c.fused]
    if off:
        return Choice(False, THREE_OP, "part of the site is not fused: " + "; ".join(off) + ": three-op path")
    why = site_supported(device)
    if why is not None:
        return Choice(False, THREE_OP, f"device cannot run the site kernels ({why}): three-op path")
    return Choice(True, "site", "whole-site kernels: HC_MIX_PART, HC_SITE (mixes, gates, ROWS4 Sinkhorn, "
                                "pre collapse), HC_POST_MIX (post + next site's mixes)")


def _resolve_op(op, device):
    if op == "HC_SITE":
        return _resolve_site(device, {o: _resolve_op(o, device) for o in OPS if o != "HC_SITE"})
    return _resolve_comb(device) if op == "HC_COMB" else _resolve_plain(op)


def resolve(device):
    """{op: Choice} for `device`, computed once per device and process (and logged once)."""
    key = id(device)
    hit = _resolved.get(key)
    if hit is not None and hit[0]() is device:
        return hit[1]
    choices = {op: _resolve_op(op, device) for op in OPS if op != "HC_SITE"}
    choices["HC_SITE"] = _resolve_site(device, dict(choices))
    # a weak reference: a device dropped without close() must stay collectable (Device.__del__)
    try:
        ref = weakref.ref(device, functools.partial(_forget, key))
    except TypeError:               # a stand-in without weak references (tests' fake devices)
        ref = functools.partial(_same, device)
    _resolved[key] = (ref, choices)
    for op, c in choices.items():
        log.info("%s on %s: %s (%s)", op, device.name, c.path, c.reason)
    return choices


def _same(device):
    return device


def _forget(key, ref):
    hit = _resolved.get(key)
    if hit is not None and hit[0] is ref:      # (not a newer device that got the same id)
        del _resolved[key]


def clear():
    """Forget resolved choices (tests that change the environment inside one process)."""
    _resolved.clear()
    _generation[0] += 1


def describe(device):
    """{op: {"path": "fused:sg16" | "fused:rows4" | "fused" | "unfused", "reason": ...}}."""
    try:
        return {op: {"path": c.path, "reason": c.reason} for op, c in resolve(device).items()}
    except ValueError:            # a bad environment value: report it per op instead of crashing `info`
        out = {}
        for op in OPS:
            try:
                c = _resolve_op(op, device)
                out[op] = {"path": c.path, "reason": c.reason}
            except ValueError as e:
                out[op] = {"path": "error", "reason": str(e)}
        return out


def check_override(op, fused=None, variant=None):
    """Validate a caller's fused / variant values (no device needed)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if fused is not None and not isinstance(fused, (bool, np.bool_)):
        raise ValueError(f"fused must be None, True or False, got {fused!r}")
    if variant is not None:
        if op == "HC_SITE" and variant in ("site", THREE_OP):
            if fused is False:
                raise ValueError(f"variant={variant!r} names a fused path but fused=False was requested")
            return
        if op != "HC_COMB":
            raise ValueError(f"variant applies to HC_COMB only, got variant={variant!r} for {op}")
        if variant not in COMB_VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(COMB_VARIANTS)} (or None), got {variant!r}")
        if fused is False:
            raise ValueError(f"variant={variant!r} names a fused kernel but fused=False was requested")


def choose(op, device, fused=None, variant=None):
    """The Choice for one call: the resolved one, or the caller's override (validated)."""
    check_override(op, fused, variant)
    fused = None if fused is None else bool(fused)
    if fused is False:
        return Choice(False, None, "unfused requested by the caller (fused=False)")
    if fused is None and variant is None:
        return resolve(device)[op]
    if op == "HC_SITE":
        return _choose_site(device, fused, variant)
    if op != "HC_COMB":
        return Choice(True, "fused", "fused requested by the caller (fused=True)")
    sup = comb_support(device)
    if variant is None:
        resolved = resolve(device)["HC_COMB"]
        if resolved.fused:
            return Choice(True, resolved.variant, "fused requested by the caller (fused=True); " + resolved.reason)
        variant = forced_variant() or next((v for v in COMB_VARIANTS if sup[v] is None), None)
        if variant is None:
            raise HCUnsupported(f"fused=True but this device cannot run a fused HC_COMB: {sup['rows4']}")
    if sup[variant] is not None:
        raise HCUnsupported(f"HC_COMB variant {variant} cannot run on this device: {sup[variant]}")
    return Choice(True, variant, f"variant {variant} requested by the caller")


def _choose_site(device, fused, variant):
    """HC_SITE with a caller's override: variant "site" (or fused=True) forces the site kernels,
    "three-op" the three fused ops."""
    if variant == THREE_OP:
        return Choice(False, THREE_OP, "three-op path requested by the caller")
    why = site_supported(device)
    if why is not None:
        raise HCUnsupported(f"the whole-site kernels cannot run on this device: {why}")
    return Choice(True, "site", "site kernels requested by the caller")
