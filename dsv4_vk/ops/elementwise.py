"""Elementwise primitives: ADD, MUL, DIV (numpy broadcasting), SCALE, SIGMOID, EXP, CONT, FILL.

All of them run `binary.comp` or `unary.comp` over 4-D strided views, so any view (transposed,
sliced, broadcast) is read in place and any view can be written (`out=`).
"""
from typing import Any, Callable

import numpy as np

from .base import (Launch, OpDef, broadcast_shapes, check_finite, grid_1d, register, shape_fields, tensor_fields,
                   view_fields)


def _nonempty(op, *tensors):
    for i, t in enumerate(tensors):
        if t.numel == 0:
            raise ValueError(f"{op}: input {i} is empty (shape {t.shape}); expected at least one element")


class _Binary(OpDef):
    n_inputs = 2
    define: str                 # (each op sets it: the shader's define)
    fn: Callable[..., Any]      # the numpy ufunc of the reference

    def infer(self, inputs, params):
        a, b = inputs
        _nonempty(self.name, a, b)
        return broadcast_shapes(self.name, a.shape, b.shape), "f32"

    def lower(self, node, device):
        out = node.output
        a, b = (t.broadcast_to(out.shape) for t in node.inputs)
        push = {**shape_fields(out), **tensor_fields("a", a), **tensor_fields("b", b), **tensor_fields("d", out)}
        return [Launch("binary", [a, b, out], (2,), push, grid_1d(out.numel),
                       defines={self.define: 1})]

    def reference(self, a, b):
        return type(self).fn(np.asarray(a, np.float64), np.asarray(b, np.float64))


@register
class Add(_Binary):
    name, define, fn = "ADD", "OP_ADD", np.add


@register
class Mul(_Binary):
    name, define, fn = "MUL", "OP_MUL", np.multiply


@register
class Div(_Binary):
    name, define, fn = "DIV", "OP_DIV", np.divide


def unary_launch(define, a, out, s=0.0, t=0.0):
    """Launch of unary.comp (a may be None for FILL)."""
    push = {**shape_fields(out), **(tensor_fields("a", a) if a is not None else view_fields("a", 0, [0] * 4)),
            **tensor_fields("d", out), "s": float(s), "t": float(t)}
    args = [a, out] if a is not None else [out]
    return Launch("unary", args, (len(args) - 1,), push, grid_1d(out.numel), defines={define: 1})


class _Unary(OpDef):
    n_inputs = 1
    define: str                 # (each op sets it: the shader's define)
    params: tuple[str, ...] = ()

    def infer(self, inputs, params):
        _nonempty(self.name, *inputs)
        extra = set(params) - set(self.params)
        if extra:
            raise ValueError(f"{self.name}: unknown parameter(s) {sorted(extra)}; accepted: {list(self.params)}")
        return inputs[0].shape, "f32"

    def lower(self, node, device):
        return [unary_launch(self.define, node.inputs[0], node.output)]


@register
class Scale(_Unary):
    """x·a + b."""
    name, define, params = "SCALE", "OP_SCALE", ("a", "b")

    def infer(self, inputs, params):
        check_finite("SCALE parameter a", params.get("a", 1.0))
        check_finite("SCALE parameter b", params.get("b", 0.0))
        return super().infer(inputs, params)

    def lower(self, node, device):
        p = node.params
        return [unary_launch(self.define, node.inputs[0], node.output, p.get("a", 1.0), p.get("b", 0.0))]

    def reference(self, x, a=1.0, b=0.0):
        return np.asarray(x, np.float64) * a + b


@register
class Sigmoid(_Unary):
    name, define = "SIGMOID", "OP_SIGMOID"

    def reference(self, x):
        return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


@register
class Exp(_Unary):
    name, define = "EXP", "OP_EXP"

    def reference(self, x):
        return np.exp(np.asarray(x, np.float64))


@register
class Cont(_Unary):
    """Materialise any strided view (transposes included) as a contiguous tensor."""
    name, define = "CONT", "OP_COPY"
    dtypes = ("f32", "i32")

    def infer(self, inputs, params):
        shape, _ = super().infer(inputs, params)
        return shape, inputs[0].dtype

    def reference(self, x):
        return np.ascontiguousarray(x)


@register
class Fill(OpDef):
    """A new tensor of `shape` filled with `value` (or, with out=, fill a view)."""
    name, n_inputs = "FILL", 0

    def infer(self, inputs, params):
        if "shape" not in params:
            raise ValueError("FILL needs shape=(...)")
        shape = tuple(int(s) for s in params["shape"])
        if not shape or min(shape) < 1:
            raise ValueError(f"FILL: shape {shape} must have at least one element")
        check_finite("FILL value", params.get("value", 0.0))
        return shape, "f32"

    def lower(self, node, device):
        return [unary_launch("OP_FILL", None, node.output, node.params.get("value", 0.0))]

    def reference(self, shape, value=0.0):
        return np.full(shape, value, np.float64)
