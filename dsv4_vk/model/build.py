"""DeepSeek-V4 as device graphs: one prefill graph per chunk length and one decode graph (T = 1),
sharing every weight, decode-cache tensor and per-step value as executor params.

Params (Graph.param names; docs/model.md lists them):
- checkpoint tensors under their canonical names (model.checkpoint), plus fused layouts model.params builds:
  `layers.{i}.attn.wx` — every projection of the attention input stacked into one weight
  (wq_a | wkv | compressor wkv | compressor wgate | indexer compressor wkv | wgate | weights_proj),
  `layers.{i}.ffn.w13` [E+1, 2F, D] / `layers.{i}.ffn.w2` [E+1, D, F] (routed experts, then the
  shared expert as expert E);
- quantised checkpoints (docs/quantized_weights.md): a QuantWeight param `name` is uploaded as its
  packed codes `name` (i32 words) and scale bytes `name.scale`; wx then stacks the BF16
  projections, `layers.{i}.attn.wx.q` the FP8 ones (wq_a | wkv) where their grids stack (rows
  multiples of 128; else each keeps its own name), and where the routed experts' format differs
  from the shared expert's, `layers.{i}.ffn.w13` / `w2` hold the routed experts only and
  `layers.{i}.ffn.shared.w13` [1, 2F, D] / `shared.w2` [1, D, F] the shared one, run with the
  route `moe.shared_route` ([chunk, 1, 2] of (0, 1));
- an expert stack larger than the device's maxStorageBufferRange: parts `layers.{i}.ffn.w13.0`,
  `.1`, ... along the experts (each bound alone; MUL_MAT_ID's id_base / n_ids);
- the decode cache, per layer: `layers.{i}.kv` [W + chunk − 1, hd] (a ring of the last raw K = V
  rows, RoPE applied), `layers.{i}.cmp.state` [2m + chunk − 1 (CSA) or m + chunk − 1, 2W] (a ring
  of the compressor's projections c | z: the open window and CSA's overlap rows),
  `layers.{i}.cmp.ent` [max_ctx/m, hd] (compressed entries), and for CSA the indexer's
  `layers.{i}.idx.state` / `layers.{i}.idx.ent` (cache_rows) where the indexer runs (indexer_runs);
- RoPE tables `rope.{main,compress}.{cos,sin}` [max_ctx, rd/2];
- per step: `step.pos`, `step.last`, `step.token` (i32 [1]), `sampler.cfg`, `sampler.state`.
Every cache write happens on the device inside the recorded command buffer (kv's RMS_NORM into
its ring, COMPRESS into the state and entries), so a decode step is one replay.
"""
from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

import numpy as np

from ..core.tuning import knob_table
from .. import hc
from ..core.graph import Graph, GraphTensor
from ..ops.compress import topk
from ..ops.sample import sample
from ..ops.v4_gate import gate_kernel, layout_refusal
from ..ops.v4_attention import MQA_MERGE, mqa_decode_splits
from .config import CSA, SWA, V4Config
from .checkpoint import quantisable
from .params import DTYPE_NAMES, moe_shared_apart, x_groups
from .tensor_files import is_quant

def decode_splits(cfg: V4Config, i: int, device) -> int:
    """MQA splits of layer i at decode: one tiled workgroup's tile of its longest key list each
    (ops.v4_attention.mqa_decode_splits)."""
    kind = cfg.layer_types[i]
    n = cfg.sliding_window
    if kind == CSA:
        n += min(cfg.index_topk, cfg.max_ctx // cfg.rate(i))
    elif kind != SWA:
        n += cfg.max_ctx // cfg.rate(i)
    return mqa_decode_splits(device, cfg.head_dim, n)




# Which mat-muls normalise a Normed x themselves at decode: those reading at most max_bytes of
# weights a token (None: every one, as measured on the H200 in results/h200/model_bench_v4.txt).
# A folded mat-mul re-reads x and the norm weights for every weight step (1.5x the GPU time of the
# plain GEMV in isolation), an unfolded one costs an RMS_NORM dispatch. Measured in the model on the
# H200 (tools/model_gpu_bench.py --variants "fold_mb=64"): folding only up to 64 MiB of weights was
# 0.992x the speed of folding everywhere (None), the default.
NORM_FOLD = knob_table(
    "norm_fold", max_bytes=(None, "fold the norm into mat-muls reading at most this many weight bytes a token "
                                  "(None: every one)"))
SHARED = knob_table(
    "shared",
    fused=(True, "MUL_MAT_ID reads an FP8 shared expert beside FP4 routed experts in one dispatch (the published "
                 "layout: two dispatches a layer instead of four); off: each in its own"))


class Normed(NamedTuple):
    """RMS_NORM(x, g, eps) not yet computed: the mat-muls that read it normalise x's rows as they
    load them (MUL_MAT / MUL_MAT_ID with a norm weight), one dispatch fewer per norm at decode."""
    x: GraphTensor
    g: GraphTensor
    eps: float


class ModelGraph:
    """Builds one forward graph of T tokens; `params` are the uploaded arrays (names, shapes, dtypes).
    splits: MQA key-list splits per layer (None: decode_splits at T = 1, else 1). At T = 1 the RMS
    norms whose only readers are mat-muls are folded into them (Normed). dense: the graph only runs
    where all_entries_fit, so CSA layers attend every closed entry and skip the indexer's scoring."""

    def __init__(self, cfg: V4Config, params: dict, T: int, *, prefill: bool, fused, device, splits=None,
                 dense: bool = False, all_logits: bool = True):
        self.cfg, self.params, self.fused, self.device = cfg, params, fused, device
        self.splits, self.dense = splits, dense
        self.fold_norms = T == 1
        self._norms: dict[tuple[int, int], tuple[Normed, GraphTensor]] = {}
        self.g = g = Graph()
        self.ids = g.input("ids", (T,), "i32") if prefill else self.param("step.token")
        self.pos = self.param("step.pos")
        h = self.forward(self.ids, T)                                                  # [T, D], normed
        if prefill and not all_logits:
            # only the last token's logits: the head (vocab × D, the chunk's largest mat-mul) on one row
            h = g.op("GET_ROWS", self.normed(h), self.param("step.last"))
        logits = self.linear(h, "head.weight")                                         # [T or 1, V]
        g.output("logits", logits)
        last = g.op("GET_ROWS", logits, self.param("step.last")) if prefill and all_logits else logits
        sample(g, last, self.param("sampler.cfg"), self.param("sampler.state"), out=self.param("step.token"))

    def indexer_runs(self, i: int) -> bool:
        """Whether layer i's indexer was built into the params (param_arrays: indexer_runs), so that
        the graphs always agree with the uploaded layout."""
        return f"layers.{i}.idx.state" in self.params

    def param(self, name):
        a = self.params[name]
        if is_quant(a):
            return self.g.param(name, a.shape[:-1] + (a.format.words(a.shape[-1]),), "i32")
        return self.g.param(name, a.shape, DTYPE_NAMES[np.dtype(a.dtype)])

    def weight(self, name):
        """(weight tensor, extra inputs, op params) of a mat-mul weight: a quantised one adds its
        scale bytes (the last input) and wq= / grid_rows=."""
        a, w = self.params[name], self.param(name)
        if not is_quant(a):
            return w, [], {}
        scale = self.g.param(name + ".scale", (-(-a.scale.size // 4),), "i32")
        return w, [scale], {"wq": a.fmt, "grid_rows": a.grid_rows}

    def kinds(self, name):
        """A projection's QuantWeight (True inside layers.{i}.attn.wx.q), or None when it is float."""
        if name in self.params:
            return self.params[name] if is_quant(self.params[name]) else None
        i = name.split(".")[1]
        return True if f"layers.{i}.attn.wx.q" in self.params and quantisable(name) else None

    def norm(self, x: GraphTensor, weight: str) -> GraphTensor | Normed:
        """RMS_NORM of x's rows with the named weight; left to the reading mat-muls at T = 1."""
        g, eps = self.param(weight), self.cfg.rms_norm_eps
        return Normed(x, g, eps) if self.fold_norms else self.g.op("RMS_NORM", x, g, eps=eps)

    def folds(self, x: GraphTensor | Normed, read_bytes: int) -> TypeGuard[Normed]:
        """Whether a mat-mul reading read_bytes of weights normalises the Normed x itself."""
        limit = NORM_FOLD["max_bytes"]
        return isinstance(x, Normed) and (limit is None or read_bytes <= limit)

    def normed(self, x: GraphTensor | Normed) -> GraphTensor:
        """x's rows normalised by one RMS_NORM (once per Normed, shared by its unfolded readers)."""
        if not isinstance(x, Normed):
            return x
        key = (id(x.x), id(x.g))
        if key not in self._norms:
            self._norms[key] = (x, self.g.op("RMS_NORM", x.x, x.g, eps=x.eps))
        return self._norms[key][1]

    def linear(self, x: GraphTensor | Normed, weight: str) -> GraphTensor:
        """x @ wᵀ with the named weight (x normalised in the same dispatch when it is Normed and the
        weight within NORM_FOLD)."""
        w, extra, qp = self.weight(weight)
        if self.folds(x, self.params[weight].nbytes):
            return self.g.op("MUL_MAT", x.x, w, x.g, *extra, rms_eps=x.eps, **qp)
        return self.g.op("MUL_MAT", self.normed(x), w, *extra, **qp)

    def forward(self, ids, T) -> GraphTensor | Normed:
        cfg, g = self.cfg, self.g
        D = cfg.hidden_size
        emb = g.op("GET_ROWS", self.param("embed.weight"), ids)                       # [T, D]
        # the 4 streams start equal: a stride-0 view of the embedding (the HC kernels read strided
        # X; the first post writes the first materialised X), not a copy
        X = emb.reshape(T, 1, D).broadcast_to((T, cfg.hc_mult, D))
        # Each site's post also starts the next site's mixes where the site kernels run (decode),
        # so it is given the next site's fn (the head's after the last layer); `carry` holds them.
        sites = [(i, name, sub) for i in range(cfg.num_hidden_layers)
                 for name, sub in (("attn", self.attention), ("ffn", self.moe))]
        fns = [f"layers.{i}.hc_{name}_fn" for i, name, _ in sites] + ["hc_head_fn"]
        carry = None
        for k, (i, name, sublayer) in enumerate(sites):
            with g.scope(f"layers.{i}.{name}"):         # names the site in Model.paths()
                X, carry = self.site(X, i, name, sublayer, carry, self.param(fns[k + 1]))
        with g.scope("head"):
            h = hc.head_pre(g, X, self.param("hc_head_fn"), self.param("hc_head_scale"), self.param("hc_head_base"),
                            hc_eps=cfg.hc_eps, norm_eps=cfg.rms_norm_eps, fused=self.fused, device=self.device,
                            mix=carry)
        return self.norm(h, "norm.weight")                                # [T, D], before the head

    def site(self, X, i, name, sublayer, carry, next_fn):
        """X_new = post(sublayer(rmsnorm_w(u)), X) around site_pre(X) (hc.site: at decode two
        dispatches plus the sublayer); returns (X_new, the next site's carried mixes or None)."""
        cfg, g = self.cfg, self.g
        p = f"layers.{i}."
        return hc.site(g, X, self.param(p + f"hc_{name}_fn"), self.param(p + f"hc_{name}_scale"),
                       self.param(p + f"hc_{name}_base"),
                       lambda u: sublayer(i, self.norm(u, p + f"{name}_norm.weight")),
                       mix=carry, next_fn=next_fn, hc_eps=cfg.hc_eps, norm_eps=cfg.rms_norm_eps,
                       n_iter=cfg.hc_sinkhorn_iters, fused=self.fused, device=self.device)

    def _compress(self, prefix, xs, i, overlap, T):
        """The projections xs [T, 2W] into the state rows at step.pos, then the closed windows' entries."""
        g, cfg = self.g, self.cfg
        a = f"layers.{i}.attn." + ("indexer.compressor." if prefix == "idx" else "compressor.")
        ent = self.param(f"layers.{i}.{prefix}.ent")                # xs stored into the state there too
        return g.op("COMPRESS", ent, self.param(f"layers.{i}.{prefix}.state"), self.param(a + "ape"),
                    self.param(a + "norm.weight"), self.pos, self.param("rope.compress.cos"),
                    self.param("rope.compress.sin"), xs, rate=cfg.rate(i), overlap=overlap, eps=cfg.rms_norm_eps,
                    tokens=T, out=ent)

    def attention(self, i, x):
        cfg, g = self.cfg, self.g
        T, H, hd, eps = self.ids.shape[0], cfg.num_attention_heads, cfg.head_dim, cfg.rms_norm_eps
        a = f"layers.{i}.attn."
        kind = cfg.layer_types[i]
        rk = "main" if kind == SWA else "compress"
        cos, sin = self.param(f"rope.{rk}.cos"), self.param(f"rope.{rk}.sin")
        indexer = self.indexer_runs(i)
        sparse = indexer and not self.dense                 # else every closed entry is attended
        cols, base = {}, {}                 # every x projection: one mat-mul a group of them
        for param, parts in x_groups(cfg, i, indexer, self.kinds):
            xw, at = self.linear(x, param), 0
            for name, n in parts:
                cols[name[len(a):]], base[name[len(a):]] = xw[:, at:at + n], xw
                at += n
        qr = self.norm(cols["wq_a.weight"], a + "q_norm.weight")     # read by wq_b (and the indexer's)

        q = self.linear(qr, a + "wq_b.weight").reshape(T, H, hd)    # its per-head norm and RoPE: in MQA
        cache = self.param(f"layers.{i}.kv")                              # kv's norm and RoPE, stored
        cache = g.op("RMS_NORM", cols["wkv.weight"], self.param(a + "kv_norm.weight"), self.pos, cos, sin, cache,
                     eps=eps, rope=True, ring=True, capacity=cfg.max_ctx, out=cache)
        extra, prm = [], {}
        if kind != SWA:
            m = cfg.rate(i)
            W = cfg.head_dim * (2 if kind == CSA else 1)
            xs = self._cat(base["compressor.wkv.weight"], cols["compressor.wkv.weight"], 2 * W)
            extra.append(self._compress("cmp", xs, i, kind == CSA, T))
            prm = {"mode": "csa" if sparse else "hca", "rate": m}             # hca: every entry
        if sparse:
            extra.append(self.indexer(i, x, base["indexer.compressor.wkv.weight"], cols, qr, T))
        elif indexer:                       # its keys kept up to date for the positions where it scores
            self._index_keys(i, base["indexer.compressor.wkv.weight"], cols, T)
        S = self.splits[i] if self.splits is not None else (decode_splits(cfg, i, self.device) if T == 1 else 1)
        if S > 1 and MQA_MERGE["on"]:  # the parts merged in the same dispatch (V's RoPE removed there)
            prm |= {"merge": True, "inverse_rope": True}
        o = g.op("MQA_ATTENTION", q, cache, self.pos, self.param(a + "attn_sink"), *extra, cos, sin, scale=hd ** -0.5,
                 window=cfg.sliding_window, splits=S, capacity=cfg.max_ctx, q_norm_eps=eps, **prm)
        if S > 1 and not MQA_MERGE["on"]:   # V carries RoPE: removed as the parts are merged, or after
            o = g.op("MQA_COMBINE", o, self.param(a + "attn_sink"), self.pos, cos, sin, splits=S, rope=True)
        elif S == 1:
            o = g.op("ROPE", o, self.pos, cos, sin, inverse=True)
        G, r = cfg.o_groups, cfg.o_lora_rank
        og = o.reshape(T, G, H * hd // G).permute(1, 0, 2)                            # [G, T, k]
        wo_a, extra, qp = self.weight(a + "wo_a.weight")
        y = g.op("MUL_MAT", og, wo_a.reshape(G, r, wo_a.shape[-1]), *extra, **qp)       # [G, T, r]
        y = y.permute(1, 0, 2)                                                        # [T, G, r]
        y = (y if y.is_contiguous else g.op("CONT", y)).reshape(T, G * r)             # one token: already is
        return self.linear(y, a + "wo_b.weight")

    @staticmethod
    def _cat(xw, first, width):
        """The view of xw's columns starting at `first`'s, `width` wide (adjacent projections)."""
        return xw[:, first.offset - xw.offset:first.offset - xw.offset + width]

    def _index_keys(self, i, xw, cols, T):
        """The indexer's compressed keys (its state and entries written in place)."""
        width = 4 * self.cfg.index_head_dim
        return self._compress("idx", self._cat(xw, cols["indexer.compressor.wkv.weight"], width), i, True, T)

    def indexer(self, i, x, xw, cols, qr, T):
        """The lightning indexer: its compressed keys, scores of this chunk's queries, the top-k."""
        cfg, g = self.cfg, self.g
        a = f"layers.{i}.attn.indexer."
        nI, hI, m = cfg.index_n_heads, cfg.index_head_dim, cfg.rate(i)
        keys = self._index_keys(i, xw, cols, T)
        qI = self.linear(qr, a + "wq_b.weight").reshape(T, nI, hI)
        qI = g.op("ROPE", qI, self.pos, self.param("rope.compress.cos"), self.param("rope.compress.sin"))
        s = g.op("INDEX_SCORE", qI, cols["indexer.weights_proj.weight"], keys, self.pos, rate=m,
                 scale=hI ** -0.5 * nI ** -0.5, capacity=cfg.max_ctx)
        # each row ranks only its closed windows' scores: the cost follows the position, not max_ctx;
        # attention reads the selected set, so it comes in entry order (no rank count)
        return topk(g, s, min(cfg.index_topk, keys.shape[0]), pos=self.pos, rate=m, capacity=cfg.max_ctx,
                    sorted=False)

    def moe(self, i, x):
        """The router (V4_GATE, or MUL_MAT then V4_ROUTE) → the chosen experts' clamped SwiGLU →
        weighted sum."""
        cfg = self.cfg
        T, D = (x.x if isinstance(x, Normed) else x).shape
        f = f"layers.{i}.ffn."
        route = self.router(i, x)
        per_expert = self.stack_bytes(f + "w13") // self.stack_experts(f + "w13")
        if not moe_shared_apart(self.params, i):
            fold = self.folds(x, per_expert * (cfg.num_experts_per_tok + 1))   # the experts read
            h = self._swiglu(x, f + "w13", route, fold)                          # [T, k+1, F]
            return self._expert_sum(h, f + "w2", route)                          # [T, D]
        if self.shared_in_dispatch(f):      # FP4 routed experts and the FP8 shared one, read together
            fold = self.folds(x, per_expert * cfg.num_experts_per_tok + self.params[f + "shared.w13"].nbytes)
            h = self._swiglu(x, f + "w13", route, fold, shared=f + "shared.w13")
            return self._expert_sum(h, f + "w2", route, shared=f + "shared.w2")
        # the shared expert in another format: routed experts (routes 0..k-1), then the shared one
        k = cfg.num_experts_per_tok
        shared = self.param("moe.shared_route")[:T]
        fold = self.folds(x, per_expert * k + self.params[f + "shared.w13"].nbytes)
        h = self._swiglu(x, f + "w13", route[:, :k], fold)
        hs = self._swiglu(x, f + "shared.w13", shared, fold)
        return self._expert_sum(hs, f + "shared.w2", shared, self._expert_sum(h, f + "w2", route[:, :k]))

    def router(self, i: int, x: GraphTensor | Normed) -> GraphTensor:
        """Layer i's routes [T, k+1, 2] (score + bias, or the hash table by token id; the shared expert
        appended): V4_GATE, the gate's logits and the selection in one dispatch, where gate_kernel
        allows (one token); else the gate's MUL_MAT then V4_ROUTE."""
        cfg, g = self.cfg, self.g
        f = f"layers.{i}.ffn."
        hashed = cfg.mlp_layer_types[i] == "hash_moe"
        sel = [self.param(f + "gate.tid2eid"), self.ids] if hashed else [self.param(f + "gate.bias")]
        prm: dict[str, Any] = {"top_k": cfg.num_experts_per_tok, "scoring": cfg.scoring_func,
                               "route_scale": float(cfg.routed_scaling_factor)}
        name = f + "gate.weight"
        if not is_quant(self.params[name]):
            w = self.param(name)
            eps: dict[str, Any] = {}
            if self.folds(x, self.params[name].nbytes):        # the norm folded in, as MUL_MAT would
                src, norm, eps = x.x, [x.g], {"rms_eps": x.eps}
            else:
                src, norm = self.normed(x), []
            T, D = src.shape
            layout = layout_refusal(D, src.offset, w.offset, w.strides[0], norm[0].offset if norm else None)
            if gate_kernel(self.device, T, w.shape[0], hashed, layout).kernel == "fused":
                return g.op("V4_GATE", src, w, *norm, *sel, **prm, **eps)
        return g.op("V4_ROUTE", self.linear(x, name), *sel, **prm)

    def shared_in_dispatch(self, f) -> bool:
        """Whether MUL_MAT_ID reads layer f's FP8 shared expert beside its FP4 routed experts in one
        dispatch (shared_wq; SHARED["fused"], on by default)."""
        r: Any = self.params.get(f + "w13")            # (arrays or QuantWeights: is_quant tells)
        sh: Any = self.params.get(f + "shared.w13")
        return SHARED["fused"] and is_quant(r) and is_quant(sh) and r.fmt == "fp4" and sh.fmt == "fp8" and \
            is_quant(self.params.get(f + "w2")) and self.params[f + "w2"].fmt == "fp4" and \
            self.params[f + "shared.w2"].fmt == "fp8"

    def _shared(self, name):
        """(extra inputs, op params) that add the FP8 shared expert `name` to a MUL_MAT_ID."""
        if name is None:
            return [], {}
        w, (scale,), qp = self.weight(name)
        return [w, scale], {"shared_wq": qp["wq"], "shared_grid_rows": qp["grid_rows"]}

    def expert_parts(self, name):
        """[(param, id_base)] of an expert stack: itself, or the parts param_arrays split it into
        (`name.0`, `name.1`, ...: each within one storage-buffer binding)."""
        if name in self.params:
            return [(name, 0)]
        out, base = [], 0
        while f"{name}.{len(out)}" in self.params:
            out.append((f"{name}.{len(out)}", base))
            base += self.params[out[-1][0]].shape[0]
        return out

    def stack_experts(self, name) -> int:
        return sum(self.params[p].shape[0] for p, _ in self.expert_parts(name))

    def stack_bytes(self, name) -> int:
        return sum(self.params[p].nbytes for p, _ in self.expert_parts(name))

    def _swiglu(self, x, weight, route, fold, shared=None):
        """The chosen experts' clamped SwiGLU [T, routes, F] (the FFN norm as they read x with fold);
        over a split stack, each part's (0 for the others' routes) added; `shared`: the shared
        expert's FP8 param read in the same dispatch."""
        T, D = (x.x if isinstance(x, Normed) else x).shape
        lim = float(self.cfg.swiglu_limit)
        n_ids, out = self.stack_experts(weight), None
        for part, base in self.expert_parts(weight):
            w, extra, qp = self.weight(part)
            more, sp = self._shared(shared)
            extra, qp = extra + more, dict(qp, **sp)
            ids = {"id_base": base, "n_ids": n_ids} if base or n_ids != w.shape[0] else {}
            if fold:
                h = self.g.op("MUL_MAT_ID", x.x.reshape(T, 1, D), w, route, x.g, *extra, mode="swiglu", limit=lim,
                              rms_eps=x.eps, **qp, **ids)
            else:
                h = self.g.op("MUL_MAT_ID", self.normed(x).reshape(T, 1, D), w, route, *extra, mode="swiglu",
                              limit=lim, **qp, **ids)
            out = h if out is None else self.g.op("ADD", out, h)
        return out

    def _expert_sum(self, h, weight, route, add=None, shared=None):
        """Σ_r weight_r · w[id_r] h_r (+ add) [T, D]; over a split stack, the parts chained by add."""
        n_ids = self.stack_experts(weight)
        for part, base in self.expert_parts(weight):
            w, extra, qp = self.weight(part)
            more, sp = self._shared(shared)
            extra, qp = extra + more, dict(qp, **sp)
            ids = {"id_base": base, "n_ids": n_ids} if base or n_ids != w.shape[0] else {}
            add = self.g.op("MUL_MAT_ID", h, w, route, *([add] if add is not None else []), *extra, mode="sum",
                            **qp, **ids)
        return add
