"""The library API: a model you call from your own decode loop.

    from dsv4_vk.model import Model, Sampling
    m = Model.load("path/to/hf_model_dir")         # or Model.load(V4Config(...), seed=0): random weights
    logits = m.prefill([1, 2, 3])                   # logits [V] of the last prompt token
    tok = m.step()                                  # feeds the token sampled on the device, returns the next
    for tok in m.generate([1, 2, 3], 16, Sampling(temperature=0.8, top_k=20, seed=1)):
        ...

Every decode step replays ONE command buffer recorded once: the host writes the position (4 bytes,
a host-visible param), submits, and reads the sampled token (4 bytes); nothing is recorded and no
Python runs per dispatch. The sampled token stays on the device as the next step's input. Prefill
runs the prompt in chunks of `prefill_chunk` tokens (the last one padded) through one more graph.
`steps(k)` records k decode steps back to back in one command buffer (the position advanced on the
device) and submits once; `generate` uses it (docs/model.md: what it gains and costs). Chunks and
steps at positions where every CSA top-k still keeps all closed entries run graphs without the
indexer's scoring (`model.build.all_entries_fit`); each graph is recorded on first use.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from ..core import profile
from ..core.executor import Executor
from ..ops.sample import MAX_TOP_K
from ..vk import default_device
from .build import INDEXER, STEP_PARAMS, ModelGraph, all_entries_fit, param_arrays, upload_arrays
from .checkpoint import LoadProgress, load_hf, normalise, random_weights
from .config import V4Config


@dataclass(frozen=True)
class Sampling:
    """temperature ≤ 0 (or top_k = 1): greedy; else softmax(logits / temperature) over the top_k."""
    temperature: float = 0.0
    top_k: int = 1
    seed: int = 0

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t) or t < 0:
            raise ValueError(f"Sampling.temperature must be a finite number ≥ 0, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 1 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"Sampling.top_k must be an integer in [1, {MAX_TOP_K}], got {self.top_k!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 31:
            raise ValueError(f"Sampling.seed must be an integer in [0, 2^31), got {self.seed!r}")


GREEDY = Sampling()
HISTORY = "step.history"      # i32 [max_ctx]: the token sampled after each position (multi-step decode)
STEPS_PER_SUBMIT = 4          # generate's default decode steps per command buffer


class Model:
    def __init__(self, cfg: V4Config, weights: dict, device=None, fused=None, prefill_chunk: int = 16,
                 splits=None):
        """weights: canonical names (model.checkpoint); splits: MQA key-list splits per layer at decode
        (None: model.build.decode_splits, one tiled-attention tile of the layer's longest list each)."""
        if not isinstance(cfg, V4Config):
            raise ValueError(f"cfg must be a V4Config, got {type(cfg).__name__}")
        weights = normalise(cfg, weights)
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be an integer ≥ 1, got {prefill_chunk!r}")
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None (policy), True or False, got {fused!r}")
        self.cfg, self.fused, self.splits = cfg, fused, splits
        self.device = device or default_device()
        self.prefill_chunk = min(prefill_chunk, cfg.max_ctx)
        self.ex = Executor(self.device)
        self.params = param_arrays(cfg, weights, self.prefill_chunk,
                                   max_binding=self.device.caps.limits.max_storage_buffer_range)
        # some CSA layer has an indexer that scores only where it matters (not with INDEXER["always"])
        self._indexed = any(n.endswith(".idx.state") for n in self.params) and not INDEXER["always"]
        # multi-step decode (steps): the token sampled after each position, written on the device
        self.params[HISTORY] = np.zeros(cfg.max_ctx, np.int32)
        self.storage = {}         # device param name -> storage type (memory())
        for name, a, storage in upload_arrays(self.params, LoadProgress()):
            self.ex.set_param(name, a, host_visible=name in STEP_PARAMS + (HISTORY,) or name.startswith("sampler."))
            self.storage[name] = storage
        self._graphs = {}         # (kind, timestamps) -> CompiledGraph, held so no step looks them up
        self._step = {n: self.ex.params[n] for n in STEP_PARAMS + (HISTORY,)}
        self.position = 0
        self.sampling = GREEDY
        self.timing = {"steps": 0, "step_s": 0.0, "submit_s": 0.0}

    # --- construction ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path_or_config, device=None, fused=None, *, seed: int = 0, prefill_chunk: int = 16,
             max_ctx: int | None = None, splits=None) -> "Model":
        """From a Hugging Face model directory (config.json + safetensors; max_ctx: the decode cache
        capacity, default min(max_position_embeddings, 4096)), or random weights for a V4Config."""
        if isinstance(path_or_config, V4Config):
            cfg = path_or_config
            return cls(cfg, random_weights(cfg, seed), device, fused, prefill_chunk, splits)
        cfg, weights = load_hf(path_or_config, max_ctx)
        return cls(cfg, weights, device, fused, prefill_chunk, splits)

    # --- graphs -----------------------------------------------------------------------------------
    def compiled(self, kind: str, dense: bool | None = None):
        """The CompiledGraph of "prefill" or "decode" (built and recorded on first use, then replayed);
        dense: the one for positions where every CSA top-k keeps all closed entries (no indexer
        scoring: model.build.all_entries_fit), or not; None: the one the next chunk or step at the
        current position runs."""
        if dense is None:
            dense = self._dense(self.position + (self.prefill_chunk - 1 if kind == "prefill" else 0))
        key = (kind, dense, profile.active())
        cg = self._graphs.get(key)
        if cg is None:
            T = self.prefill_chunk if kind == "prefill" else 1
            splits = None if kind == "decode" else [1] * self.cfg.num_hidden_layers
            graph = ModelGraph(self.cfg, self.params, T, prefill=kind == "prefill", fused=self.fused,
                               device=self.device, splits=self.splits if kind == "decode" else splits,
                               dense=dense).g
            cg = self._graphs[key] = self.ex.compile(graph)
        return cg

    def _dense(self, last_position: int) -> bool:
        """Whether the graphs for positions up to last_position may leave out the indexer's scoring
        (it selects every entry there; its keys are still compressed). Where no layer builds an
        indexer the one graph is already dense."""
        return self._indexed and all_entries_fit(self.cfg, last_position)

    def memory(self) -> dict:
        """Device bytes of the uploaded params: {"weights": {storage: bytes}, "cache": bytes (decode
        cache, RoPE tables, per-step values), "total": bytes}; weights keep the checkpoint's precision
        (storage: f32, bf16, f16, i32, or fp8 / fp4 codes and their e8m0 scales)."""
        weights, cache = {}, 0
        for name, p in self.ex.params.items():
            nbytes = p.nbytes
            if name.startswith(("step.", "sampler.", "rope.")) or name.endswith((".kv", ".state", ".ent")):
                cache += nbytes
            else:
                kind = self.storage.get(name, p.dtype)
                weights[kind] = weights.get(kind, 0) + nbytes
        return {"weights": weights, "cache": cache, "total": sum(weights.values()) + cache}

    def paths(self) -> list:
        """(op, path, reason) of every HC op of the decode graph."""
        return list(self.compiled("decode").graph.paths)

    # --- per-step values ------------------------------------------------------------------------------
    def _write(self, name, value):
        self._step[name].write(np.array([value], np.int32))

    def _read_token(self):
        return int(self._step["step.token"].read_at(0)[0])

    def _replay(self, cg, inputs=None):
        cg.replay(inputs)

    # --- API --------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new sequence at position 0 (cache rows are overwritten before they are read)."""
        self.position = 0

    def set_sampling(self, sampling: "Sampling") -> None:
        """Sampling of every following prefill/step (reseeds the device RNG)."""
        if not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling, got {type(sampling).__name__}")
        self.sampling = sampling
        self.ex.set_param("sampler.cfg", np.array([sampling.temperature, sampling.top_k], np.float32))
        self.ex.set_param("sampler.state", np.array([sampling.seed, 0], np.int32))

    @property
    def next_token(self) -> int:
        """The token the device sampled from the last logits (the next step's input by default)."""
        return self._read_token()

    def _ids(self, ids, name):
        a = np.asarray(ids)
        if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be a non-empty 1-D sequence of integer token ids, got {a.dtype} shape {a.shape}")
        bad = (a < 0) | (a >= self.cfg.vocab_size)
        if bad.any():
            raise ValueError(f"{name} holds ids outside [0, {self.cfg.vocab_size}): {a[bad][:5].tolist()}")
        if self.position + a.size > self.cfg.max_ctx:
            raise ValueError(f"{name}: {a.size} tokens at position {self.position} exceed max_ctx {self.cfg.max_ctx}")
        return a.astype(np.int32)

    def prefill(self, ids: Sequence[int] | np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Run `ids` from the current position; returns the logits [V] of the last one ([N, V] with
        all_logits). The device samples the next token from them (see next_token)."""
        ids = self._ids(ids, "ids")
        C = self.prefill_chunk
        rows = []
        with profile.phase("prefill"):
            for start in range(0, ids.size, C):
                chunk = ids[start:start + C]
                cg = self.compiled("prefill", self._dense(self.position + start + C - 1))
                logits_t = cg.graph.outputs["logits"]
                self._write("step.pos", self.position + start)
                self._write("step.last", chunk.size - 1)
                self._replay(cg, {"ids": np.pad(chunk, (0, C - chunk.size))})
                if all_logits or start + C >= ids.size:
                    rows.append(cg.read(logits_t)[:chunk.size])
        self.position += ids.size
        return np.concatenate(rows) if all_logits else rows[-1][-1]

    def step(self, token: int | None = None, output: str = "token") -> int | np.ndarray:
        """One decode step of `token` (default: the token the device sampled last) at the current
        position; returns the next sampled token (int), or the logits [V] with output="logits"."""
        t0 = time.perf_counter()
        if output not in ("token", "logits"):
            raise ValueError(f"output must be 'token' or 'logits', got {output!r}")
        if self.position >= self.cfg.max_ctx:
            raise ValueError(f"the sequence is full: position {self.position} = max_ctx; call reset()")
        if token is not None:
            self._write("step.token", int(self._ids([token], "token")[0]))
        cg = self.compiled("decode", self._dense(self.position))
        self._write("step.pos", self.position)
        t1 = time.perf_counter()
        with profile.phase("decode"):
            self._replay(cg)
        t2 = time.perf_counter()
        self.position += 1
        out = self._read_token() if output == "token" else cg.read(cg.graph.outputs["logits"])[0]
        tm = self.timing
        tm["steps"] += 1
        tm["submit_s"] += t2 - t1
        tm["step_s"] += time.perf_counter() - t0
        if output == "token" and out < 0:
            raise FloatingPointError("the logits have no finite value: the device sampled no token")
        return out

    def steps(self, k: int) -> list:
        """Multi-step decode: k decode steps (fewer where the context ends; at most prefill_chunk)
        recorded back to back in ONE command buffer and submitted once; returns the k sampled tokens.
        Each repetition feeds the token the previous one sampled (it stays on the device), stores
        its own at step.history[pos] and advances step.pos on the device (STORE_AT), so the host
        writes the position once and reads k tokens once per k steps. The command buffer for each k
        is recorded on first use. k ≤ prefill_chunk: the decode rings keep chunk − 1 spare rows, so
        steps a caller discards (rewinding `position`, as generate does) never overwrite rows the
        kept positions still read."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer ≥ 1, got {k!r}")
        if self.position >= self.cfg.max_ctx:
            raise ValueError(f"the sequence is full: position {self.position} = max_ctx; call reset()")
        t0 = time.perf_counter()
        k = min(k, self.prefill_chunk, self.cfg.max_ctx - self.position)
        dense = self._dense(self.position + k - 1)
        key = ("decode", k, dense, profile.active())
        cg = self._graphs.get(key)
        if cg is None:
            g = ModelGraph(self.cfg, self.params, 1, prefill=False, fused=self.fused, device=self.device,
                           splits=self.splits, dense=dense).g
            hist = g.param(HISTORY, (self.cfg.max_ctx,), "i32")
            g.op("STORE_AT", g.param("step.token", (1,), "i32"), g.param("step.pos", (1,), "i32"), hist, out=hist,
                 advance=1)
            cg = self._graphs[key] = self.ex.compile(g, repeat=k)
        self._write("step.pos", self.position)
        t1 = time.perf_counter()
        with profile.phase("decode"):
            self._replay(cg)
        t2 = time.perf_counter()
        toks = [int(t) for t in self._step[HISTORY].read_at(self.position, k)]
        self.position += k
        tm = self.timing
        tm["steps"] += k
        tm["submit_s"] += t2 - t1
        tm["step_s"] += time.perf_counter() - t0
        return toks

    def generate(self, prompt: Sequence[int] | np.ndarray, max_new_tokens: int, sampling: "Sampling | None" = None,
                 stop: Iterable[int] | None = None, steps_per_submit: int = STEPS_PER_SUBMIT) -> Iterator[int]:
        """A new sequence: prefill `prompt`, then yield up to max_new_tokens sampled tokens, ending
        early after a token in `stop`. Decode runs `steps_per_submit` steps per command buffer
        (`steps`); tokens past a stop token (or past what the caller took) are discarded and the
        position, the fed-back token and the sampler counter rewound, so the model ends in the
        state one-step decoding would leave. Arguments are checked here, before the generator is
        returned."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer ≥ 0, got {max_new_tokens!r}")
        if isinstance(steps_per_submit, bool) or not isinstance(steps_per_submit, int) or steps_per_submit < 1:
            raise ValueError(f"steps_per_submit must be an integer ≥ 1, got {steps_per_submit!r}")
        if sampling is not None and not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling or None, got {type(sampling).__name__}")
        self.reset()
        prompt = self._ids(prompt, "prompt")
        if prompt.size + max_new_tokens - 1 > self.cfg.max_ctx:
            raise ValueError(f"max_new_tokens: {prompt.size} prompt + {max_new_tokens} new tokens exceed "
                             f"max_ctx {self.cfg.max_ctx} (+1: the last token is not fed back)")
        return self._generate(prompt, max_new_tokens, sampling or self.sampling, set(stop or ()), steps_per_submit)

    def _generate(self, prompt, max_new_tokens, sampling, stop, per_submit):
        if max_new_tokens == 0:
            return
        self.set_sampling(sampling)
        self.prefill(prompt)
        batch, n = [self.next_token], 0
        while True:
            for j, tok in enumerate(batch):
                if tok < 0:
                    raise FloatingPointError("the logits have no finite value: the device sampled no token")
                try:
                    yield tok
                except GeneratorExit:               # the caller stopped taking tokens
                    self._discard(batch, j + 1)
                    raise
                n += 1
                if tok in stop or n == max_new_tokens:
                    self._discard(batch, j + 1)
                    return
            batch = self.steps(min(per_submit, max_new_tokens - n))

    def _discard(self, batch, kept):
        """Rewind after a batch of which only the first `kept` tokens were used: the position, the
        token fed back next and the sampler counter go back to where one-step decoding would have
        left them (steps: the rows the discarded steps wrote are rewritten before anything reads them)."""
        surplus = len(batch) - kept
        if surplus <= 0:
            return
        self.position -= surplus
        self._write("step.token", batch[kept - 1])
        state = self.ex.params["sampler.state"]
        state.write(state.read_at(1) - surplus, 1)
