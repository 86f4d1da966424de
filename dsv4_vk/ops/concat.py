"""CONCAT(x0, x1[, x2[, x3]], axis=k): np.concatenate of 2..4 strided views, one dispatch."""
import numpy as np

from .base import Launch, OpDef, check_params, grid_1d, nonempty, register, shape_fields, tensor_fields, tensor_push

MAX_INPUTS = 4


@register
class Concat(OpDef):
    name, n_inputs = "CONCAT", None

    def infer(self, inputs, params):
        if not 2 <= len(inputs) <= MAX_INPUTS:
            raise ValueError(f"CONCAT takes 2 to {MAX_INPUTS} input tensors, got {len(inputs)}")
        nonempty(self.name, inputs)
        check_params(self.name, params, ("axis",))
        ref = inputs[0]
        axis = self._axis(ref.ndim, params)
        for i, t in enumerate(inputs[1:], 1):
            if t.ndim != ref.ndim:
                raise ValueError(f"CONCAT: input {i} has {t.ndim} dimensions (shape {t.shape}), "
                                 f"input 0 has {ref.ndim} (shape {ref.shape})")
            for dim, (a, b) in enumerate(zip(ref.shape, t.shape)):
                if dim != axis and a != b:
                    raise ValueError(f"CONCAT: input {i} has size {b} in dim {dim}, input 0 has {a} "
                                     f"(shapes must agree except along axis {axis})")
        shape = list(ref.shape)
        shape[axis] = sum(t.shape[axis] for t in inputs)
        return tuple(shape), "f32"

    @staticmethod
    def _axis(ndim, params):
        if "axis" not in params:
            raise ValueError("CONCAT needs axis=<int>")
        axis = params["axis"]
        if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
            raise ValueError(f"CONCAT axis must be an int in [{-ndim}, {ndim}), got {axis!r}")
        return int(axis) % ndim

    def lower(self, node, device):
        out, inputs = node.output, node.inputs
        axis = self._axis(out.ndim, node.params)
        bounds = list(np.cumsum([t.shape[axis] for t in inputs])[:-1]) + [0xFFFFFFFF] * (MAX_INPUTS - len(inputs))
        src = []
        for t in inputs:
            src += tensor_push(t)
        src += [0] * (5 * MAX_INPUTS - len(src))
        push = {**shape_fields(out), **tensor_fields("d", out), **dict(zip(("b1", "b2", "b3"), bounds)), "src": src}
        padded_axis = axis + 4 - out.ndim
        return [Launch("concat", [*inputs, out], (len(inputs),), push, grid_1d(out.numel),
                       defines={"N_INPUTS": len(inputs)}, spec=(256, padded_axis))]

    def reference(self, *arrays, axis):
        return np.concatenate([np.asarray(a, np.float64) for a in arrays], axis=axis)
