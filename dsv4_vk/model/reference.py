"""DeepSeek-V4 in float64 numpy: the end-to-end reference the device model is checked against,
itself checked against transformers' logits (tests/fixtures, tools/make_dsv4_fixtures.py).

`V4Reference(cfg, weights).forward(ids)` runs the whole sequence at positions 0..N−1 and returns
logits [N, V]. Transformers' cached decode equals its no-cache forward to ~1e-13 (the fixtures
record both), so one causal forward serves prefill and every decode step. The formulas are
docs/model.md's; each sublayer is a separate function the kernel tests reuse.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..hc.kernels import reference_head_pre, reference_post, reference_site_pre
from ..ops.moe import router_scores
from .checkpoint import check_tensors
from .config import CSA, SWA, V4Config


def rms_norm(x, w=None, eps=1e-6):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def inv_freq(cfg: V4Config, kind: str) -> np.ndarray:
    """RoPE inverse frequencies [rd/2] of the "main" (sliding layers) or "compress" rope (compressed
    layers, their compressors and the indexer), YaRN as transformers computes it."""
    rd = cfg.rope_dim
    base = cfg.rope_theta if kind == "main" else cfg.compress_rope_theta
    pos_freqs = base ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    if kind == "main" or not cfg.yarn:
        return 1.0 / pos_freqs
    y = cfg.yarn
    factor, orig = float(y["factor"]), float(y["original_max_position_embeddings"])
    beta_fast, beta_slow = y.get("beta_fast") or 32, y.get("beta_slow") or 1

    def corr(rot):
        return rd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    # transformers reads `truncate` from the top level of V4's nested rope_parameters, where it is
    # never set: the correction range is always truncated
    low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), rd - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrap = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap


def rope(x, positions, freqs, sign=1.0):
    """Rotate the trailing 2·len(freqs) channels of x [..., T, (H,) n] by interleaved pairs at
    `positions` [T] (sign −1: the inverse rotation). x's T axis is the one matching positions."""
    x = np.array(x, np.float64)
    rd = 2 * len(freqs)
    ang = np.asarray(positions, np.float64)[:, None] * freqs[None, :]           # [T, rd/2]
    cos, sin = np.cos(ang), sign * np.sin(ang)
    while cos.ndim < x.ndim:                                                    # broadcast over heads
        cos, sin = cos[:, None], sin[:, None]
    a, b = x[..., -rd::2].copy(), x[..., -rd + 1::2].copy()
    x[..., -rd::2] = a * cos - b * sin
    x[..., -rd + 1::2] = a * sin + b * cos
    return x


def compress(x, wkv, wgate, ape, norm_w, m, overlap, eps, freqs):
    """Compressed entries [n_windows, d] of x [T, D] for the complete windows of m tokens.
    overlap (CSA): projections are 2d wide; entry w pools window w−1's first half and window w's
    second half (2m slots, softmax per channel); else (HCA) window w alone."""
    n = x.shape[0] // m
    d = norm_w.shape[0]
    if n == 0:
        return np.zeros((0, d))
    c = (x[:n * m] @ wkv.T).reshape(n, m, -1)
    z = (x[:n * m] @ wgate.T).reshape(n, m, -1) + ape
    if overlap:
        cc = np.zeros((n, 2 * m, d))
        zz = np.full((n, 2 * m, d), -np.inf)
        cc[:, m:], zz[:, m:] = c[..., d:], z[..., d:]
        cc[1:, :m], zz[1:, :m] = c[:-1, :, :d], z[:-1, :, :d]
        c, z = cc, zz
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    entries = rms_norm((p * c).sum(axis=1), norm_w, eps)
    return rope(entries, np.arange(n) * m, freqs)


def attend(q, kv, visible, sinks, scale):
    """q [T,H,hd], kv [S,hd] (key = value), visible [T,S] bool, sinks [H] -> [T,H,hd]."""
    s = np.einsum("thd,sd->ths", q, kv) * scale
    s = np.where(visible[:, None, :], s, -np.inf)
    s = np.concatenate([s, np.broadcast_to(sinks[None, :, None], s.shape[:2] + (1,))], axis=-1)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("ths,sd->thd", p[..., :-1], kv)


def index_topk(scores, valid, k):
    """Visible mask [T, n]: per row the k highest-scoring valid entries (all valid ones if ≤ k)."""
    out = np.zeros(scores.shape, bool)
    for t in range(scores.shape[0]):
        idx = np.flatnonzero(valid[t])
        if len(idx) > k:
            idx = idx[np.argsort(-scores[t, idx], kind="stable")[:k]]
        out[t, idx] = True
    return out


def route(logits, scoring, bias, hash_ids, k, scale):
    """(expert ids [T,k], weights [T,k]): selection by score + bias (bias ranks only) or by the hash
    table; weights = picked scores / (their sum + 1e-20) · routed_scaling_factor."""
    sc = router_scores(logits, scoring)
    if hash_ids is None:
        ids = np.argsort(-(sc + bias), axis=-1, kind="stable")[:, :k]
    else:
        ids = np.asarray(hash_ids, np.int64)
    w = np.take_along_axis(sc, ids, axis=-1)
    return ids, w / (w.sum(axis=-1, keepdims=True) + 1e-20) * scale


def swiglu(gate, up, limit):
    """silu(min(gate, L)) · clamp(up, −L, L): DeepSeek-V4's clamped SwiGLU."""
    return silu(np.minimum(gate, limit)) * np.clip(up, -limit, limit)


class V4Reference:
    def __init__(self, cfg: V4Config, weights: dict):
        check_tensors(cfg, weights)
        self.cfg = cfg
        self.w = {k: np.asarray(v, np.float64) if not k.endswith("tid2eid") else np.asarray(v, np.int64)
                  for k, v in weights.items()}
        self.freqs = {"main": inv_freq(cfg, "main"), "compress": inv_freq(cfg, "compress")}

    def attention(self, i: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, w = self.cfg, self.w
        T, H, hd, eps = x.shape[0], cfg.num_attention_heads, cfg.head_dim, cfg.rms_norm_eps
        a = f"layers.{i}.attn."
        kind = cfg.layer_types[i]
        fr = self.freqs["main" if kind == SWA else "compress"]
        qr = rms_norm(x @ w[a + "wq_a.weight"].T, w[a + "q_norm.weight"], eps)
        q = rope(rms_norm((qr @ w[a + "wq_b.weight"].T).reshape(T, H, hd), None, eps), pos, fr)
        kv = rope(rms_norm(x @ w[a + "wkv.weight"].T, w[a + "kv_norm.weight"], eps), pos, fr)
        raw_vis = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - cfg.sliding_window)
        keys, vis = kv, raw_vis
        if kind != SWA:
            m = cfg.rate(i)
            comp = self.w_compress(a + "compressor.", x, m, kind == CSA, hd)
            valid = np.arange(len(comp))[None, :] < ((pos + 1) // m)[:, None]
            if kind == CSA:
                valid = index_topk(self.index_scores(a, x, qr, pos, m), valid, cfg.index_topk)
            keys, vis = np.concatenate([kv, comp]), np.concatenate([raw_vis, valid], axis=1)
        o = attend(q, keys, vis, w[a + "attn_sink"], hd ** -0.5)
        o = rope(o, pos, fr, sign=-1.0)                             # de-rotate (V carries RoPE)
        g = cfg.o_groups
        og = o.reshape(T, g, -1)
        wa = w[a + "wo_a.weight"].reshape(g, cfg.o_lora_rank, -1)
        y = np.einsum("tgk,grk->tgr", og, wa).reshape(T, -1)
        return y @ w[a + "wo_b.weight"].T

    def w_compress(self, p: str, x: np.ndarray, m: int, overlap: bool, d: int) -> np.ndarray:
        w = self.w
        return compress(x, w[p + "wkv.weight"], w[p + "wgate.weight"], w[p + "ape"], w[p + "norm.weight"], m,
                        overlap, self.cfg.rms_norm_eps, self.freqs["compress"])

    def index_scores(self, a: str, x: np.ndarray, qr: np.ndarray, pos: np.ndarray, m: int) -> np.ndarray:
        cfg, w = self.cfg, self.w
        nI, hI = cfg.index_n_heads, cfg.index_head_dim
        kI = self.w_compress(a + "indexer.compressor.", x, m, True, hI)
        qI = rope((qr @ w[a + "indexer.wq_b.weight"].T).reshape(-1, nI, hI), pos, self.freqs["compress"])
        wt = (x @ w[a + "indexer.weights_proj.weight"].T) * nI ** -0.5
        s = np.maximum(np.einsum("thd,sd->ths", qI, kI), 0.0) * hI ** -0.5
        return np.einsum("ths,th->ts", s, wt)

    def moe(self, i: int, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        cfg, w = self.cfg, self.w
        f = f"layers.{i}.ffn."
        F, L = cfg.moe_intermediate_size, cfg.swiglu_limit
        hash_ids = w[f + "gate.tid2eid"][ids] if cfg.mlp_layer_types[i] == "hash_moe" else None
        bias = w.get(f + "gate.bias", 0.0)
        eid, ew = route(x @ w[f + "gate.weight"].T, cfg.scoring_func, bias, hash_ids, cfg.num_experts_per_tok,
                        cfg.routed_scaling_factor)
        w13, w2 = w[f + "experts.w13"], w[f + "experts.w2"]
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            for e, wt in zip(eid[t], ew[t]):
                gu = w13[e] @ x[t]
                out[t] += wt * (w2[e] @ swiglu(gu[:F], gu[F:], L))
        s = f + "shared_experts."
        h = swiglu(x @ w[s + "w1.weight"].T, x @ w[s + "w3.weight"].T, L)
        return out + h @ w[s + "w2.weight"].T

    def site(self, X: np.ndarray, i: int, name: str, sublayer: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        cfg, w = self.cfg, self.w
        p = f"layers.{i}."
        u, post, comb = reference_site_pre(X, w[p + f"hc_{name}_fn"], w[p + f"hc_{name}_scale"],
                                           w[p + f"hc_{name}_base"], cfg.hc_eps, cfg.rms_norm_eps,
                                           cfg.hc_sinkhorn_iters)
        return reference_post(sublayer(rms_norm(u, w[p + f"{name}_norm.weight"], cfg.rms_norm_eps)), X, post, comb)

    def forward(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """logits [N, V] of tokens `ids` at positions 0..N−1."""
        cfg, w = self.cfg, self.w
        ids = np.asarray(ids, np.int64)
        if ids.ndim != 1 or not 1 <= len(ids) <= cfg.max_ctx:
            raise ValueError(f"ids must be 1-D with 1..{cfg.max_ctx} tokens, got shape {ids.shape}")
        pos = np.arange(len(ids))
        X = np.repeat(w["embed.weight"][ids][:, None, :], cfg.hc_mult, axis=1)
        for i in range(cfg.num_hidden_layers):
            X = self.site(X, i, "attn", lambda x: self.attention(i, x, pos))
            X = self.site(X, i, "ffn", lambda x: self.moe(i, x, ids))
        h = reference_head_pre(X, w["hc_head_fn"], w["hc_head_scale"], w["hc_head_base"], cfg.hc_eps, cfg.rms_norm_eps)
        return rms_norm(h, w["norm.weight"], cfg.rms_norm_eps) @ w["head.weight"].T
