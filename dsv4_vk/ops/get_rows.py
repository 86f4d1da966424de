"""GET_ROWS(table[V, D] f32 / bf16 / f16, ids[N] i32) -> [N, D] f32: embedding lookup.

An id outside [0, V) reads nothing out of bounds: its output row is NaN, so a bad token id shows up
in the result instead of reading another allocation.
"""
import numpy as np

from .base import Launch, OpDef, check_params, grid_1d, nonempty, register, view_fields, weight_defines


@register
class GetRows(OpDef):
    """table[ids]; rows of out-of-range ids are NaN."""
    name, n_inputs = "GET_ROWS", 2
    dtypes = ("f32", "i32", "bf16", "f16")

    def infer(self, inputs, params):
        table, ids = inputs
        nonempty(self.name, inputs)
        check_params(self.name, params, ())
        if table.dtype not in ("f32", "bf16", "f16") or table.ndim != 2:
            raise ValueError(f"GET_ROWS: input 0 (table) is {table.shape} {table.dtype}; expected a 2-D f32, bf16 "
                             "or f16 [V, D]")
        if ids.dtype != "i32" or ids.ndim != 1:
            raise ValueError(f"GET_ROWS: input 1 (ids) is {ids.shape} {ids.dtype}; expected a 1-D i32 [N]")
        return (ids.shape[0], table.shape[1]), "f32"

    def lower(self, node, device):
        (table, ids), out = node.inputs, node.output
        push = {"n_rows": out.shape[0], "n_cols": out.shape[1], "n_vocab": table.shape[0],
                **view_fields("t", table.offset, table.strides), **view_fields("i", ids.offset, ids.strides, ("s",)),
                **view_fields("d", out.offset, out.strides)}
        return [Launch("get_rows", [table, ids, out], (2,), push,
                       grid_1d(out.numel), defines=weight_defines(table))]

    def reference(self, table, ids):
        table, ids = np.asarray(table, np.float64), np.asarray(ids)
        ok = (ids >= 0) & (ids < table.shape[0])
        out = np.full((ids.shape[0], table.shape[1]), np.nan)
        out[ok] = table[ids[ok]]
        return out
