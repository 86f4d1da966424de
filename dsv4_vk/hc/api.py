"""The hyper-connection ops as plain functions: numpy in → numpy out, device Tensors in → Tensors out.

Each call validates its arguments (ValueError naming the argument and what was expected) and runs
the op's program from the device's program cache, keyed by (op, shapes, flags): the graph is built
and recorded once per key, later calls only write or copy their inputs, submit once and wait. Given
any `dsv4_vk.Tensor` argument (or `out=`), the results are Tensors that stay on the device (inputs
and outputs are copied on the device, in the same submit); otherwise numpy arrays (float32). T = 0
returns empty results after the same checks (the device, out's shapes) without running anything.
Per-token ops whose arrays exceed the device's maxStorageBufferRange run in chunks of tokens, each
chunk one submit.
`last_run()` describes the calling thread's last call: dispatches, barriers, paths [(op, path, reason)].
"""
from __future__ import annotations

import math
import threading
import weakref
from types import SimpleNamespace
from typing import Any, Sequence, Union, cast, overload

import numpy as np
from numpy.typing import ArrayLike

from . import composite as hc, policy as hc_policy
from .policy import generation
from ..core.tuning import current
from ..core.executor import CompiledGraph
from ..core.graph import Graph
from ..ops.base import format_shape
from .kernels import HC, N_MIX, check_eps, check_n_iter
from ..vk import Device, default_device
from ..vk.tensor import Tensor, TensorRows

Array = Union[ArrayLike, Tensor, TensorRows]  # numpy-like in → numpy out; a device Tensor in → Tensors out
HostArray = Union[np.ndarray, np.generic, Sequence[Any], float]     # what gives numpy results (overloads)
DeviceArray = Union[Tensor, TensorRows]                             # what gives Tensors (overloads)
Result = Union[np.ndarray, Tensor]
Checked = Union[np.ndarray, Tensor, TensorRows]     # an argument array_arg accepted

_local = threading.local()
_EMPTY = SimpleNamespace(dispatches=0, barriers=0, submits=0, paths=[])


def _check_dims(name, shape, expected):
    if len(shape) != len(expected):
        raise ValueError(f"{name} must have rank {len(expected)} (shape {format_shape(expected)}), got shape {shape}")
    for s, e in zip(shape, expected):
        if e is not None and s != e:
            raise ValueError(f"{name} must have shape {format_shape(expected)}, got {shape}")


_FITS: set[tuple] = set()      # (shape, expected) pairs that passed _check_dims


def array_arg(name: str, a: Any, expected: tuple[int | None, ...]) -> Checked:
    """A float32 device Tensor as given, or `a` as a float32 array; shape `expected` (ints, or None:
    any size; T may be 0, D must be ≥ 1)."""
    if isinstance(a, (Tensor, TensorRows)):            # (rows of a Tensor: Tensor.rows)
        if a.dtype_name == "f32" and (a.shape, expected) in _FITS:      # seen before: the per-call path
            return a
        if a.dtype_name != "f32":
            raise ValueError(f"{name} must be a float32 Tensor, got {a.dtype_name}")
        _check_dims(name, a.shape, expected)
        if len(_FITS) < 4096:
            _FITS.add((a.shape, expected))
        return a
    try:
        arr = np.asarray(a)
    except Exception as e:      # ragged lists and the like
        raise ValueError(f"{name} must be a numeric array, got {type(a).__name__} ({e})") from None
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be a floating-point array (converted to float32) or a float32 Tensor, "
                         f"got dtype {arr.dtype}")
    _check_dims(name, arr.shape, expected)
    return np.ascontiguousarray(arr, dtype=np.float32)


def same(what, *named):
    (n0, v0), *rest = named
    for n, v in rest:
        if v != v0:
            raise ValueError(f"{what} disagrees between {n0} ({v0}) and {n} ({v})")
    return v0


def hidden(name, d):
    if d < 1:
        raise ValueError(f"{name}: hidden size D must be ≥ 1, got {d}")
    return d


def check_device(device):
    """`device` if it is a Device (or None); a clear error for anything else."""
    if device is not None and not isinstance(device, Device):
        raise ValueError(f"device must be a dsv4_vk Device (e.g. dsv4_vk.default_device()) or None, "
                         f"got {type(device).__name__} {device!r}")
    return device


def pick_device(device, *arrays):
    """`device`, else the device of the first Tensor among `arrays`, else the default device; every
    Tensor must live on it."""
    dev = check_device(device)
    for a in arrays:
        if isinstance(a, (Tensor, TensorRows)):
            if dev is None:
                dev = a.device
            elif a.device is not dev:
                raise ValueError(f"a Tensor argument lives on {a.device!r}, the call runs on {dev!r}")
    dev = dev or default_device()
    dev.check_open()
    return dev


def _compile(device, inputs, build):
    g = Graph()
    t = {k: g.input(k, v.shape) for k, v in inputs.items()}
    outs = build(g, t, device)
    for i, o in enumerate(outs if isinstance(outs, tuple) else (outs,)):
        g.output(f"out{i}", o if o.is_contiguous else g.op("CONT", o))   # copied out whole
    return CompiledGraph(device, g)


def _chunk_tokens(device, inputs, out_shapes):
    """Tokens per call so that no per-token array passes maxStorageBufferRange."""
    per_token = max([4 * math.prod(v.shape[1:]) for v in inputs.values()] + [4 * math.prod(s[1:]) for s in out_shapes])
    return max(1, device.caps.limits.max_storage_buffer_range // per_token)


def call(device, key, inputs, out_shapes, build, out=None, per_token=()):
    """Run the cached program `key` (built by build(g, {name: input}, device) → output(s)) on
    `inputs` ({name: array or Tensor}); returns a tuple of arrays, or of Tensors when an input is a
    Tensor or `out` (a tuple of Tensors to write) is given. per_token: names of the inputs whose
    first axis is T (all of them when the op is per-token), so that oversized calls can be split."""
    dev, on_device, shapes = device, out is not None, []
    if dev is not None and dev.__class__ is not Device:
        check_device(dev)
    for v in inputs.values():           # one pass (pick_device inlined): this is the per-call path
        if isinstance(v, _ON_DEVICE):
            on_device = True
            if dev is None:
                dev = v.device
            elif v.device is not dev:
                raise ValueError(f"a Tensor argument lives on {v.device!r}, the call runs on {dev!r}")
        shapes.append(v.shape)
    if out is not None or dev is None:
        dev = pick_device(dev, *(out or ()))
    elif dev._closed:
        dev.check_open()
    key = (*key, tuple(shapes), (generation(), current()))      # key[0]: the op, or the owning site; the
    #                                                             policy and the tuning it was built under
    cg = dev.programs.acquire(key)
    if cg is None:                      # first call of this key (or evicted): sizes checked, then compiled
        if per_token and _oversized(dev, inputs, out_shapes):
            T = out_shapes[0][0]
            chunk = _chunk_tokens(dev, {k: inputs[k] for k in per_token}, out_shapes)
            if T > chunk:
                return _call_in_chunks(dev, key[:-2], inputs, out_shapes, build, out, per_token, on_device, T, chunk)
        cg = _compile(dev, inputs, build)
    try:
        if on_device:                   # into out's tensors; new ones where out or an entry of it is None
            outs = cg.execute_into(inputs, out)
        else:
            names = cg.graph.outputs.keys()
            cg.execute(inputs, None, names)
            outs = tuple(cg.read(k) for k in names)
        _local.last = weakref.ref(cg)   # (weak: a device dropped without close() must stay collectable)
    finally:
        dev.programs.put(key, cg)
    return outs


_ON_DEVICE = (Tensor, TensorRows)


def _oversized(dev, inputs, out_shapes):
    largest = max([v.numel if isinstance(v, _ON_DEVICE) else v.size for v in inputs.values()]
                  + [math.prod(s) for s in out_shapes])
    return 4 * largest > dev.caps.limits.max_storage_buffer_range


def _call_in_chunks(dev, key, inputs, out_shapes, build, out, per_token, on_device, T, chunk):
    """One call per chunk of tokens, each within the device's maxStorageBufferRange."""
    if on_device:
        outs = tuple(out) if out is not None else tuple(dev.empty(s) for s in out_shapes)
        for i in range(0, T, chunk):
            n = min(chunk, T - i)
            part = {k: (_rows(v, i, i + n) if k in per_token else v) for k, v in inputs.items()}
            call(dev, key, part, [(n,) + tuple(s[1:]) for s in out_shapes], build,
                 tuple(o.rows(i, i + n) for o in outs))
        return outs
    parts = [call(dev, key, {k: (v[i:i + chunk] if k in per_token else v) for k, v in inputs.items()},
                  [(min(chunk, T - i),) + tuple(s[1:]) for s in out_shapes], build)
             for i in range(0, T, chunk)]
    return tuple(np.concatenate(p) for p in zip(*parts))


def _rows(v, start, stop):
    return v.rows(start, stop) if isinstance(v, Tensor) else v[start:stop]


def empty_result(device, arrays, out, *shapes):
    """The results of a call with T = 0: no work, but the checks of a call with tokens — the device
    (open, every Tensor on it) and out's shapes; numpy arrays when no argument is a Tensor (the
    device, if given, is still checked; none is opened)."""
    _local.last = None
    if out is None and not any(isinstance(a, _ON_DEVICE) for a in arrays):
        if check_device(device) is not None:
            device.check_open()
        return tuple(np.zeros(s, np.float32) for s in shapes)
    dev = pick_device(device, *arrays, *(out or ()))
    if out is None:
        return tuple(dev.empty(s) for s in shapes)
    for i, (o, s) in enumerate(zip(out, shapes)):
        if o is not None and tuple(o.shape) != tuple(s):
            raise ValueError(f"out[{i}] must have shape {format_shape(s)}, got {tuple(o.shape)}")
    return tuple(dev.empty(s) if o is None else o for o, s in zip(out, shapes))


def _one(outs):
    return outs if len(outs) > 1 else outs[0]


def out_arg(out, n):
    """`out=` of a call with n outputs as a tuple of n Tensors (None: none given), else a clear error."""
    if out is None:
        return None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != n or not all(isinstance(o, Tensor) for o in outs):
        raise ValueError(f"out must be {'a Tensor' if n == 1 else f'a tuple of {n} Tensors'}, got {out!r}")
    return tuple(outs)


def last_run() -> Any:
    """Stats of this thread's last call: .dispatches, .barriers, .submits, .paths [(op, path, reason)];
    None before any call, and once its program is gone (its device closed or collected)."""
    if not hasattr(_local, "last"):
        return None
    if _local.last is None:
        return _EMPTY
    cg = _local.last()
    return None if cg is None else cg.run_stats()


# Each function's overloads: numpy-like arguments give numpy results; a device Tensor first argument
# gives Tensors (so does any Tensor argument, or out=: typed as either).
@overload
def hc_comb(mixes: HostArray, scale: HostArray, base: HostArray, *, eps: float = ..., n_iter: int = ...,
            fused: bool | None = ..., variant: str | None = ..., device: Device | None = ...,
            out: None = ...) -> np.ndarray: ...
@overload
def hc_comb(mixes: DeviceArray, scale: Array, base: Array, *, eps: float = ..., n_iter: int = ...,
            fused: bool | None = ..., variant: str | None = ..., device: Device | None = ...,
            out: Tensor | None = ...) -> Tensor: ...
@overload
def hc_comb(mixes: Array, scale: Array, base: Array, *, eps: float = ..., n_iter: int = ...,
            fused: bool | None = ..., variant: str | None = ..., device: Device | None = ...,
            out: Tensor | None = ...) -> Result: ...


def hc_comb(mixes: Array, scale: Array, base: Array, *, eps: float = 1e-6, n_iter: int = 20,
            fused: bool | None = None, variant: str | None = None, device: Device | None = None,
            out: Tensor | None = None) -> Result:
    """comb [T,4,4] (comb[t, src, dst]) from mixes [T,24], scale [3], base [24]."""
    mixes = array_arg("mixes", mixes, (None, N_MIX))
    scale = array_arg("scale", scale, (3,))
    base = array_arg("base", base, (N_MIX,))
    eps, n_iter = check_eps("eps", eps), check_n_iter(n_iter)
    hc_policy.check_override("HC_COMB", fused, variant)
    out, T = out_arg(out, 1), mixes.shape[0]
    if T == 0:
        return _one(empty_result(device, (mixes, scale, base), out, (0, HC, HC)))
    return _one(call(device, ("hc_comb", eps, n_iter, fused, variant), {"mixes": mixes, "scale": scale, "base": base},
                     [(T, HC, HC)],
                     lambda g, t, dev: hc.comb(g, t["mixes"], t["scale"], t["base"], eps=eps, n_iter=n_iter,
                                               fused=fused, variant=variant, device=dev), out, ("mixes",)))


@overload
def hc_pre(x: HostArray, weights: HostArray, *, fused: bool | None = ..., device: Device | None = ...,
           out: None = ...) -> np.ndarray: ...
@overload
def hc_pre(x: DeviceArray, weights: Array, *, fused: bool | None = ..., device: Device | None = ...,
           out: Tensor | None = ...) -> Tensor: ...
@overload
def hc_pre(x: Array, weights: Array, *, fused: bool | None = ..., device: Device | None = ...,
           out: Tensor | None = ...) -> Result: ...


def hc_pre(x: Array, weights: Array, *, fused: bool | None = None, device: Device | None = None,
           out: Tensor | None = None) -> Result:
    """u [T,D] = Σ_s weights[t,s]·x[t,s,:] for x [T,4,D], weights [T,4]."""
    x = array_arg("x", x, (None, HC, None))
    weights = array_arg("weights", weights, (None, HC))
    T = x.shape[0]
    if weights.shape[0] != T:
        same("T (tokens)", ("x", T), ("weights", weights.shape[0]))     # raises, naming both
    D = hidden("x", x.shape[2])
    hc_policy.check_override("HC_PRE", fused)
    out = out_arg(out, 1)
    if T == 0:
        return _one(empty_result(device, (x, weights), out, (0, D)))
    return _one(call(device, ("hc_pre", fused), {"x": x, "weights": weights}, [(T, D)],
                     lambda g, t, dev: hc.pre(g, t["x"], t["weights"], fused=fused, device=dev), out,
                     ("x", "weights")))


_POST_FITS: set = set()  # (f, residual, post, comb) shapes of float32 Tensors with T ≥ 1 that passed hc_post's
#                        checks: one lookup instead of four array_arg calls and the T / D comparisons


def known_args(memo, a, b, c, d):
    """Whether a..d are float32 Tensors whose shapes together passed a call's checks before (a key of
    memo): the per-call path of hc_post and HcSite.post(next=) then skips those checks."""
    return a.__class__ is Tensor and b.__class__ is Tensor and c.__class__ is Tensor and d.__class__ is Tensor \
        and a.dtype_name == b.dtype_name == c.dtype_name == d.dtype_name == "f32" \
        and (a.shape, b.shape, c.shape, d.shape) in memo


def remember_args(memo, limit, a, b, c, d):
    """After a..d passed the checks: their shapes into memo (at most `limit` entries), if all are Tensors."""
    if len(memo) < limit and all(t.__class__ is Tensor for t in (a, b, c, d)):
        memo.add((a.shape, b.shape, c.shape, d.shape))


@overload
def hc_post(f: HostArray, residual: HostArray, post: HostArray, comb: HostArray, *, fused: bool | None = ...,
            device: Device | None = ..., out: None = ...) -> np.ndarray: ...
@overload
def hc_post(f: DeviceArray, residual: Array, post: Array, comb: Array, *, fused: bool | None = ...,
            device: Device | None = ..., out: Tensor | None = ...) -> Tensor: ...
@overload
def hc_post(f: Array, residual: Array, post: Array, comb: Array, *, fused: bool | None = ...,
            device: Device | None = ..., out: Tensor | None = ...) -> Result: ...


def hc_post(f: Array, residual: Array, post: Array, comb: Array, *, fused: bool | None = None,
            device: Device | None = None, out: Tensor | None = None) -> Result:
    """X_new [T,4,D] = f·post[:, d] + Σ_s comb[:, s, d]·residual[:, s] for each destination d."""
    if known_args(_POST_FITS, f, residual, post, comb):
        T, D = cast(Tensor, f).shape    # the per-call path: four float32 Tensors whose shapes passed the checks below
    else:
        f = array_arg("f", f, (None, None))
        residual = array_arg("residual", residual, (None, HC, None))
        post = array_arg("post", post, (None, HC))
        comb = array_arg("comb", comb, (None, HC, HC))
        T, D = f.shape
        if not residual.shape[0] == post.shape[0] == comb.shape[0] == T or residual.shape[2] != D:   # raise, naming
            same("T (tokens)", ("f", T), ("residual", residual.shape[0]), ("post", post.shape[0]),     # them
                 ("comb", comb.shape[0]))
            same("D (hidden size)", ("f", D), ("residual", residual.shape[2]))
        hidden("f", D)
        if T:
            remember_args(_POST_FITS, 4096, f, residual, post, comb)
    if fused is not None:       # (with fused=None and no variant there is nothing to check)
        hc_policy.check_override("HC_POST", fused)
    if out is not None:
        out = out_arg(out, 1)
    if T == 0:
        return _one(empty_result(device, (f, residual, post, comb), out, (0, HC, D)))
    return call(device, ("hc_post", fused), {"f": f, "residual": residual, "post": post, "comb": comb},
                [(T, HC, D)], lambda g, t, dev: hc.post(g, t["f"], t["residual"], t["post"], t["comb"], fused=fused,
                                                      device=dev), out, _POST_INPUTS)[0]


_POST_INPUTS = ("f", "residual", "post", "comb")     # (hc_post's per-token inputs: all of them)


@overload
def hc_site_pre(X: HostArray, fn: HostArray, scale: HostArray, base: HostArray, *, hc_eps: float = ...,
                norm_eps: float = ..., n_iter: int = ..., fused: bool | None = ..., device: Device | None = ...,
                out: None = ...) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
@overload
def hc_site_pre(X: DeviceArray, fn: Array, scale: Array, base: Array, *, hc_eps: float = ...,
                norm_eps: float = ..., n_iter: int = ..., fused: bool | None = ..., device: Device | None = ...,
                out: tuple[Tensor, Tensor, Tensor] | None = ...) -> tuple[Tensor, Tensor, Tensor]: ...
@overload
def hc_site_pre(X: Array, fn: Array, scale: Array, base: Array, *, hc_eps: float = ...,
                norm_eps: float = ..., n_iter: int = ..., fused: bool | None = ..., device: Device | None = ...,
                out: tuple[Tensor, Tensor, Tensor] | None = ...) -> tuple[Result, Result, Result]: ...


def hc_site_pre(X: Array, fn: Array, scale: Array, base: Array, *, hc_eps: float = 1e-6, norm_eps: float = 1e-6,
                n_iter: int = 20, fused: bool | None = None, device: Device | None = None,
                out: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple[Result, Result, Result]:
    """One site's pre side: (u [T,D], post [T,4], comb [T,4,4]) from X [T,4,D], fn [24,4D], scale, base.
    Calling it in a loop uploads fn every time: keep the weights on the device with HcSite instead."""
    X = array_arg("X", X, (None, HC, None))
    D = hidden("X", X.shape[2])
    fn = array_arg("fn", fn, (N_MIX, HC * D))
    scale = array_arg("scale", scale, (3,))
    base = array_arg("base", base, (N_MIX,))
    hc_eps, norm_eps, n_iter = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps), check_n_iter(n_iter)
    hc_policy.check_override("HC_COMB", fused)
    out, T = out_arg(out, 3), X.shape[0]
    if T == 0:
        return empty_result(device, (X, fn, scale, base), out, (0, D), (0, HC), (0, HC, HC))
    return call(device, ("hc_site_pre", hc_eps, norm_eps, n_iter, fused),
                {"X": X, "fn": fn, "scale": scale, "base": base}, [(T, D), (T, HC), (T, HC, HC)],
                lambda g, t, dev: hc.site_pre(g, t["X"], t["fn"], t["scale"], t["base"], hc_eps=hc_eps,
                                              norm_eps=norm_eps, n_iter=n_iter, fused=fused, device=dev), out, ("X",))
