"""The model as device graphs: one prefill graph per chunk length and one decode graph (T = 1),
sharing every weight, KV cache and per-step value as executor params.

Params (Graph.param names; docs/model.md lists them):
- checkpoint tensors uploaded as they are, under their checkpoint names (HC tensors, norms, the
  router, embed, head), plus per layer `layers.{i}.attn.wqkv` [3A, D] (wq | wk | wv rows),
  `layers.{i}.ffn.w13` [E+S, 2F, D] (w1 | w3 rows of the routed then the shared experts) and
  `layers.{i}.ffn.w2` [E+S, D, F];
- `layers.{i}.kv_cache` [max_ctx, 2, H, hd] (keys RoPE-rotated, values), `rope.cos` / `rope.sin`;
- per step: `step.pos` (i32 [1], position of the chunk's first token), `step.last` (i32 [1], the
  prefill chunk's last valid row), `step.token` (i32 [1]: the decode step's input token, and where
  SAMPLE writes the next one), `sampler.cfg` (f32 [2]: temperature, top_k), `sampler.state`
  (i32 [2]: seed, counter).
"""
import numpy as np

from .. import hc
from ..core.graph import Graph
from ..ops.attention import rope_tables

STEP_PARAMS = ("step.pos", "step.last", "step.token")


def param_arrays(cfg, weights):
    """{param name: array} to upload for `cfg` from checkpoint `weights` (the fused layouts built here)."""
    out = {}
    for name, a in weights.items():
        if ".attn.w" in name and name.endswith(("wq.weight", "wk.weight", "wv.weight")):
            continue
        if ".ffn.experts." in name or ".ffn.shared_experts." in name:
            continue
        out[name] = np.asarray(a, np.float32)
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        out[p + "attn.wqkv"] = np.concatenate([weights[p + f"attn.{n}.weight"] for n in ("wq", "wk", "wv")])
        groups = ["experts"] + (["shared_experts"] if cfg.n_shared else [])
        w1 = np.concatenate([weights[p + f"ffn.{g}.w1"] for g in groups])
        w3 = np.concatenate([weights[p + f"ffn.{g}.w3"] for g in groups])
        out[p + "ffn.w13"] = np.concatenate([w1, w3], axis=1)
        out[p + "ffn.w2"] = np.concatenate([weights[p + f"ffn.{g}.w2"] for g in groups])
        out[p + "kv_cache"] = np.zeros((cfg.max_ctx, 2, cfg.n_heads, cfg.head_dim), np.float32)
    cos, sin = rope_tables(cfg.head_dim, cfg.max_ctx, cfg.rope_theta)
    out["rope.cos"], out["rope.sin"] = cos.astype(np.float32), sin.astype(np.float32)
    for name in STEP_PARAMS:
        out[name] = np.zeros(1, np.int32)
    out["sampler.cfg"] = np.array([0.0, 1.0], np.float32)
    out["sampler.state"] = np.array([0, 0], np.int32)
    return out


class ModelGraph:
    """Builds one forward graph of T tokens; `params` are the uploaded arrays (names, shapes, dtypes)."""

    def __init__(self, cfg, params, T, *, prefill, fused, device):
        self.cfg, self.params, self.fused, self.device = cfg, params, fused, device
        self.g = g = Graph()
        ids = g.input("ids", (T,), "i32") if prefill else self.param("step.token")
        self.pos = self.param("step.pos")
        logits = self.forward(ids, T)
        g.output("logits", logits)
        last = g.op("GET_ROWS", logits, self.param("step.last")) if prefill else logits
        g.op("SAMPLE", last, self.param("sampler.cfg"), self.param("sampler.state"), out=self.param("step.token"))

    def param(self, name):
        a = self.params[name]
        return self.g.param(name, a.shape, "i32" if a.dtype == np.int32 else "f32")

    def forward(self, ids, T):
        cfg, g = self.cfg, self.g
        D = cfg.dim
        emb = g.op("GET_ROWS", self.param("embed.weight"), ids)                       # [T, D]
        X = g.op("CONT", emb.reshape(T, 1, D).broadcast_to((T, cfg.hc, D)))           # 4 streams
        for i in range(cfg.n_layers):
            X = self.site(X, i, "attn", self.attention)
            X = self.site(X, i, "ffn", self.moe)
        h = hc.head_pre(g, X, self.param("hc_head_fn"), self.param("hc_head_scale"), self.param("hc_head_base"),
                        hc_eps=cfg.hc_eps, norm_eps=cfg.hc_norm_eps, fused=self.fused, device=self.device)
        h = g.op("RMS_NORM", h, self.param("norm.weight"), eps=cfg.rms_eps)
        return g.op("MUL_MAT", h, self.param("head.weight"))                          # [T, V]

    def site(self, X, i, name, sublayer):
        """u, post, comb = site_pre(X); f = sublayer(rmsnorm_w(u)); X = post(f, X, post, comb)."""
        cfg, g = self.cfg, self.g
        p = f"layers.{i}."
        u, post, comb = hc.site_pre(g, X, self.param(p + f"hc_{name}_fn"), self.param(p + f"hc_{name}_scale"),
                                    self.param(p + f"hc_{name}_base"), hc_eps=cfg.hc_eps, norm_eps=cfg.hc_norm_eps,
                                    n_iter=cfg.n_iter, fused=self.fused, device=self.device)
        x = g.op("RMS_NORM", u, self.param(p + f"{name}_norm.weight"), eps=cfg.rms_eps)
        return hc.post(g, sublayer(i, x), X, post, comb, fused=self.fused, device=self.device)

    def attention(self, i, x):
        """Multi-head attention with RoPE; this chunk's keys/values go to the cache at step.pos."""
        cfg, g = self.cfg, self.g
        T, H, hd = x.shape[0], cfg.n_heads, cfg.head_dim
        p = f"layers.{i}."
        qkv = g.op("MUL_MAT", x, self.param(p + "attn.wqkv")).reshape(T, 3, H, hd)
        cos, sin = self.param("rope.cos"), self.param("rope.sin")
        cache = self.param(p + "kv_cache")                                             # [C, 2, H, hd]
        cache = g.op("KV_WRITE", cache, qkv[:, 1:3], self.pos, cos, sin, rotate=1, out=cache)
        o = g.op("ATTENTION", qkv[:, 0], cache[:, 0], cache[:, 1], self.pos, cos, sin, scale=hd ** -0.5)
        return g.op("MUL_MAT", o.reshape(T, H * hd), self.param(p + "attn.wo.weight"))

    def moe(self, i, x):
        """Router → top-k on the device → the chosen experts' SwiGLU (+ shared experts) → weighted sum."""
        cfg, g = self.cfg, self.g
        T, D = x.shape
        p = f"layers.{i}.ffn."
        route = g.op("MOE_ROUTE", g.op("MUL_MAT", x, self.param(p + "gate.weight")), top_k=cfg.top_k,
                     router=cfg.router, norm=cfg.norm_topk, route_scale=float(cfg.route_scale), n_shared=cfg.n_shared)
        h = g.op("MUL_MAT_ID", x.reshape(T, 1, D), self.param(p + "w13"), route, mode="swiglu")   # [T, R, F]
        return g.op("MUL_MAT_ID", h, self.param(p + "w2"), route, mode="sum")                     # [T, D]
