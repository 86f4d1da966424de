"""The model in float64 numpy: the end-to-end reference the device model is checked against.

`ReferenceModel(cfg, weights).forward(ids)` runs the whole sequence at positions 0..N−1 with a
causal mask and returns logits [N, V]; it shares every formula with the kernels' references
(dsv4_vk.hc.kernels, dsv4_vk.ops.attention, dsv4_vk.ops.moe), none of the device code.
"""
import numpy as np

from ..hc.kernels import reference_head_pre, reference_post, reference_site_pre
from ..ops.attention import apply_rope, reference_attention, rope_tables
from ..ops.moe import reference_route, silu
from .checkpoint import check_tensors


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


class ReferenceModel:
    def __init__(self, cfg, weights):
        check_tensors(cfg, {k: np.shape(v) for k, v in weights.items()})
        self.cfg = cfg
        self.w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
        self.cos, self.sin = rope_tables(cfg.head_dim, cfg.max_ctx, cfg.rope_theta)

    def attention(self, i, x, positions):
        cfg, w = self.cfg, self.w
        T, H, hd = x.shape[0], cfg.n_heads, cfg.head_dim
        p = f"layers.{i}.attn."
        q, k, v = ((x @ w[p + f"{n}.weight"].T).reshape(T, H, hd) for n in ("wq", "wk", "wv"))
        cs, sn = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        o = reference_attention(apply_rope(q, cs, sn), apply_rope(k, cs, sn), v, positions, hd ** -0.5)
        return o.reshape(T, H * hd) @ w[p + "wo.weight"].T

    def moe(self, i, x):
        cfg, w = self.cfg, self.w
        p = f"layers.{i}.ffn."
        route = reference_route(x @ w[p + "gate.weight"].T, cfg.top_k, cfg.router, cfg.norm_topk,
                                cfg.route_scale, cfg.n_shared)
        w1 = np.concatenate([w[p + "experts.w1"]] + ([w[p + "shared_experts.w1"]] if cfg.n_shared else []))
        w3 = np.concatenate([w[p + "experts.w3"]] + ([w[p + "shared_experts.w3"]] if cfg.n_shared else []))
        w2 = np.concatenate([w[p + "experts.w2"]] + ([w[p + "shared_experts.w2"]] if cfg.n_shared else []))
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            for e, weight in route[t]:
                e = int(e)
                out[t] += weight * (w2[e] @ (silu(w1[e] @ x[t]) * (w3[e] @ x[t])))
        return out

    def site(self, X, i, name, sublayer):
        cfg, w = self.cfg, self.w
        p = f"layers.{i}."
        u, post, comb = reference_site_pre(X, w[p + f"hc_{name}_fn"], w[p + f"hc_{name}_scale"],
                                           w[p + f"hc_{name}_base"], cfg.hc_eps, cfg.hc_norm_eps, cfg.n_iter)
        f = sublayer(rms_norm(u, w[p + f"{name}_norm.weight"], cfg.rms_eps))
        return reference_post(f, X, post, comb)

    def forward(self, ids):
        """logits [N, V] of tokens `ids` at positions 0..N−1."""
        cfg, w = self.cfg, self.w
        ids = np.asarray(ids, np.int64)
        if ids.ndim != 1 or not 1 <= len(ids) <= cfg.max_ctx:
            raise ValueError(f"ids must be 1-D with 1..{cfg.max_ctx} tokens, got shape {ids.shape}")
        positions = np.arange(len(ids))
        X = np.repeat(w["embed.weight"][ids][:, None, :], cfg.hc, axis=1)
        for i in range(cfg.n_layers):
            X = self.site(X, i, "attn", lambda x: self.attention(i, x, positions))
            X = self.site(X, i, "ffn", lambda x: self.moe(i, x))
        h = reference_head_pre(X, w["hc_head_fn"], w["hc_head_scale"], w["hc_head_base"], cfg.hc_eps, cfg.hc_norm_eps)
        return rms_norm(h, w["norm.weight"], cfg.rms_eps) @ w["head.weight"].T
