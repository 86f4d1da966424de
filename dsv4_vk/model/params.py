"""DeepSeek-V4's device params from checkpoint weights (param_arrays) and their upload (upload_arrays):
the fused layouts the graphs read (the attention input's projections stacked into
`layers.{i}.attn.wx` / `wx.q`, routed and shared experts into `layers.{i}.ffn.w13` / `w2`, stacks
past one binding split into parts), the decode cache's tensors and the RoPE tables, and which CSA
layers need their indexer. model.build's docstring lists every param."""
from __future__ import annotations

import re
import numpy as np

from ..core.tuning import knob_table
from ..ops.rope import rope_table
from .checkpoint import quantisable
from .config import CSA, HCA, SWA, V4Config
from .reference import inv_freq
from .tensor_files import BF16, FILES, Lazy, QuantWeight, is_quant, join, stack_quant, stream_of


DTYPE_NAMES = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32", np.dtype(np.float16): "f16", BF16: "bf16"}
STEP_PARAMS = ("step.pos", "step.last", "step.token")

INDEXER = knob_table(
    "indexer",
    always=(False, "build the lightning indexer into every CSA layer and score with it at every position, even "
                   "where its top-k keeps every entry (tests and benches compare the graphs)"))


def indexer_runs(cfg: V4Config, i: int) -> bool:
    """Whether CSA layer i needs its lightning indexer. Its top-k keeps every visible entry when they
    are at most index_topk (transformers' selection, model.reference.index_topk), and at most
    max_ctx // rate entries ever close: where that is ≤ index_topk, attending over all of them —
    MQA_ATTENTION's HCA mode at the layer's rate — is the same attention, and the indexer's
    projections, compressor, scores and top-k are left out of the graphs (DeepSeek-V4-Flash: models
    of up to index_topk · 4 = 2048 tokens of context). Their weights are then not uploaded."""
    if cfg.layer_types[i] != CSA:
        return False
    return INDEXER["always"] or cfg.index_topk < max(cfg.max_ctx // cfg.rate(i), 1)


def all_entries_fit(cfg: V4Config, last_position: int) -> bool:
    """Whether, up to last_position, every CSA layer's top-k keeps every entry that has closed:
    (p + 1) // rate ≤ index_topk. A graph run only at such positions needs no indexer scores or
    top-k (its compressor still runs, so that its keys exist once they matter)."""
    return all((last_position + 1) // cfg.rate(i) <= cfg.index_topk
               for i, kind in enumerate(cfg.layer_types) if kind == CSA)


def _stack(parts):
    """Concatenate along rows (lazily for Lazy parts); mixed dtypes are widened to float32 (one
    weight, one dtype)."""
    dts = {np.dtype(p.dtype) for p in parts}
    if len(dts) > 1:
        parts = [np.asarray(p, np.float32) for p in parts]
    return join(parts, False)


def _quant_rows_stack(parts):
    """Quantised weights stacked along rows into one matrix with one grid (their grids stack only
    where every part's rows are whole blocks), or None."""
    if not all(is_quant(p) for p in parts) or len({(p.fmt, p.shape[-1]) for p in parts}) > 1 or \
            any(p.rows % p.format.block_rows or p.grid_rows != p.rows for p in parts):
        return None
    out = stack_quant([QuantWeight(p.fmt, p.codes, p.scale, 1) for p in parts], False)
    return QuantWeight(out.fmt, out.codes, out.scale, out.rows)


def x_groups(cfg: V4Config, i: int, indexer: bool, kinds) -> list:
    """[(param name, [(canonical weight name, rows)])]: the params the attention input's projections
    are read from, in x_projections' order within each. kinds(name): None for a float weight, else
    its QuantWeight (or True) — from the checkpoint's weights or the uploaded params."""
    a = f"layers.{i}.attn."
    proj = x_projections(cfg, i, indexer)
    quant = [(n, r) for n, r in proj if kinds(n) is not None]
    floats = [(n, r) for n, r in proj if kinds(n) is None]
    groups = [(a + "wx", floats)] if floats else []
    if kinds(a + "wx.q") is not None:
        groups.append((a + "wx.q", quant))
    else:
        groups += [(n, [(n, r)]) for n, r in quant]
    return groups


def moe_shared_apart(params: dict, i: int) -> bool:
    """Whether layer i's shared expert has params of its own (its format differs from the routed
    experts'), run by a second pair of MUL_MAT_IDs."""
    return f"layers.{i}.ffn.shared.w13" in params


def x_projections(cfg: V4Config, i: int, indexer: bool) -> list:
    """[(canonical weight name, rows)] stacked into layers.{i}.attn.wx, in order (the indexer's with
    `indexer`)."""
    a = f"layers.{i}.attn."
    out = [(a + "wq_a.weight", cfg.q_lora_rank), (a + "wkv.weight", cfg.head_dim)]
    kind = cfg.layer_types[i]
    if kind != SWA:
        W = cfg.head_dim * (2 if kind == CSA else 1)
        out += [(a + "compressor.wkv.weight", W), (a + "compressor.wgate.weight", W)]
    if indexer:
        WI = 2 * cfg.index_head_dim
        out += [(a + "indexer.compressor.wkv.weight", WI), (a + "indexer.compressor.wgate.weight", WI),
                (a + "indexer.weights_proj.weight", cfg.index_n_heads)]
    return out


def cache_rows(cfg: V4Config, chunk: int) -> dict:
    """Rows of the decode cache's rings for prefill chunks of `chunk` tokens: a chunk reads back at
    most W − 1 raw rows before its first token (2·rate − 1 projection rows for a CSA window, rate − 1
    for HCA) and writes `chunk` rows, so that many rows never overwrite a row still to be read."""
    out = {"kv": min(cfg.max_ctx, cfg.sliding_window + chunk - 1)}
    for kind, mult in ((CSA, 2), (HCA, 1)):
        out[kind] = mult * cfg.compress_rates[kind] + chunk - 1
    return out


def cache_shapes(cfg: V4Config, chunk: int = 16) -> dict:
    """{param name: (shape, dtype)} of the decode cache, the RoPE tables and the per-step values
    param_arrays uploads beside the weights (the layout in this module's docstring): what max_ctx
    costs, known before anything is allocated. The compressed entries and the RoPE tables grow with
    max_ctx (max_ctx // rate rows; max_ctx rows), the rings with the window and the chunk."""
    rows = cache_rows(cfg, chunk)
    C, f32 = cfg.max_ctx, np.dtype(np.float32)
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for i in range(cfg.num_hidden_layers):
        out[f"layers.{i}.kv"] = ((rows["kv"], cfg.head_dim), f32)
        kind = cfg.layer_types[i]
        if kind != SWA:
            m, W = cfg.rate(i), cfg.head_dim * (2 if kind == CSA else 1)
            out[f"layers.{i}.cmp.state"] = ((rows[kind], 2 * W), f32)
            out[f"layers.{i}.cmp.ent"] = ((max(C // m, 1), cfg.head_dim), f32)
        if indexer_runs(cfg, i):
            out[f"layers.{i}.idx.state"] = ((rows[CSA], 4 * cfg.index_head_dim), f32)
            out[f"layers.{i}.idx.ent"] = ((max(C // cfg.rate(i), 1), cfg.index_head_dim), f32)
    half = cfg.rope_dim // 2
    for kind in ("main", "compress"):
        out[f"rope.{kind}.cos"] = out[f"rope.{kind}.sin"] = ((C, half), f32)
    for name in STEP_PARAMS:
        out[name] = ((1,), np.dtype(np.int32))
    out["sampler.cfg"] = ((2,), f32)
    out["sampler.state"] = ((2,), np.dtype(np.int32))
    return out


BINDING_MARGIN = 1 << 16          # bytes a param's buffer holds beyond its data (guards, padding)


def _param_bytes(a) -> int:
    """Bytes of a param's largest device tensor (a QuantWeight's codes)."""
    if is_quant(a):
        return int(np.prod(a.shape[:-1])) * a.format.words(a.shape[-1]) * 4
    return a.nbytes


def _expert_slice(a, lo, hi):
    """Experts lo..hi-1 of a stack (array, Lazy or QuantWeight), without reading a Lazy one."""
    if is_quant(a):
        return QuantWeight(a.fmt, _expert_slice(a.codes, lo, hi), _expert_slice(a.scale, lo, hi), a.grid_rows)
    if isinstance(a, Lazy):
        return a.rows(lo, hi)
    return a[lo:hi]


def split_experts(out: dict, name: str, max_binding: int) -> None:
    """Replace the expert stack out[name] by parts `name.0`, `name.1`, ... along the experts, each
    within max_binding bytes, where it is larger (the kernels bind one part at a time)."""
    a = out[name]
    E, budget = a.shape[0], max_binding - BINDING_MARGIN
    per = _param_bytes(a) // E
    if per * E <= budget:
        return
    if per > budget:
        raise ValueError(f"{name}: one expert takes {per} bytes, past this device's maxStorageBufferRange "
                         f"({max_binding} bytes)")
    n = budget // per
    del out[name]
    for j, lo in enumerate(range(0, E, n)):
        out[f"{name}.{j}"] = _expert_slice(a, lo, min(lo + n, E))


def param_arrays(cfg: V4Config, weights: dict, chunk: int = 16, max_binding: int | None = None) -> dict:
    """{param name: array} to upload for `cfg` from canonical `weights` (fused layouts built here);
    chunk: the prefill chunk the decode cache's rings are sized for; max_binding: the device's
    maxStorageBufferRange (expert stacks past it are split)."""
    fused: set[str] = set()
    out: dict[str, np.ndarray | QuantWeight] = {name: np.zeros(shape, dt)
                                                for name, (shape, dt) in cache_shapes(cfg, chunk).items()}
    C = cfg.max_ctx
    for i in range(cfg.num_hidden_layers):
        a, f = f"layers.{i}.attn.", f"layers.{i}.ffn."
        proj = x_projections(cfg, i, indexer_runs(cfg, i))
        quant = [n for n, _ in proj if is_quant(weights[n])]
        floats = [weights[n] for n, _ in proj if n not in quant]
        if floats:
            out[a + "wx"] = _stack(floats)
        fused.update(n for n, _ in proj if n not in quant)
        if quant and quant == [n for n, _ in proj if quantisable(n)]:
            stacked = _quant_rows_stack([weights[n] for n in quant])
            if stacked is not None:
                out[a + "wx.q"] = stacked
                fused.update(quant)
        s = f + "shared_experts."
        routed13, routed2 = weights[f + "experts.w13"], weights[f + "experts.w2"]
        sh13 = [weights[s + "w1.weight"], weights[s + "w3.weight"]]
        sh2 = weights[s + "w2.weight"]
        if any(is_quant(t) for t in (routed13, routed2, sh2, *sh13)):
            shared13, shared2 = _shared_quant(sh13, sh2, cfg)
            if _same_layout(routed13, shared13) and _same_layout(routed2, shared2):
                # E routed experts, then the shared one: stacks joined along their expert axis
                out[f + "w13"] = stack_quant([routed13, shared13], False) if is_quant(routed13) else \
                    _stack([routed13, shared13])
                out[f + "w2"] = stack_quant([routed2, shared2], False) if is_quant(routed2) else \
                    _stack([routed2, shared2])
            else:
                out[f + "w13"], out[f + "w2"] = routed13, routed2
                out[f + "shared.w13"], out[f + "shared.w2"] = shared13, shared2
        else:
            shared13 = join([join(sh13, False)], True)
            out[f + "w13"] = _stack([routed13, shared13])
            out[f + "w2"] = _stack([routed2, join([sh2], True)])
        fused.update([f + "experts.w13", f + "experts.w2", s + "w1.weight", s + "w3.weight", s + "w2.weight"])
        if cfg.layer_types[i] == CSA and not indexer_runs(cfg, i):      # the graphs read none of its weights
            fused.update(n for n in weights if n.startswith(a + "indexer."))
    for name, arr in weights.items():
        if name not in fused:
            out[name] = arr
    if max_binding:
        for name in [n for n in out if n.endswith(("ffn.w13", "ffn.w2"))]:
            split_experts(out, name, max_binding)
    for kind in ("main", "compress"):
        cos, sin = rope_table(inv_freq(cfg, kind), C)
        out[f"rope.{kind}.cos"], out[f"rope.{kind}.sin"] = cos.astype(np.float32), sin.astype(np.float32)
    if any(moe_shared_apart(out, i) for i in range(cfg.num_hidden_layers)):
        out["moe.shared_route"] = np.tile(np.array([[[0.0, 1.0]]], np.float32), (chunk, 1, 1))
    out["sampler.cfg"] = np.array([0.0, 1.0], np.float32)
    return out


def expert_stack_bytes(cfg: V4Config, weights: dict) -> list[int]:
    """Per layer, the bytes of its routed-expert stacks as param_arrays uploads them (layers.{i}.ffn.w13
    and w2 with their scales, the shared expert's tensors where they join them), from the canonical
    weights (anything with .nbytes: nothing is read or joined; quantised codes as published, which
    the device keeps within a few bytes a row)."""
    out = []
    for i in range(cfg.num_hidden_layers):
        f = f"layers.{i}.ffn."
        s = f + "shared_experts."
        r13, r2 = weights[f + "experts.w13"], weights[f + "experts.w2"]
        sh13, sh2 = [weights[s + "w1.weight"], weights[s + "w3.weight"]], weights[s + "w2.weight"]
        joined = True
        if any(is_quant(t) for t in (r13, r2, sh2, *sh13)):
            shared13, shared2 = _shared_quant(sh13, sh2, cfg)
            joined = _same_layout(r13, shared13) and _same_layout(r2, shared2)
        out.append(int(r13.nbytes + r2.nbytes + (sum(int(t.nbytes) for t in (*sh13, sh2)) if joined else 0)))
    return out


_EXPERT_PARAM = re.compile(r"layers\.(\d+)\.ffn\.(w13|w2)(\.\d+)?(\.scale)?")


def routed_expert_layer(name: str) -> int | None:
    """The layer whose routed-expert stacks the device param `name` belongs to (layers.{i}.ffn.w13 /
    w2, their parts past one binding and their scales), else None (the shared expert's own params
    `ffn.shared.*` included)."""
    m = _EXPERT_PARAM.fullmatch(name)
    return int(m[1]) if m else None


def _shared_quant(sh13, sh2, cfg):
    """The shared expert as one-expert stacks [1, 2F, D] and [1, D, F] (gate and up rows keep a
    grid each); float parts as float arrays."""
    if all(is_quant(t) for t in sh13):
        w13 = stack_quant([stack_quant(sh13, False)], True)
    else:
        w13 = _stack([np.asarray(t, np.float32) if is_quant(t) else t for t in sh13])[None]
    w2 = stack_quant([sh2], True) if is_quant(sh2) else join([sh2], True)
    return w13, w2


def _same_layout(a, b) -> bool:
    """Whether two expert stacks can be one stack: both float, or one format with equal grids."""
    if is_quant(a) != is_quant(b):
        return False
    return not is_quant(a) or (a.fmt == b.fmt and a.grid_rows == b.grid_rows and a.shape[1:] == b.shape[1:])


def upload_arrays(params: dict, progress=None):
    """(device param name, array or Stream, storage) of every param, one at a time: a lazy one as a
    Stream of its bytes (model.checkpoint: read from the files as it is uploaded, never whole on the
    host), where its layout allows, else read now; a QuantWeight is its packed codes (storage "fp8" /
    "fp4") and its scale bytes `name.scale` ("e8m0"); others their own dtype. progress(done bytes,
    total bytes) after each."""
    total = sum(a.nbytes for a in params.values())
    done = 0
    try:
        for name, a in params.items():
            if is_quant(a):
                words, scale = a.streams() or a.device_arrays()
                yield name, words, a.fmt
                yield name + ".scale", scale, "e8m0"
            else:
                arr = stream_of(a) or np.asarray(a)
                yield name, arr, DTYPE_NAMES[np.dtype(arr.dtype)]
            done += a.nbytes
            if progress is not None:
                progress(done, total)
    finally:
        FILES.close()                       # the checkpoint's cached headers
