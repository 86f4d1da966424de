"""STORE_AT: results stored at a device-side position, which then advances — what lets one command
buffer hold K repetitions of a graph that differ only by a counter on the device (multi-step
decode: `CompiledGraph(..., repeat=K)`, core/executor.py).

    g.op("STORE_AT", token, pos, history, out=history, advance=1)   # history[pos] = token; pos += 1

Works on i32 or f32 words alike (a bit copy). Positions outside dst are skipped, never written.
"""
import numpy as np

from .base import Launch, OpDef, check_in_place, check_params, nonempty, register, view_fields


@register
class StoreAt(OpDef):
    """STORE_AT(src [n], index [1] i32, dst [N], advance=0) -> dst (out=dst: written in place):
    dst[index + i] = src[i], then index += advance on the device."""
    name, n_inputs = "STORE_AT", 3
    dtypes = ("f32", "i32")
    written_inputs = (1,)          # the index, when advance ≠ 0
    WORKGROUP = 64

    def infer(self, inputs, params):
        src, index, dst = inputs
        nonempty(self.name, inputs)
        check_params(self.name, params, ("advance",))
        adv = params.get("advance", 0)
        if isinstance(adv, bool) or not isinstance(adv, (int, np.integer)) or not -2**31 <= adv < 2**31:
            raise ValueError(f"{self.name}: advance must be a 32-bit integer, got {adv!r}")
        if src.ndim != 1 or dst.ndim != 1 or src.dtype != dst.dtype:
            raise ValueError(f"{self.name}: src and dst must be 1-D of one dtype, got {src.dtype} {list(src.shape)} and "
                             f"{dst.dtype} {list(dst.shape)}")
        if index.dtype != "i32" or tuple(index.shape) != (1,):
            raise ValueError(f"{self.name}: index must be i32 [1], got {index.dtype} {list(index.shape)}")
        return dst.shape, dst.dtype

    def lower(self, node, device):
        src, index, dst = node.inputs
        out = node.output
        check_in_place(out, dst, "STORE_AT writes dst", "the dst tensor given as input 2")
        adv = int(node.params.get("advance", 0))
        push = {"n": src.shape[0], "n_dst": dst.shape[0], **view_fields("s", src.offset, src.strides[:1], ("s",)),
                "i_off": index.offset, **view_fields("d", dst.offset, dst.strides[:1], ("s",)), "advance": adv}
        writes = (1, 2) if adv else (2,)
        return [Launch("store_at", [src, index, dst], writes, push, (1, 1, 1), spec=(self.WORKGROUP,))]

    def reference(self, src, index, dst, advance=0):
        out = np.array(dst, copy=True)
        base = int(np.asarray(index).reshape(-1)[0])
        for i, v in enumerate(np.asarray(src)):
            if 0 <= base + i < out.shape[0]:
                out[base + i] = v
        return out
