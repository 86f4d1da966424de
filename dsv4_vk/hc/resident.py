"""Resident hyper-connection sites: the weights of a site (or of the head collapse) uploaded once,
its programs compiled once per (op, shapes) and kept in the device's program cache.

    site = HcSite(fn, scale, base, hc_eps=1e-6, norm_eps=1e-6, n_iter=20, device=dev)
    u, post, comb = site.pre(X)             # X: a Tensor [T,4,D] on dev → Tensors (numpy → numpy)
    X_new = site.post(f, X, post, comb)     # [T,4,D]
    head = HcSite.head(fn_h, scale_h, base_h, device=dev)
    u = head.collapse(X)                    # [T,D]

Chained sites: `X_new, carry = site.post(f, X, post, comb, next=site2)` also computes site2's mixes
partials in the same pass (HC_POST_MIX: on the site path at T ≤ CARRY_MAX_T, and past it where the
prefill carry runs, hc.carries), and `site2.pre(X_new, carry=carry)` (or `head.collapse(X_new,
carry=carry)`) starts from them: at decode a site is then two dispatches. `pre_graph` /
`post_graph` / `collapse_graph` append the same nodes to a Graph of your own (the weights bound in
place, `mix=` / `next=` for the carry), to put whole steps into one program (docs/library.md).
"""
from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, cast, overload

import numpy as np

from . import composite as hc, policy as hc_policy
from .api import (Array, DeviceArray, HostArray, Result, array_arg, call, empty_result, hc_post, hidden, known_args,
                  out_arg, pick_device, remember_args)
from .kernels import HC, N_MIX, check_eps, check_n_iter
from .policy import generation
from ..core.tuning import current
from ..vk.tensor import Tensor

if TYPE_CHECKING:
    from ..core.graph import Graph
    from ..core.tensor import GraphTensor
    from ..vk import Device

Arrays3 = tuple[np.ndarray, np.ndarray, np.ndarray]     # (u, post, comb) of a numpy X
Tensors3 = tuple[Tensor, Tensor, Tensor]                # ... of a Tensor X
Results3 = tuple[Result, Result, Result]

_owners = itertools.count(1)


def _resident(dev, name, a, expected):
    a = array_arg(name, a, expected)
    return a if isinstance(a, Tensor) else dev.tensor(a)


class _Resident:
    """Weights on a device and a token naming this object's entries in the program cache."""
    D: int                  # the hidden size (each subclass sets it from its fn)

    def __init__(self, device, fused, *arrays):
        self.device = pick_device(device, *arrays)
        hc_policy.check_override("HC_COMB", fused)
        self.fused = fused
        self._owner = ("hc-site", next(_owners))
        # the cached programs bind this object's weights: drop them when it goes away
        weakref.finalize(self, _drop, weakref.ref(self.device), self._owner)

    def __repr__(self) -> str:
        # never raises: also on a closed device, or for an object whose construction failed half-way
        dev = getattr(self, "device", None)
        fields = [f"D={getattr(self, 'D', '?')}"] + [f"{k}={getattr(self, k)}" for k in ("hc_eps", "norm_eps", "n_iter")
                                                     if hasattr(self, k)]
        fields.append(f"fused={getattr(self, 'fused', '?')}")
        state = ", device closed" if getattr(dev, "_closed", False) else ""
        return (f"<dsv4_vk.{type(self).__name__} {' '.join(fields)} on Device #{getattr(dev, 'serial', '?')} "
                f"{getattr(getattr(dev, 'caps', None), 'name', '?')!r}{state}>")

    def _x(self, X):
        X = array_arg("X", X, (None, HC, self.D))
        return X, X.shape[0]

    def _carry(self, carry, X, T):
        """The partials of a MixCarry made for this object and this X (None: no carry)."""
        if carry is None:
            return None
        if not isinstance(carry, MixCarry):
            raise ValueError(f"carry must be the MixCarry a post(..., next=) returned, got {type(carry).__name__}")
        if carry.partials is None:
            return None
        if carry.target is not self:
            raise ValueError("carry was computed for another site: pass it to the site given as next=")
        if carry.partials.shape[0] != T:
            raise ValueError(f"carry holds {carry.partials.shape[0]} token(s), X has {T}")
        if carry.source is None:                # made by hand: its layout is what a post would have made
            want = (T, hc.carry_splits(T, self.D), (N_MIX if isinstance(self, HcSite) else HC) + 1)
            if tuple(carry.partials.shape) != want:
                raise ValueError(f"carry.partials has shape {tuple(carry.partials.shape)}, expected {want}: [T, "
                                 f"D splits, mixes + 1] as post(..., next=) computes them at T = {T}, D = {self.D} "
                                 "(hc.composite.carry_splits)")
        if carry.source is not None and X is not carry.source:     # (a MixCarry made by hand names no X)
            # the partials are X_new's mixes: with any other X (even of the same shape) they would be wrong
            raise ValueError("carry belongs to the X_new its post(..., next=) returned: pass that tensor as X "
                             "(without the carry, pre computes the mixes of any X itself)")
        return carry.partials

    def _run_pre(self, name, X, T, carry, out, out_shapes, build):
        """call() of this object's pre-side program, with the carried partials as an input when given."""
        mix = self._carry(carry, X, T)
        if mix is None:
            return call(self.device, (self._owner, name), {"X": X}, out_shapes,
                        lambda g, t, dev: build(g, t["X"], None), out, ("X",))
        return call(self.device, (self._owner, name, "carried"), {"X": X, "mix": mix}, out_shapes,
                    lambda g, t, dev: build(g, t["X"], t["mix"]), out, ("X", "mix"))


class MixCarry:
    """The next site's mixes partials, computed by `site.post(..., next=)` in the same pass as the new
    streams: give it to that site's `pre(X_new, carry=)` (or the head's `collapse`). `partials` is
    None where nothing was carried (hc.carries: the three-op path at decode; past CARRY_MAX_T tokens
    a device without the prefill carry's kernels): the next pre then computes its mixes itself.
    `source` is the X_new the post returned with it: pre refuses the carry with any other X."""

    __slots__ = ("target", "partials", "source")

    def __init__(self, target: HcSite | HcHead, partials: Result | None, source: Result | None = None):
        self.target, self.partials, self.source = target, partials, source    # source: the X_new they belong to

    def __repr__(self):
        what = "nothing" if self.partials is None else f"partials {tuple(self.partials.shape)}"
        return f"<MixCarry of {what} for {type(self.target).__name__}>"


def _drop(device_ref, owner):
    dev = device_ref()
    if dev is not None and not dev.closed:
        dev.programs.drop_later(owner)


class HcSite(_Resident):
    """One hyper-connection site with fn [24,4D], scale [3], base [24] resident on `device`."""

    def __init__(self, fn: Array, scale: Array, base: Array, *, hc_eps: float = 1e-6, norm_eps: float = 1e-6,
                 n_iter: int = 20, device: Device | None = None, fused: bool | None = None):
        super().__init__(device, fused, fn, scale, base)
        fn_shape = fn.shape if isinstance(fn, Tensor) else getattr(fn, "shape", None)
        if fn_shape is None or len(fn_shape) != 2 or fn_shape[1] % HC or fn_shape[1] == 0:
            raise ValueError(f"fn must have shape [24, 4*D] with D ≥ 1, got {fn_shape}")
        self.D = hidden("fn", fn_shape[1] // HC)
        dev = self.device
        self.fn = _resident(dev, "fn", fn, (N_MIX, HC * self.D))
        self.scale = _resident(dev, "scale", scale, (3,))
        self.base = _resident(dev, "base", base, (N_MIX,))
        self.hc_eps, self.norm_eps = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps)
        self.n_iter = check_n_iter(n_iter)
        self._carry_memo: tuple[tuple | None, dict[int, bool]] = (None, {})   # ((policy generation, tuning), {T: carries})
        self._post_fits: set[tuple] = set()  # (X, f, post, comb) shapes of float32 Tensors that passed post(next=)'s
        #                                     checks (T ≥ 1): one lookup instead of four array_arg calls

    @classmethod
    def head(cls, fn_h: Array, scale_h: Array, base_h: Array, *, hc_eps: float = 1e-6, norm_eps: float = 1e-6,
             device: Device | None = None, fused: bool | None = None) -> "HcHead":
        """The head collapse (fn_h [4,4D], scale_h [1], base_h [4]) with its weights resident."""
        return HcHead(fn_h, scale_h, base_h, hc_eps=hc_eps, norm_eps=norm_eps, device=device, fused=fused)

    def pre_graph(self, g: Graph, X: GraphTensor,
                  mix: GraphTensor | None = None) -> tuple[GraphTensor, GraphTensor, GraphTensor]:
        """Append this site's pre side to graph g: (u, post, comb) graph tensors. mix: the partials a
        previous post_graph(..., next=this site) returned."""
        return hc.site_pre(g, X, g.bind(self.fn, "fn"), g.bind(self.scale, "scale"), g.bind(self.base, "base"),
                           hc_eps=self.hc_eps, norm_eps=self.norm_eps, n_iter=self.n_iter, fused=self.fused,
                           device=self.device, mix=mix)

    @overload
    def post_graph(self, g: Graph, f: GraphTensor, X: GraphTensor, post: GraphTensor, comb: GraphTensor,
                   next: None = ...) -> GraphTensor: ...
    @overload
    def post_graph(self, g: Graph, f: GraphTensor, X: GraphTensor, post: GraphTensor, comb: GraphTensor,
                   next: HcSite | HcHead) -> tuple[GraphTensor, GraphTensor | None]: ...

    def post_graph(self, g: Graph, f: GraphTensor, X: GraphTensor, post: GraphTensor, comb: GraphTensor,
                   next: HcSite | HcHead | None = None) -> GraphTensor | tuple[GraphTensor, GraphTensor | None]:
        """Append this site's post side to graph g: X_new [T,4,D]; with `next` (the next HcSite or the
        HcHead) (X_new, partials or None) — the partials for next.pre_graph / collapse_graph's mix=."""
        if next is None:
            return hc.post(g, f, X, post, comb, fused=self.fused, device=self.device)
        self._check_next(next)
        return hc.site_post(g, f, X, post, comb, next_fn=g.bind(next.fn, "next_fn"), fused=self.fused,
                            device=self.device)

    def _carries(self, T):
        """hc.carries for this site at T tokens, remembered per policy generation and tuning up to CARRY_MAX_T (the
        per-call decode path); past it asked each call (the answer depends on T there: TCR's mixes)."""
        if T > hc.CARRY_MAX_T:
            return hc.carries(self.device, self.fused, T, self.D)
        gen, memo = self._carry_memo
        if gen != (generation(), current()):
            gen, memo = self._carry_memo = ((generation(), current()), {})
        hit = memo.get(T)
        if hit is None:
            hit = memo[T] = hc.carries(self.device, self.fused, T, self.D)
        return hit

    def _check_next(self, next):
        if not isinstance(next, _Resident):
            raise ValueError(f"next must be an HcSite or HcHead, got {type(next).__name__}")
        if next.device is not self.device or next.D != self.D:
            raise ValueError(f"next must live on the same device with the same D ({self.D}), got D = {next.D} "
                             f"on {next.device!r}")

    @overload
    def pre(self, X: HostArray, *, carry: MixCarry | None = ..., out: None = ...) -> Arrays3: ...
    @overload
    def pre(self, X: DeviceArray, *, carry: MixCarry | None = ..., out: Tensors3 | None = ...) -> Tensors3:
        ...
    @overload
    def pre(self, X: Array, *, carry: MixCarry | None = ..., out: Tensors3 | None = ...) -> Results3: ...

    def pre(self, X: Array, *, carry: MixCarry | None = None, out: Tensors3 | None = None) -> Results3:
        """(u [T,D], post [T,4], comb [T,4,4]) from the streams X [T,4,D]: Tensors for a Tensor X
        (or with out=(u, post, comb)), numpy arrays for a numpy X. carry: what the previous site's
        post(..., next=this site) returned, for X its output."""
        X, T = self._x(X)
        out = out_arg(out, 3)
        if T == 0:
            return empty_result(self.device, (X,), out, (0, self.D), (0, HC), (0, HC, HC))
        return self._run_pre("pre", X, T, carry, out, [(T, self.D), (T, HC), (T, HC, HC)], self.pre_graph)

    # overloads: numpy-like arguments give numpy arrays, a Tensor X gives Tensors; next= adds the MixCarry
    @overload
    def post(self, f: HostArray, X: HostArray, post: HostArray, comb: HostArray, *, next: None = ...,
             out: None = ...) -> np.ndarray: ...
    @overload
    def post(self, f: Array, X: DeviceArray, post: Array, comb: Array, *, next: None = ...,
             out: Tensor | None = ...) -> Tensor: ...
    @overload
    def post(self, f: HostArray, X: HostArray, post: HostArray, comb: HostArray, *, next: HcSite | HcHead,
             out: None = ...) -> tuple[np.ndarray, MixCarry]: ...
    @overload
    def post(self, f: Array, X: DeviceArray, post: Array, comb: Array, *, next: HcSite | HcHead,
             out: Tensor | None = ...) -> tuple[Tensor, MixCarry]: ...
    @overload
    def post(self, f: Array, X: Array, post: Array, comb: Array, *, next: HcSite | HcHead | None = ...,
             out: Tensor | None = ...) -> Result | tuple[Result, MixCarry]: ...

    def post(self, f: Array, X: Array, post: Array, comb: Array, *, next: HcSite | HcHead | None = None,
             out: Tensor | None = None) -> Result | tuple[Result, MixCarry]:
        """X_new [T,4,D] = f·post[:, d] + Σ_s comb[:, s, d]·X[:, s] (HC_POST, this site's path).
        With `next` (the next HcSite, or the HcHead): (X_new, MixCarry) — where hc.carries (the site
        kernels at T ≤ CARRY_MAX_T, the prefill carry past it), next's mixes partials are computed
        in the same pass. An X past the device's maxStorageBufferRange is posted in chunks of tokens
        as hc_post does, with nothing carried (carry.partials None: next's pre computes its mixes)."""
        if next is None:
            return hc_post(f, X, post, comb, fused=self.fused, device=self.device, out=out)
        self._check_next(next)
        if known_args(self._post_fits, X, f, post, comb) and self._carries(T := cast(Tensor, X).shape[0]):
            pass                # the per-call path: float32 Tensors whose shapes passed the checks below
        else:                   # (also where nothing is carried: handed to hc_post below)
            X, T = self._x(X)
            # past the binding limit hc_post runs in chunks of tokens, carrying nothing: a carry's partials
            # are laid out for all T tokens at once (their kernel's split depends on T)
            if T == 0 or not self._carries(T) or 4 * T * HC * self.D > self.device.caps.limits.max_storage_buffer_range:
                return hc_post(f, X, post, comb, fused=self.fused, device=self.device, out=out), MixCarry(next, None)
            f = array_arg("f", f, (T, self.D))
            post = array_arg("post", post, (T, HC))
            comb = array_arg("comb", comb, (T, HC, HC))
            remember_args(self._post_fits, 64, X, f, post, comb)
        if out is not None and not isinstance(out, Tensor):
            raise ValueError(f"out must be a Tensor, got {out!r}")
        outs = call(self.device, (self._owner, "post", next._owner), {"f": f, "X": X, "post": post, "comb": comb},
                    [(T, HC, self.D)],
                    lambda g, t, dev: self.post_graph(g, t["f"], t["X"], t["post"], t["comb"], next=next),
                    None if out is None else (out, None), ())
        return outs[0], MixCarry(next, outs[1], outs[0])


class HcHead(_Resident):
    """The head collapse: u = Σ_s pre_h[t,s]·X[t,s,:] with fn_h [4,4D], scale_h [1], base_h [4] resident."""

    def __init__(self, fn_h: Array, scale_h: Array, base_h: Array, *, hc_eps: float = 1e-6, norm_eps: float = 1e-6,
                 device: Device | None = None, fused: bool | None = None):
        super().__init__(device, fused, fn_h, scale_h, base_h)
        fn_shape = fn_h.shape if isinstance(fn_h, Tensor) else getattr(fn_h, "shape", None)
        if fn_shape is None or len(fn_shape) != 2 or fn_shape[1] % HC or fn_shape[1] == 0:
            raise ValueError(f"fn_h must have shape [4, 4*D] with D ≥ 1, got {fn_shape}")
        self.D = hidden("fn_h", fn_shape[1] // HC)
        dev = self.device
        self.fn = _resident(dev, "fn_h", fn_h, (HC, HC * self.D))
        self.scale = _resident(dev, "scale_h", scale_h, (1,))
        self.base = _resident(dev, "base_h", base_h, (HC,))
        self.hc_eps, self.norm_eps = check_eps("hc_eps", hc_eps), check_eps("norm_eps", norm_eps)

    def collapse_graph(self, g: Graph, X: GraphTensor, mix: GraphTensor | None = None) -> GraphTensor:
        """Append the head collapse to graph g: u [T,D]. mix: the partials a last site's
        post_graph(..., next=this head) returned."""
        return hc.head_pre(g, X, g.bind(self.fn, "fn_h"), g.bind(self.scale, "scale_h"), g.bind(self.base, "base_h"),
                           hc_eps=self.hc_eps, norm_eps=self.norm_eps, fused=self.fused, device=self.device,
                           mix=mix)

    @overload
    def collapse(self, X: HostArray, *, carry: MixCarry | None = ..., out: None = ...) -> np.ndarray: ...
    @overload
    def collapse(self, X: DeviceArray, *, carry: MixCarry | None = ..., out: Tensor | None = ...) -> Tensor: ...
    @overload
    def collapse(self, X: Array, *, carry: MixCarry | None = ..., out: Tensor | None = ...) -> Result: ...

    def collapse(self, X: Array, *, carry: MixCarry | None = None, out: Tensor | None = None) -> Result:
        """u [T,D] from the streams X [T,4,D] (Tensor → Tensor, numpy → numpy); carry as for HcSite.pre."""
        X, T = self._x(X)
        out = out_arg(out, 1)
        if T == 0:
            return empty_result(self.device, (X,), out, (0, self.D))[0]
        return self._run_pre("collapse", X, T, carry, out, [(T, self.D)], self.collapse_graph)[0]
