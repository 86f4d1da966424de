"""DeepSeek-V4's hyper-connections (mHC), the centre of dsv4_vk, in one place:

- `kernels`: the fused op declarations (HC_COMB, HC_COEFS, HC_PRE, HC_POST, and the whole-site
  HC_SITE) with their float64 references; `mix_kernels`: the mixes ops (HC_MIX, HC_MIX_PART,
  HC_MIX_REDUCE, and HC_POST_MIX, the post that carries the next site's mixes), their kernels'
  layouts and tuning tables; `tcr`: the mixes of many tokens on tensor cores (the device's probed
  element layout, HC_MIX_FN_SPLIT, HC_MIX_TCR);
- `composite`: graph functions that append the fused node(s) or the unfused chain of primitives
  (`comb`, `pre`, `post`, `mixes`, `site_pre`, `site_post`, `site`, `head_pre`);
- `policy`: what a device can run (capabilities) and the environment switches;
- `plan`: the one place that decides which kernel runs for an op on a device at a shape, in which
  layout and why (`plan.plan`; `info` prints it);
- `api`: the ops as functions (`hc_comb`, `hc_pre`, `hc_post`, `hc_site_pre`): numpy in → numpy
  out, device Tensors in → Tensors out;
- `resident`: `HcSite` / `HcHead`, a site's (or the head's) weights resident on a device, and
  `MixCarry`, the next site's mixes computed by a post;
- `cases`: the one case list behind eval, bench, the tests and the GPU check; `metrics`: errors.
"""
from .. import ops as _primitives  # noqa: F401  (the unfused chains are built from these)
from . import kernels, mix_kernels, plan, tcr  # noqa: F401  (register the fused ops)
from .api import hc_comb, hc_post, hc_pre, hc_site_pre, last_run
from .composite import (comb, comb_chain, head_pre, mixes, post, post_chain, pre, pre_chain, site, site_post, site_pre,
                        variants)
from .plan import CARRY_MAX_T, SITE_MAX_T, Plan, carries
from .kernels import HC, N_MIX
from .policy import HCUnsupported
from .resident import HcHead, HcSite, MixCarry

__all__ = ["HC", "N_MIX", "HCUnsupported", "HcHead", "HcSite", "MixCarry", "carries", "comb", "comb_chain", "head_pre", "hc_comb",
           "hc_post", "hc_pre", "hc_site_pre", "last_run", "mixes", "post", "post_chain", "pre", "pre_chain", "site",
           "site_post", "site_pre", "variants", "CARRY_MAX_T", "SITE_MAX_T", "Plan", "plan"]
