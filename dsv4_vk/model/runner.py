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
runs the prompt in chunks of `prefill_chunk` tokens (the last one padded) through one more graph;
by default the device chooses the chunk (knobs prefill_chunk.gpu / .cpu: large where the GPU's
mat-muls need many rows, small on CPU devices).
`steps(k)` records k decode steps back to back in one command buffer (the position advanced on the
device) and submits once; `generate` uses it (docs/model.md: what it gains and costs). Chunks and
steps at positions where every CSA top-k still keeps all closed entries run graphs without the
indexer's scoring (`model.params.all_entries_fit`); each graph is recorded on first use.
"""
from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Generator, Iterable, NamedTuple, Sequence

import numpy as np

from ..core import profile
from ..core.executor import CompiledGraph, Executor
from ..ops.sample import MAX_TOP_K
from ..ops.v4_attention import MAX_DECODE_SPLITS
from ..vk import Device, Upload, default_device
from ..core.tuning import Tuning, current, knob_table, tuned
from .build import ModelGraph
from .params import STEP_PARAMS, all_entries_fit, expert_stack_bytes, param_arrays, routed_expert_layer, upload_arrays
from .placement import HISTORY, ExpertOffload, check_memory, offload_value, device_budget
from .checkpoint import LoadProgress, load_hf, normalise, tensor_shapes
from .synthetic import random_weights
from .tensor_files import Stream
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


class SitePath(NamedTuple):
    """Which path one HC op of a model took, and why (Model.paths)."""
    site: str           # the hyper-connection site: "layers.{i}.attn", "layers.{i}.ffn" or "head"
    op: str             # HC_SITE, HC_COMB, HC_PRE, HC_POST, ...
    path: str           # "fused:site", "unfused", ...
    reason: str


GREEDY = Sampling()
STEPS_PER_SUBMIT = 4          # generate's default decode steps per command buffer


def _positive(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an integer ≥ 1, got {v!r}")
    return v


def _check_device(device: object) -> None:
    if device is not None and not isinstance(device, Device):
        raise ValueError(f"device must be a dsv4_vk.Device (a Vulkan device: dsv4_vk.Device(), Device(1) or "
                         f"Device('llvmpipe'); `dsv4_vk info --all` lists them) or None for the default one, "
                         f"got {device!r}")


# The prefill chunk a model gets when its caller gives none (prefill_chunk=None), by device type: a
# GPU's mat-muls over a chunk want many rows (the matrix units' tiles and the grouped experts fill
# with them: on the H200 flash-1gpu prefills a 4k prompt about 1.3x faster in chunks of 512 than of
# 128, results/README.md), a CPU device runs them in turn.
PREFILL_CHUNK = knob_table(
    "prefill_chunk",
    gpu=(512, "tokens a prefill chunk holds on GPUs when Model(prefill_chunk=None)"),
    cpu=(16, "tokens a prefill chunk holds on CPU devices when Model(prefill_chunk=None)"))


def _tuning(tuning: Tuning | None) -> Tuning:
    if tuning is not None and not isinstance(tuning, Tuning):
        raise ValueError(f"tuning must be a dsv4_vk.core.tuning.Tuning or None, got {type(tuning).__name__}")
    return current() if tuning is None else tuning


def _prefill_chunk(chunk: int | None, device: Device, tuning: Tuning) -> int:
    """The prefill chunk: the caller's, or the device type's default (PREFILL_CHUNK)."""
    if chunk is None:
        name = f"prefill_chunk.{'cpu' if device.caps.is_cpu else 'gpu'}"
        value, what = tuning[name], f"tuning knob {name!r} must be an integer ≥ 1"
    else:
        value, what = chunk, "prefill_chunk must be an integer ≥ 1 or None (the device chooses)"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}, got {value!r}")
    return value


class Model:
    def __init__(self, cfg: V4Config, weights: dict, device: Device | None = None, fused: bool | None = None,
                 prefill_chunk: int | None = None, splits: Sequence[int] | None = None, *,
                 max_ctx: int | None = None, tuning: Tuning | None = None, expert_offload: ExpertOffload = "auto",
                 max_device_memory: int | None = None):
        """weights: canonical names (model.checkpoint); splits: MQA key-list splits per layer at decode
        (None: model.build.decode_splits, one tiled-attention tile of the layer's longest list each);
        max_ctx: the decode cache's capacity in positions (default cfg.max_ctx). The weights' and the
        cache's bytes are checked against the device before anything is allocated (check_memory).
        expert_offload: "auto" keeps the routed experts of the fewest whole layers in host memory
        (read over the bus, a RuntimeWarning says how much) where the device's own memory does not
        hold everything, else none; False: never (a model too large is refused); a number: that
        many layers' (model.placement). max_device_memory: bytes of device-local memory the model
        may take (default: the device's largest device-local heap). tuning: the knobs (core.tuning)
        every graph of this model is built under (default: those in effect here)."""
        if not isinstance(cfg, V4Config):
            raise ValueError(f"cfg must be a V4Config, got {type(cfg).__name__}")
        offload, budget = offload_value(expert_offload), device_budget(max_device_memory)
        self.tuning = _tuning(tuning)
        _check_device(device)
        splits = _check_splits(splits, cfg.num_hidden_layers)
        if max_ctx is not None:
            cfg = cfg.replace(max_ctx=_positive("max_ctx", max_ctx))
        weights = normalise(cfg, weights)
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None (policy), True or False, got {fused!r}")
        self.cfg, self.fused, self.splits = cfg, fused, splits
        self.device = device or default_device()
        self.prefill_chunk = min(_prefill_chunk(prefill_chunk, self.device, self.tuning), cfg.max_ctx)
        plan = check_memory(cfg, sum(int(w.nbytes) for w in weights.values()), self.prefill_chunk, self.device,
                            expert_stack_bytes(cfg, weights), offload, budget)
        self.offloaded: tuple[int, ...] = plan["offloaded"]     # layers whose routed experts are in host memory
        host = set(self.offloaded)
        self.ex = Executor(self.device)
        with tuned(self.tuning):        # (which indexers are built depends on indexer.always)
            self.params = param_arrays(cfg, weights, self.prefill_chunk,
                                       max_binding=self.device.caps.limits.max_storage_buffer_range)
        # some CSA layer has an indexer that scores only where it matters (not with indexer.always)
        self._indexed = any(n.endswith(".idx.state") for n in self.params) and not self.tuning["indexer.always"]
        # multi-step decode (steps): the token sampled after each position, written on the device
        self.params[HISTORY] = np.zeros(cfg.max_ctx, np.int32)
        self.storage = {}         # device param name -> storage type (memory())
        with Upload(self.device) as up:     # lazy params stream from the files, reads beside copies
            for name, a, storage in upload_arrays(self.params, LoadProgress()):
                mapped = name in STEP_PARAMS + (HISTORY,) or name.startswith("sampler.")    # per-step values
                in_host = routed_expert_layer(name) in host
                if isinstance(a, Stream) and not mapped:
                    self.ex.stream_param(name, a.shape, a.dtype, a.fill, up, host_memory=in_host)
                else:
                    self.ex.set_param(name, a.array() if isinstance(a, Stream) else a, host_visible=mapped,
                                      host_memory=in_host)
                self.storage[name] = storage
        if self.offloaded and offload == "auto":
            self._tell_offload(plan)
        self._graphs: dict = {}       # (kind, timestamps) -> CompiledGraph, held so no step looks them up
        self._step = {n: self.ex.params[n] for n in STEP_PARAMS + (HISTORY,)}
        self.position = 0
        self.sampling = GREEDY
        self._fed = False         # whether a prompt (or a token) was run since the sequence began
        self._epoch = 0           # advanced by every call that changes the sequence: stale generators see it
        self.timing = {"steps": 0, "step_s": 0.0, "submit_s": 0.0}

    def _tell_offload(self, plan: dict) -> None:
        """The RuntimeWarning of expert_offload="auto": what went to host memory and what decode reads there."""
        cfg, k = self.cfg, self.cfg.num_experts_per_tok
        stacks: dict[str, list[int]] = {}       # stack -> [bytes, experts] (its parts past one binding added)
        for n, a in self.params.items():
            if routed_expert_layer(n) in self.offloaded:
                s = stacks.setdefault(re.sub(r"\.\d+$", "", n), [0, 0])
                s[0], s[1] = s[0] + a.nbytes, s[1] + a.shape[0]
        per_token = k * sum(b // e for b, e in stacks.values())
        warnings.warn(f"the weights and decode cache ({plan['total']} bytes) do not fit {self.device.name}'s device "
                      f"memory ({plan['available']} bytes): the routed experts of {len(self.offloaded)} of "
                      f"{cfg.num_hidden_layers} layers ({plan['host']} bytes; layers {_spans(self.offloaded)}) are "
                      f"in host memory, and decode reads those layers' {k} picked experts over the bus, about "
                      f"{per_token} bytes a token (expert_offload=False refuses instead; Model.memory() says "
                      f"where the bytes are)", RuntimeWarning, stacklevel=3)

    # --- construction ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path_or_config: str | V4Config, device: Device | None = None, fused: bool | None = None, *,
             seed: int = 0, prefill_chunk: int | None = None, max_ctx: int | None = None,
             splits: Sequence[int] | None = None, tuning: Tuning | None = None, expert_offload: ExpertOffload = "auto",
             max_device_memory: int | None = None) -> "Model":
        """From a Hugging Face model directory (config.json + safetensors; max_ctx: the decode cache
        capacity, default min(max_position_embeddings, 4096)), or random weights for a V4Config
        (max_ctx: default the config's). Weights and a cache too large for the device are refused
        before anything is allocated (check_memory), unless routed experts in host memory make them
        fit (expert_offload, max_device_memory: as Model's)."""
        _check_device(device)
        place: dict = {"expert_offload": expert_offload, "max_device_memory": max_device_memory}
        offload, budget = offload_value(expert_offload), device_budget(max_device_memory)
        if isinstance(path_or_config, V4Config):
            cfg = path_or_config
            if max_ctx is not None:
                cfg = cfg.replace(max_ctx=_positive("max_ctx", max_ctx))
            cfg.check_host_memory(4, "the random float32 weights")
            dev = device or default_device()
            chunk = _prefill_chunk(prefill_chunk, dev, _tuning(tuning))
            shapes = {name: np.broadcast_to(np.float32(0), shape) for name, shape in tensor_shapes(cfg).items()}
            check_memory(cfg, sum(4 * int(np.prod(shape)) for shape in tensor_shapes(cfg).values()),
                         min(chunk, cfg.max_ctx), dev, expert_stack_bytes(cfg, shapes), offload,
                         budget)                                      # random weights: float32 / int32
            return cls(cfg, random_weights(cfg, seed), device, fused, prefill_chunk, splits, tuning=tuning, **place)
        if max_ctx is not None:
            _positive("max_ctx", max_ctx)
        cfg, weights = load_hf(path_or_config, max_ctx)
        return cls(cfg, weights, device, fused, prefill_chunk, splits, tuning=tuning, **place)

    # --- graphs -----------------------------------------------------------------------------------
    def compiled(self, kind: str, dense: bool | None = None, all_logits: bool = False) -> CompiledGraph:
        """The CompiledGraph of "prefill" or "decode" (built and recorded on first use, then replayed);
        dense: the one for positions where every CSA top-k keeps all closed entries (no indexer
        scoring: model.params.all_entries_fit), or not; None: the one the next chunk or step at the
        current position runs. all_logits (prefill): the head over every token of the chunk, else
        over its last one only (the logits prefill returns by default)."""
        if dense is None:
            dense = self._dense(self.position + (self.prefill_chunk - 1 if kind == "prefill" else 0))
        all_logits = all_logits and kind == "prefill"
        key = (kind, dense, all_logits, profile.active())
        cg = self._graphs.get(key)
        if cg is None:
            T = self.prefill_chunk if kind == "prefill" else 1
            splits = None if kind == "decode" else [1] * self.cfg.num_hidden_layers
            with tuned(self.tuning):
                graph = ModelGraph(self.cfg, self.params, T, prefill=kind == "prefill", fused=self.fused,
                                   device=self.device, splits=self.splits if kind == "decode" else splits,
                                   dense=dense, all_logits=all_logits).g
            cg = self._graphs[key] = self.ex.compile(graph)
        return cg

    def _dense(self, last_position: int) -> bool:
        """Whether the graphs for positions up to last_position may leave out the indexer's scoring
        (it selects every entry there; its keys are still compressed). Where no layer builds an
        indexer the one graph is already dense."""
        return self._indexed and all_entries_fit(self.cfg, last_position)

    def memory(self) -> dict:
        """Bytes of the uploaded params: {"weights": {storage: bytes}, "cache": bytes (decode cache, RoPE
        tables, per-step values), "total": bytes, "host": {storage: bytes} (the part of "weights" in
        host memory the device reads over its bus: the routed experts of the layers in `offloaded`;
        empty without), "device": bytes of the rest}; weights keep the checkpoint's precision
        (storage: f32, bf16, f16, i32, or fp8 / fp4 codes and their e8m0 scales)."""
        weights: dict[str, int] = {}
        host: dict[str, int] = {}
        cache = 0
        for name, p in self.ex.params.items():
            nbytes = p.nbytes
            if name.startswith(("step.", "sampler.", "rope.")) or name.endswith((".kv", ".state", ".ent")):
                cache += nbytes
            else:
                kind = self.storage.get(name, p.dtype)
                weights[kind] = weights.get(kind, 0) + nbytes
                if p.host_memory:
                    host[kind] = host.get(kind, 0) + nbytes
        total = sum(weights.values()) + cache
        return {"weights": weights, "cache": cache, "total": total, "host": host, "device": total - sum(host.values())}

    def paths(self) -> list[SitePath]:
        """SitePath(site, op, path, reason) of every HC op of the decode graph, in order; site names the
        hyper-connection site it belongs to ("layers.0.attn", "layers.0.ffn", …, "head")."""
        graph = self.compiled("decode").graph
        return [SitePath(site, *p) for site, p in zip(graph.path_scopes, graph.paths)]

    # --- per-step values ------------------------------------------------------------------------------
    def _write(self, name, value):
        self._step[name].write(np.array([value], np.int32))

    def _read_token(self):
        return int(self._step["step.token"].read_at(0)[0])

    def _replay(self, cg, inputs=None):
        cg.replay(inputs)

    # --- API --------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new sequence at position 0 (cache rows are overwritten before they are read). A
        generator that `generate` returned before raises on its next token."""
        self.position = 0
        self._fed = False
        self._epoch += 1

    def set_sampling(self, sampling: "Sampling") -> None:
        """Sampling of every following prefill/step (reseeds the device RNG)."""
        if not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling, got {type(sampling).__name__}")
        self.sampling = sampling
        self._epoch += 1
        self.ex.set_param("sampler.cfg", np.array([sampling.temperature, sampling.top_k], np.float32))
        self.ex.set_param("sampler.state", np.array([sampling.seed, 0], np.int32))

    @property
    def epoch(self) -> int:
        """A counter that every change to the sequence advances (prefill, step, steps, generate,
        reset, set_sampling): whoever holds on to the sequence (a stale generate() iterator, a Chat)
        compares it with the value it saw last to know whether anything else used the model since."""
        return self._epoch

    @property
    def next_token(self) -> int:
        """The token the device sampled from the last logits (the next step's input by default)."""
        return self._read_token()

    def _ids(self, ids: Sequence[int] | np.ndarray, name: str) -> np.ndarray:
        a = np.asarray(ids)
        if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be a non-empty 1-D sequence of integer token ids, got {a.dtype} shape {a.shape}")
        bad = (a < 0) | (a >= self.cfg.vocab_size)
        if bad.any():
            raise ValueError(f"{name} holds ids outside [0, {self.cfg.vocab_size}): {a[bad][:5].tolist()}")
        if self.position + a.size > self.cfg.max_ctx:
            raise ValueError(f"{name}: {a.size} tokens at position {self.position} exceed max_ctx {self.cfg.max_ctx}")
        return a.astype(np.int32)

    def prefill(self, ids: Sequence[int] | np.ndarray, all_logits: bool = False,
                progress: Callable[[int, int], object] | None = None) -> np.ndarray:
        """Run `ids` from the current position; returns the logits [V] of the last one ([N, V] with
        all_logits). The device samples the next token from them (see next_token). progress: called
        as progress(tokens done, tokens in all) after each chunk (a long prompt's progress bar)."""
        if progress is not None and not callable(progress):
            raise ValueError(f"progress must be a callable (done, total) or None, got {type(progress).__name__}")
        ids = self._ids(ids, "ids")
        C = self.prefill_chunk
        rows = []
        with profile.phase("prefill"):
            for start in range(0, ids.size, C):
                chunk = ids[start:start + C]
                cg = self.compiled("prefill", self._dense(self.position + start + C - 1), all_logits)
                logits_t = cg.graph.outputs["logits"]
                self._write("step.pos", self.position + start)
                self._write("step.last", chunk.size - 1)
                self._replay(cg, {"ids": np.pad(chunk, (0, C - chunk.size))})
                if all_logits:
                    rows.append(cg.read(logits_t)[:chunk.size])
                elif start + C >= ids.size:
                    rows.append(cg.read(logits_t))                  # the last token's row only
                if progress is not None:
                    progress(start + chunk.size, ids.size)
        self.position += ids.size
        self._fed = True
        self._epoch += 1
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
        else:
            self._check_fed("step()")
        cg = self.compiled("decode", self._dense(self.position))
        self._write("step.pos", self.position)
        t1 = time.perf_counter()
        with profile.phase("decode"):
            self._replay(cg)
        t2 = time.perf_counter()
        self.position += 1
        self._fed = True
        self._epoch += 1
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
        self._check_fed("steps()")
        t0 = time.perf_counter()
        k = min(k, self.prefill_chunk, self.cfg.max_ctx - self.position)
        dense = self._dense(self.position + k - 1)
        key = ("decode", k, dense, profile.active())
        cg = self._graphs.get(key)
        if cg is None:
            with tuned(self.tuning):
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
        self._epoch += 1
        tm = self.timing
        tm["steps"] += k
        tm["submit_s"] += t2 - t1
        tm["step_s"] += time.perf_counter() - t0
        return toks

    def generate(self, prompt: Sequence[int] | np.ndarray, max_new_tokens: int, sampling: "Sampling | None" = None,
                 stop: Iterable[int] | None = None, steps_per_submit: int = STEPS_PER_SUBMIT,
                 progress: Callable[[int, int], object] | None = None, *,
                 continue_sequence: bool = False) -> Generator[int, None, None]:
        """A new sequence: prefill `prompt`, then yield up to max_new_tokens sampled tokens, ending
        early after a token in `stop`. continue_sequence=True: no new sequence, the prompt runs from
        the current position after what the sequence holds (a conversation's next turn: Chat). sampling=None: greedy (`Sampling()`), whatever was set before.
        Decode runs `steps_per_submit` steps per command buffer (`steps`); tokens past a stop token
        (or past what the caller took) are discarded and the position, the fed-back token and the
        sampler counter rewound, so the model ends in the state one-step decoding would leave.
        Arguments are checked here, before the generator is returned. The generator owns the model
        until it ends: once anything else changes the sequence (`reset`, another `generate`,
        `prefill`, `step`, `steps`, `set_sampling`) it raises RuntimeError on its next token.
        progress: as prefill's, called while the prompt runs."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer ≥ 0, got {max_new_tokens!r}")
        if isinstance(steps_per_submit, bool) or not isinstance(steps_per_submit, int) or steps_per_submit < 1:
            raise ValueError(f"steps_per_submit must be an integer ≥ 1, got {steps_per_submit!r}")
        if sampling is not None and not isinstance(sampling, Sampling):
            raise ValueError(f"sampling must be a Sampling or None, got {type(sampling).__name__}")
        if progress is not None and not callable(progress):
            raise ValueError(f"progress must be a callable (done, total) or None, got {type(progress).__name__}")
        if not isinstance(continue_sequence, bool):
            raise ValueError(f"continue_sequence must be True or False, got {continue_sequence!r}")
        if not continue_sequence:
            self.reset()
        prompt = self._ids(prompt, "prompt")
        if self.position + prompt.size + max_new_tokens - 1 > self.cfg.max_ctx:
            held = f"{self.position} tokens held + " if self.position else ""
            raise ValueError(f"max_new_tokens: {held}{prompt.size} prompt + {max_new_tokens} new tokens exceed "
                             f"max_ctx {self.cfg.max_ctx} (+1: the last token is not fed back)")
        return self._generate(prompt, max_new_tokens, GREEDY if sampling is None else sampling, set(stop or ()),
                              steps_per_submit, self._epoch, progress)

    def _generate(self, prompt, max_new_tokens, sampling, stop, per_submit, epoch, progress=None):
        if max_new_tokens == 0:
            return
        self._check_current(epoch)
        self.set_sampling(sampling)
        self.prefill(prompt, progress=progress)
        epoch = self._epoch
        batch, n = [self.next_token], 0
        while True:
            for j, tok in enumerate(batch):
                if tok < 0:
                    raise FloatingPointError("the logits have no finite value: the device sampled no token")
                try:
                    yield tok
                except GeneratorExit:               # the caller stopped taking tokens
                    if self._epoch == epoch:        # (a stale generator leaves the new sequence alone)
                        self._discard(batch, j + 1)
                    raise
                self._check_current(epoch)
                n += 1
                if tok in stop or n == max_new_tokens:
                    self._discard(batch, j + 1)
                    return
            batch = self.steps(min(per_submit, max_new_tokens - n))
            epoch = self._epoch

    def _check_current(self, epoch):
        if self._epoch != epoch:
            raise RuntimeError("this generate() iterator is stale: the model's sequence changed since it "
                               "yielded (reset, another generate, prefill, step, steps or set_sampling); its "
                               "tokens would come from another state. Call generate() again")

    def _check_fed(self, what):
        if not self._fed:
            raise ValueError(f"{what} has no token to feed: the sequence has no prompt yet (after Model.load or "
                             "reset). Run prefill(ids) first, or pass the token: step(token)")

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


def _spans(layers: Sequence[int]) -> str:
    """Layer indices as ranges: (0, 1, 2, 5) -> "0-2, 5"."""
    out: list[list[int]] = []
    for i in layers:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def _check_splits(splits, n_layers):
    """splits as a tuple of n_layers integers in [1, MAX_DECODE_SPLITS] (None: the default per layer)."""
    if splits is None:
        return None
    if isinstance(splits, (str, bytes)) or not isinstance(splits, Sequence):
        raise ValueError(f"splits must be None or a sequence of {n_layers} integers (one per layer), "
                         f"got {type(splits).__name__}")
    if len(splits) != n_layers:
        raise ValueError(f"splits has {len(splits)} entries: expected one per layer, num_hidden_layers = {n_layers}")
    bad = [s for s in splits if isinstance(s, bool) or not isinstance(s, (int, np.integer))
           or not 1 <= s <= MAX_DECODE_SPLITS]
    if bad:
        raise ValueError(f"splits entries must be integers from 1 to {MAX_DECODE_SPLITS} (key-list splits at "
                         f"decode), got {bad[:5]}")
    return tuple(int(s) for s in splits)
