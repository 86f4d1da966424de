"""DeepSeek-V4 configuration, read from a Hugging Face `config.json` (transformers'
`DeepseekV4Config`, model_type "deepseek_v4").

Field names are config.json's own, so the mapping is one-to-one. `from_hf` applies the same
legacy folding transformers does (`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
flat `rope_scaling` / `rope_parameters`) and refuses, naming the key and what is supported, any
value this backend does not run (another scoring function, a RoPE type other than default/YaRN,
hc_mult ≠ 4, an odd rope dim...). Keys that change nothing in inference (dropout, aux-loss
coefficients, `n_shared_experts`, `norm_topk_prob`: V4 always has one shared expert and always
normalises) are accepted and ignored. `max_ctx` is ours: the decode cache capacity in tokens.
The model's sizes (SIZE_KEYS, and INDEXER_KEYS where a layer is CSA) must be given: a missing one
is a ConfigError naming it, never a default. Every value error is a ConfigError naming its key,
including the bounds the kernels need (eps values within float32, at most 1000 Sinkhorn
iterations) and at most MAX_LAYERS layers. Parsing allocates per-layer lists only, so it does not
weigh the weights: a checkpoint's tensors are read lazily and its bytes are checked against the
device when the model is built (`model.placement.check_memory`); DeepSeek-V4-Flash's and -Pro's own
config.json parse on any machine.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..hc.kernels import F32_MAX, F32_TINY, MAX_N_ITER
from ..vk.errors import path_problem

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
LAYER_TYPES = (SWA, CSA, HCA)
MLP_TYPES = ("moe", "hash_moe")
SCORING = ("sqrtsoftplus", "sigmoid", "softmax")
LEGACY_RATIO = {0: SWA, 4: CSA, 128: HCA}
DEFAULT_RATES = {CSA: 4, HCA: 128}
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
             "mscale", "mscale_all_dim", "truncate")
# keys read by transformers that do not change inference here
IGNORED = {"architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "attention_bias",
           "attention_dropout", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache",
           "initializer_range", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
           "num_key_value_heads", "n_shared_experts", "norm_topk_prob", "num_nextn_predict_layers",
           "tie_word_embeddings", "quantization_config", "expert_dtype", "hidden_act", "_name_or_path",
           "rope_scaling", "rope_parameters", "compress_ratios", "compress_rate_csa", "compress_rate_hca",
           "num_hash_layers", "qk_rope_head_dim", "max_position_embeddings", "topk_method"}
# (topk_method: DeepSeek's published config.json says "noaux_tc"; transformers reads no such key and
# always ranks scores + the correction bias, as this backend does)

# A bound on num_hidden_layers, checked before anything per layer is built: a model's host structures
# (the layer lists, the checkpoint's tensor table, the graphs' dispatches) take hundreds of objects a
# layer, so 10**7 layers would exhaust the host's memory before any weight is read. Published models
# have well under 200 layers (DeepSeek-V4-Flash 43, -Pro 61).
MAX_LAYERS = 4096


# keys config.json must give: the model's sizes are never guessed (the dataclass defaults are a tiny
# test model's); the indexer's only where some layer is CSA
SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
             "o_groups", "o_lora_rank", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
             "sliding_window")
INDEXER_KEYS = ("index_n_heads", "index_head_dim", "index_topk")


class ConfigError(ValueError):
    """A config.json value this backend cannot run, naming the key and what is supported."""


# DeepSeek's published low-precision format (docs/quantized_weights.md): what quantization_config
# may say. The kernels read 128 × 128 FP8 blocks with E8M0 scales; the tensors' own dtypes decide
# which linears are FP8 or FP4 (as in transformers), so these keys are checked, not needed.
QUANT_CONFIG = {"quant_method": ("fp8",), "fmt": ("e4m3",), "scale_fmt": ("ue8m0", None),
                "weight_block_size": ([128, 128],), "activation_scheme": ("dynamic",),
                "modules_to_not_convert": None, "dequantize": None}
EXPERT_DTYPES = (None, "fp4", "fp8")


def check_quantization(d: dict) -> None:
    """ConfigError unless config.json's quantization_config / expert_dtype describe the format the
    kernels read."""
    ed = d.get("expert_dtype")
    if ed not in EXPERT_DTYPES:
        raise ConfigError(f"config expert_dtype {ed!r} not supported; expected one of {EXPERT_DTYPES}")
    qc = d.get("quantization_config")
    if qc is None:
        return
    if not isinstance(qc, dict):
        raise ConfigError(f"config quantization_config must be an object, got {qc!r}")
    unknown = sorted(set(qc) - set(QUANT_CONFIG) - {"expert_dtype"})
    if unknown:
        raise ConfigError(f"config quantization_config has unsupported key(s) {unknown}")
    for key, allowed in QUANT_CONFIG.items():
        if allowed is not None and qc.get(key, allowed[-1]) not in allowed:
            raise ConfigError(f"config quantization_config.{key} {qc[key]!r} not supported; expected "
                              f"{' or '.join(repr(a) for a in allowed if a is not None)}")
    if qc.get("expert_dtype") not in EXPERT_DTYPES:
        raise ConfigError(f"config quantization_config.expert_dtype {qc['expert_dtype']!r} not supported; "
                          f"expected one of {EXPERT_DTYPES}")


def _int(name, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"config {name} must be an integer ≥ {lo}, got {v!r}")
    return v


def _layers(v) -> int:
    """num_hidden_layers, an integer in [1, MAX_LAYERS]."""
    if _int("num_hidden_layers", v) > MAX_LAYERS:
        raise ConfigError(f"config num_hidden_layers must be at most {MAX_LAYERS} (a bound on the host structures "
                          f"built per layer; published models have under 200 layers), got {v!r}")
    return v


def _pos(name, v, lo=0.0):
    """A number > 0 that float32 holds (the kernels take it as one); at least `lo` where given."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0 \
            or v > F32_MAX or v < lo:
        low = f"from {lo:.3g}" if lo else "> 0"
        raise ConfigError(f"config {name} must be a finite number {low} that float32 holds (up to {F32_MAX:.6g}), "
                          f"got {v!r}")
    return float(v)


def _list(name, v):
    if isinstance(v, (str, bytes, dict)) or not isinstance(v, (list, tuple)):
        raise ConfigError(f"config {name} must be a list, got {v!r}")
    return v


@dataclass(frozen=True)
class V4Config:
    vocab_size: int = 64
    hidden_size: int = 32
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    head_dim: int = 32
    q_lora_rank: int = 16
    o_groups: int = 2
    o_lora_rank: int = 8
    partial_rotary_factor: float = 0.25
    n_routed_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 16
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    layer_types: tuple = (CSA, HCA, SWA)
    mlp_layer_types: tuple = ("hash_moe", "moe", "moe")
    compress_rates: dict = field(default_factory=lambda: dict(DEFAULT_RATES))
    sliding_window: int = 8
    index_n_heads: int = 16
    index_head_dim: int = 16
    index_topk: int = 4
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn: dict | None = None            # the compress rope's YaRN keys, None: plain RoPE
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    max_ctx: int = 128

    def __post_init__(self):
        object.__setattr__(self, "layer_types", tuple(_list("layer_types", self.layer_types)))
        object.__setattr__(self, "mlp_layer_types", tuple(_list("mlp_layer_types", self.mlp_layer_types)))
        for n in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                  "q_lora_rank", "o_groups", "o_lora_rank", "n_routed_experts", "num_experts_per_tok",
                  "moe_intermediate_size", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
                  "hc_sinkhorn_iters", "max_ctx"):
            _int(n, getattr(self, n))
        _layers(self.num_hidden_layers)
        for n in ("routed_scaling_factor", "swiglu_limit", "rope_theta", "compress_rope_theta", "partial_rotary_factor"):
            _pos(n, getattr(self, n))
        for n in ("hc_eps", "rms_norm_eps"):           # (a subnormal eps is still an eps: the kernels take it)
            _pos(n, getattr(self, n), F32_TINY)
        if self.hc_sinkhorn_iters > MAX_N_ITER:
            raise ConfigError(f"config hc_sinkhorn_iters must be at most {MAX_N_ITER}, got {self.hc_sinkhorn_iters}")
        if self.hc_mult != 4:
            raise ConfigError(f"config hc_mult must be 4 (the HC kernels' stream count), got {self.hc_mult!r}")
        if self.scoring_func not in SCORING:
            raise ConfigError(f"config scoring_func {self.scoring_func!r} not supported; expected one of {SCORING}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ConfigError(f"config num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                              f"n_routed_experts ({self.n_routed_experts})")
        L = self.num_hidden_layers
        for n, allowed in (("layer_types", LAYER_TYPES), ("mlp_layer_types", MLP_TYPES)):
            v = getattr(self, n)
            if len(v) != L:
                raise ConfigError(f"config {n} has {len(v)} entries, num_hidden_layers is {L}")
            bad = [t for t in v if t not in allowed]
            if bad:
                raise ConfigError(f"config {n} entries must be one of {allowed}, got {bad}")
        rd = self.rope_dim
        if rd % 2 or rd < 2 or rd > self.head_dim:
            raise ConfigError(f"config rope dim int(head_dim·partial_rotary_factor) = {rd} must be even and in "
                              f"[2, head_dim={self.head_dim}]")
        if CSA in self.layer_types and rd > self.index_head_dim:
            raise ConfigError(f"config rope dim {rd} exceeds index_head_dim {self.index_head_dim}")
        if (self.num_attention_heads * self.head_dim) % self.o_groups:
            raise ConfigError(f"config num_attention_heads·head_dim ({self.num_attention_heads * self.head_dim}) "
                              f"must be divisible by o_groups ({self.o_groups})")
        rates = self.compress_rates
        if not isinstance(rates, dict) or set(rates) != {CSA, HCA}:
            raise ConfigError(f"config compress_rates must map exactly {CSA!r} and {HCA!r}, got {rates!r}")
        for k, v in rates.items():
            _int(f"compress_rates[{k!r}]", v)
        if self.yarn is not None:
            bad = sorted(set(self.yarn) - set(YARN_KEYS))
            if bad:
                raise ConfigError(f"config rope_parameters (yarn) has unsupported key(s) {bad}; known: {YARN_KEYS}")
            if "factor" not in self.yarn or "original_max_position_embeddings" not in self.yarn:
                raise ConfigError("config rope_parameters (yarn) needs factor and original_max_position_embeddings")
        if self.vocab_size >= 1 << 24:
            raise ConfigError(f"config vocab_size must be < 2^24 (ids travel as exact f32), got {self.vocab_size}")

    # --- derived sizes ------------------------------------------------------------------------------
    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def n_mix(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult

    def rate(self, i: int) -> int:
        """Compression rate of layer i (0 for sliding-only layers)."""
        t = self.layer_types[i]
        return 0 if t == SWA else self.compress_rates[t]

    def weight_count(self) -> int:
        """Values in the checkpoint's tensors (model.checkpoint.tensor_shapes), counted without listing them."""
        D, V, hd, qr, E = self.hidden_size, self.vocab_size, self.head_dim, self.q_lora_rank, self.n_routed_experts
        nI, hI, hc = self.index_n_heads, self.index_head_dim, self.hc_mult
        n = 2 * V * D + D + hc * hc * D + hc + 1
        layer = _layer_values(vars(self))
        for (kind, mlp), count in collections.Counter(zip(self.layer_types, self.mlp_layer_types)).items():
            extra = V * self.num_experts_per_tok if mlp == "hash_moe" else E
            if kind != SWA:
                c, m = (2 if kind == CSA else 1), self.compress_rates[kind]
                extra += 2 * c * hd * D + m * c * hd + hd
            if kind == CSA:
                m = self.compress_rates[CSA]
                extra += nI * hI * qr + nI * D + 2 * (2 * hI * D) + m * 2 * hI + hI
            n += count * (layer + extra)
        return n

    def check_host_memory(self, bytes_per_weight: int, what: str) -> None:
        """ConfigError, with the bytes needed, where weights made whole on the host (random weights
        at `bytes_per_weight` each) cannot fit in this machine's memory: a MemoryError minutes later
        otherwise. A checkpoint's weights are never all on the host (they are read lazily); their
        bytes are checked against the device (`model.placement.check_memory`)."""
        values = self.weight_count()
        need = values * bytes_per_weight
        try:
            have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return
        if need > have:
            shown = ", ".join(f"{k}={getattr(self, k)}" for k in SIZE_KEYS)
            raise ConfigError(f"config sizes {shown}: {what} need {need:,} bytes ({need / 2 ** 30:,.1f} GiB: "
                              f"{values:,} values at {bytes_per_weight} bytes); this machine has "
                              f"{have / 2 ** 30:,.1f} GiB of memory")

    def replace(self, **changes: Any) -> "V4Config":
        return dataclasses.replace(self, **changes)

    # --- config.json ---------------------------------------------------------------------------------
    def to_hf(self) -> dict:
        """config.json fields (what transformers' DeepseekV4Config reads back to the same model)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("yarn", "max_ctx")}
        d["layer_types"], d["mlp_layer_types"] = list(self.layer_types), list(self.mlp_layer_types)
        main = {"rope_type": "default", "rope_theta": self.rope_theta, "partial_rotary_factor": self.partial_rotary_factor}
        comp = {"rope_type": "default", "rope_theta": self.compress_rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor}
        if self.yarn:
            comp = dict(self.yarn, rope_type="yarn", rope_theta=self.compress_rope_theta,
                        partial_rotary_factor=self.partial_rotary_factor)
            comp.setdefault("attention_factor", 1.0)
        d.update(model_type="deepseek_v4", architectures=["DeepseekV4ForCausalLM"], rope_parameters={"main": main,
                 "compress": comp}, max_position_embeddings=self.max_ctx, num_key_value_heads=1,
                 n_shared_experts=1, norm_topk_prob=True, tie_word_embeddings=False)
        return d

    @classmethod
    def from_hf(cls, d: dict, max_ctx: int | None = None) -> "V4Config":
        """From a parsed config.json; max_ctx defaults to min(max_position_embeddings, 4096)."""
        if not isinstance(d, dict):
            raise ConfigError(f"config.json must hold a JSON object, got {type(d).__name__}")
        if d.get("model_type", "deepseek_v4") != "deepseek_v4":
            raise ConfigError(f"config model_type {d['model_type']!r} is not 'deepseek_v4'")
        known = {f.name for f in dataclasses.fields(cls)} - {"yarn", "max_ctx"}
        unknown = sorted(set(d) - known - IGNORED)
        if unknown:
            raise ConfigError(f"config.json has unsupported key(s) {unknown}")
        check_quantization(d)
        kw = {k: d[k] for k in known if k in d and d[k] is not None}
        if d.get("n_shared_experts", 1) not in (None, 1):
            raise ConfigError(f"config n_shared_experts {d['n_shared_experts']!r}: DeepSeek-V4 has exactly 1")
        if d.get("tie_word_embeddings"):
            raise ConfigError("config tie_word_embeddings true: DeepSeek-V4 has an untied lm_head")
        missing = [k for k in SIZE_KEYS if k not in kw]
        if missing:
            raise ConfigError(f"config.json has no {', '.join(missing)} (or null): the model's sizes must be given")
        L = _layers(kw["num_hidden_layers"])
        if kw.get("hc_mult", 4) != 4:
            raise ConfigError(f"config hc_mult must be 4 (the HC kernels' stream count), got {kw['hc_mult']!r}")
        for k in SIZE_KEYS:
            _int(k, kw[k])
        rates = d.get("compress_rates") or {}
        if not isinstance(rates, dict):
            raise ConfigError(f"config compress_rates must be an object mapping layer types to rates, got {rates!r}")
        rates = dict(DEFAULT_RATES, **rates)
        for legacy, key in (("compress_rate_csa", CSA), ("compress_rate_hca", HCA)):
            if d.get(legacy) is not None:
                rates[key] = _int(legacy, d[legacy])
        kw["compress_rates"] = rates
        for k in ("layer_types", "mlp_layer_types"):
            if k in kw:
                _list(k, kw[k])
        if "layer_types" not in kw:
            ratios = d.get("compress_ratios")
            if ratios is not None:
                bad = [r for r in _list("compress_ratios", ratios) if r not in LEGACY_RATIO]
                if bad:
                    raise ConfigError(f"config compress_ratios entries must be one of {sorted(LEGACY_RATIO)}, got {bad}")
                kw["layer_types"] = [LEGACY_RATIO[r] for r in ratios]
            else:
                kw["layer_types"] = [HCA] * min(L, 2) + [CSA if i % 2 else HCA for i in range(max(L - 2, 0))]
        kw["layer_types"] = list(kw["layer_types"])[:L]
        if "mlp_layer_types" not in kw:
            n_hash = _int("num_hash_layers", d["num_hash_layers"], 0) if d.get("num_hash_layers") is not None else 3
            kw["mlp_layer_types"] = ["hash_moe"] * min(L, n_hash) + ["moe"] * max(0, L - n_hash)
        kw["mlp_layer_types"] = list(kw["mlp_layer_types"])[:L]
        if CSA in kw["layer_types"]:
            missing = [k for k in INDEXER_KEYS if k not in kw]
            if missing:
                raise ConfigError(f"config.json has no {', '.join(missing)} (or null): its "
                                  f"{CSA} layers' indexer sizes must be given")
        if "partial_rotary_factor" not in kw:
            hd = _int("head_dim", kw["head_dim"])
            rd = d.get("qk_rope_head_dim")
            kw["partial_rotary_factor"] = _int("qk_rope_head_dim", rd) / hd if rd is not None else 64 / 512
        kw["yarn"] = cls._yarn(d, kw)
        mpe = d.get("max_position_embeddings")
        mpe = 1048576 if mpe is None else _int("max_position_embeddings", mpe)
        kw["max_ctx"] = max_ctx if max_ctx is not None else min(mpe, 4096)
        return cls(**kw)

    @staticmethod
    def _yarn(d, kw):
        """YaRN keys of the compress rope (None: default rope); checks both rope types."""
        rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rp, dict):
            raise ConfigError(f"config rope_parameters must be an object, got {rp!r}")
        if isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict):
            main, comp = rp["main"], dict(rp["compress"])
            if main.get("rope_type", "default") != "default":
                raise ConfigError(f"config rope_parameters.main.rope_type {main['rope_type']!r} not supported; "
                                  "the sliding layers' rope must be 'default'")
            for sub, key in ((main, "rope_theta"), (comp, "compress_rope_theta")):
                if "rope_theta" in sub:
                    kw[key] = sub["rope_theta"]
            for sub in (main, comp):
                if "partial_rotary_factor" in sub and sub["partial_rotary_factor"] != kw["partial_rotary_factor"]:
                    raise ConfigError("config rope_parameters partial_rotary_factor differs from the model's "
                                      "partial_rotary_factor (or qk_rope_head_dim / head_dim) "
                                      f"({sub['partial_rotary_factor']} vs {kw['partial_rotary_factor']})")
        else:
            comp = {k: v for k, v in rp.items() if k not in ("main", "compress")}
        rtype = comp.pop("rope_type", comp.pop("type", "default"))
        for k in ("rope_theta", "partial_rotary_factor"):
            comp.pop(k, None)
        if rtype == "default":
            return None
        if rtype != "yarn":
            raise ConfigError(f"config compress rope_type {rtype!r} not supported; expected 'default' or 'yarn'")
        comp.setdefault("attention_factor", 1.0)      # as transformers forces for V4
        if comp["attention_factor"] != 1.0:
            raise ConfigError(f"config yarn attention_factor {comp['attention_factor']!r}: V4 uses 1.0")
        return comp


def _layer_values(c: dict) -> int:
    """Values in the tensors every layer has, whatever its type (c: the config's sizes by key)."""
    D, H, hd, qr, E, F = (c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"],
                          c["n_routed_experts"], c["moe_intermediate_size"])
    hc = c["hc_mult"]
    M, g, r = (2 + hc) * hc, c["o_groups"], c["o_lora_rank"]
    return (2 * (M * hc * D + M + 3) + 2 * D + qr * D + qr + H * hd * qr + hd * D + hd + g * r * (H * hd // g)
            + D * g * r + H + E * D + E * 2 * F * D + E * D * F + 3 * F * D)


def load_config_json(path: str, max_ctx: int | None = None) -> V4Config:
    """V4Config of a config.json file (ConfigError naming the file on any problem)."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({path_problem(path, e)})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    try:
        return V4Config.from_hf(d, max_ctx)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# Named configs: "tiny" (tests), "demo" (`make demo`), "flash-1gpu" (DeepSeek-V4-Flash's widths with
# 4 layers and 64 routed experts: BF16 weights about 16 GB, one GPU; 256 experts would put 8.6 GB in
# one expert tensor, past a 4 GB storage-buffer range).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(),
    "demo": dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=32,
                 q_lora_rank=32, o_groups=2, o_lora_rank=32, n_routed_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=64, layer_types=(CSA, HCA, SWA, CSA),
                 mlp_layer_types=("hash_moe", "moe", "moe", "moe"), compress_rates={CSA: 4, HCA: 8},
                 sliding_window=16, index_n_heads=16, index_head_dim=16, index_topk=8, max_ctx=128),
    "flash-1gpu": dict(vocab_size=129280, hidden_size=4096, num_hidden_layers=4, num_attention_heads=64,
                       head_dim=512, q_lora_rank=1024, o_groups=8, o_lora_rank=1024, partial_rotary_factor=0.125,
                       n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=2048,
                       layer_types=(SWA, CSA, HCA, CSA), mlp_layer_types=("hash_moe", "moe", "moe", "moe"),
                       compress_rates={CSA: 4, HCA: 128}, sliding_window=128, index_n_heads=64,
                       index_head_dim=128, index_topk=512, swiglu_limit=10.0, routed_scaling_factor=1.5,
                       yarn={"factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32,
                             "beta_slow": 1, "attention_factor": 1.0}, max_ctx=1024),
}


# "flash-43": DeepSeek-V4-Flash's depth (43 layers, flash-1gpu's layer pattern repeated) and widths
# with 8 routed experts: a token reads 6 routed experts and the shared one whatever their number,
# so the weight bytes a decode step reads are the 256-expert model's; in DeepSeek's published
# FP8 / FP4 layout (docs/quantized_weights.md) its weights fit one H200.
_FLASH = PRESETS["flash-1gpu"]
PRESETS["flash-43"] = dict(_FLASH, num_hidden_layers=43, n_routed_experts=8,
                           layer_types=tuple(_FLASH["layer_types"][i % 4] for i in range(43)),
                           mlp_layer_types=tuple(_FLASH["mlp_layer_types"][i % 4] for i in range(43)))


def preset(name: str, **overrides) -> V4Config:
    """A named config (PRESETS) with fields replaced."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return V4Config(**dict(PRESETS[name], **overrides))
