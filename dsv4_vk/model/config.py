"""Model configuration: a DeepSeek-V4-shaped decoder (hyper-connection residual streams, attention
with RoPE and a KV cache, routed + shared SwiGLU experts). Every field is validated on creation;
the config travels inside the checkpoint's metadata as JSON.
"""
import dataclasses
import json
import math
from dataclasses import dataclass

ROUTERS = ("softmax", "sigmoid")
MAX_TOP_K = 64            # the device sampler keeps at most this many candidates per row


@dataclass(frozen=True)
class Config:
    vocab: int = 256                 # V
    dim: int = 64                    # D, hidden size
    n_layers: int = 2                # L
    n_heads: int = 4                 # H (multi-head attention, as many K/V heads as query heads)
    head_dim: int = 16               # even: RoPE rotates pairs
    n_experts: int = 4               # E routed experts
    top_k: int = 2                   # experts picked per token
    expert_dim: int = 32             # F, width of every expert (routed and shared)
    n_shared: int = 1                # shared experts (always applied, weight 1)
    router: str = "sigmoid"          # scores: "softmax" over E, or per-expert "sigmoid"
    norm_topk: bool = True           # divide the picked scores by their sum
    route_scale: float = 1.0         # multiplies the routed weights (not the shared expert's)
    hc: int = 4                      # residual streams; the fused HC kernels are built for 4
    n_iter: int = 20                 # Sinkhorn iterations of HC_COMB
    hc_eps: float = 1e-6             # HC pre/softmax/Sinkhorn eps
    hc_norm_eps: float = 1e-6        # the RMS of the flattened streams in each HC site
    rms_eps: float = 1e-6            # the sublayer and final RMSNorms
    max_ctx: int = 64                # KV cache capacity in tokens
    rope_theta: float = 10000.0

    def __post_init__(self):
        for name in ("vocab", "dim", "n_layers", "n_heads", "head_dim", "n_experts", "top_k",
                     "expert_dim", "hc", "n_iter", "max_ctx"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Config.{name} must be an integer ≥ 1, got {v!r}")
        if isinstance(self.n_shared, bool) or not isinstance(self.n_shared, int) or self.n_shared < 0:
            raise ValueError(f"Config.n_shared must be an integer ≥ 0, got {self.n_shared!r}")
        if self.hc != 4:
            raise ValueError(f"Config.hc must be 4 (the HC kernels' stream count), got {self.hc}")
        if self.head_dim % 2:
            raise ValueError(f"Config.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.top_k > self.n_experts:
            raise ValueError(f"Config.top_k ({self.top_k}) must be ≤ n_experts ({self.n_experts})")
        if self.router not in ROUTERS:
            raise ValueError(f"Config.router must be one of {ROUTERS}, got {self.router!r}")
        if not isinstance(self.norm_topk, bool):
            raise ValueError(f"Config.norm_topk must be True or False, got {self.norm_topk!r}")
        for name in ("hc_eps", "hc_norm_eps", "rms_eps", "rope_theta", "route_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"Config.{name} must be a finite number > 0, got {v!r}")
        if self.vocab >= 1 << 24:
            raise ValueError(f"Config.vocab must be < 2^24 (ids travel as exact f32 in the sampler), got {self.vocab}")

    @property
    def attn_dim(self):
        return self.n_heads * self.head_dim

    @property
    def n_mix(self):
        return (2 + self.hc) * self.hc

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text):
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"model config is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ValueError(f"model config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model config has unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def tensor_shapes(cfg):
    """{name: shape} of every tensor a checkpoint of `cfg` holds (the naming of docs/model.md)."""
    D, V, A, F, E, M = cfg.dim, cfg.vocab, cfg.attn_dim, cfg.expert_dim, cfg.n_experts, cfg.n_mix
    hcD = cfg.hc * D
    shapes = {"embed.weight": (V, D)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        for site in ("attn", "ffn"):
            shapes[p + f"hc_{site}_fn"] = (M, hcD)
            shapes[p + f"hc_{site}_base"] = (M,)
            shapes[p + f"hc_{site}_scale"] = (3,)
        shapes[p + "attn_norm.weight"] = (D,)
        for w in ("wq", "wk", "wv"):
            shapes[p + f"attn.{w}.weight"] = (A, D)
        shapes[p + "attn.wo.weight"] = (D, A)
        shapes[p + "ffn_norm.weight"] = (D,)
        shapes[p + "ffn.gate.weight"] = (E, D)
        shapes[p + "ffn.experts.w1"] = (E, F, D)
        shapes[p + "ffn.experts.w3"] = (E, F, D)
        shapes[p + "ffn.experts.w2"] = (E, D, F)
        if cfg.n_shared:
            shapes[p + "ffn.shared_experts.w1"] = (cfg.n_shared, F, D)
            shapes[p + "ffn.shared_experts.w3"] = (cfg.n_shared, F, D)
            shapes[p + "ffn.shared_experts.w2"] = (cfg.n_shared, D, F)
    shapes["hc_head_fn"] = (cfg.hc, hcD)
    shapes["hc_head_base"] = (cfg.hc,)
    shapes["hc_head_scale"] = (1,)
    shapes["norm.weight"] = (D,)
    shapes["head.weight"] = (V, D)
    return shapes
