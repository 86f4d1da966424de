"""TCR: the mixes of many tokens on fp16 tensor cores at fp32 accuracy, x split in registers straight into
the elements of the cooperative matrices (hc_mix_tcr.comp; docs/hc_ops.md). The device's element
layout (probed once: hc_mix_probe.comp), fn split once per call into the matrices' B elements
(HC_MIX_FN_SPLIT), and the partial sums (HC_MIX_TCR), which HC_MIX_REDUCE finishes; `plan`
picks TCR where the layout is TCR's (plan.mix_kernel).
"""
import numpy as np

from .kernels import (HC, N_MIX, check_eps, check_fn_rows, check_layout_param, check_partials, check_unit_inner,
                      mix_fields, reference_mix_partials, strides_in, vec4_ok)
from .policy import HCUnsupported
from ..ops.base import Launch, OpDef, check_params, check_shape, grid_1d, register
from ..vk import Buffer, Recorder
from ..vk.push import pack_fields

TCR_WG = 128                            # 4 subgroups of 32 lanes
TCR_BLOCK = 64                          # tokens a workgroup per 16-token tile of each subgroup (× tt)


def tc_tile_n(device):
    """The fn rows per tile (8 or 16) of a 16 × n × 16 fp16 × fp16 + fp32 cooperative-matrix shape the
    device has at subgroup scope, with 32-lane subgroups (TC's layout: 4 subgroups of 16 tokens);
    None without."""
    if not (device.caps.subgroup.min_size == device.caps.subgroup.max_size == 32):
        return None
    ns = {c.n for c in device.caps.coopmat if (c.m, c.k, c.a, c.b, c.c, c.d) == (16, 16, "f16", "f16", "f32", "f32")}
    return next((n for n in (8, 16) if n in ns), None)


# TCR's element layout (hc_mix_tcr.comp): lane l = 4·g + q of a 32-lane subgroup holds, of a 16 × 16 A,
# rows g and g + 8 and columns 2q, 2q+1, 2q+8, 2q+9; of a 16 × 8 B, rows g, g + 8 and columns 2q, 2q+1
# (the H200's). Which element e is which is the device's: the probe reads it, and spec constants 2–4
# tell the kernel (TCR_AH bit e: A element e in row g + 8; TCR_AF 2 bits per element: its column
# 2q + (0, 1, 8, 9)[code]; TCR_BF 2 bits per element: 2·(row g + 8) + (column 2q + 1)).
TCR_H200_LAYOUT = (0b11110000, 0b11_10_01_00_11_10_01_00, 0b11_10_01_00)
_KK = (0, 1, 8, 9)
_tcr_layouts: dict[tuple, tuple[int, int, int] | str] = {}


def tcr_layout_from(a, b):
    """TCR's layout constants (TCR_AH, TCR_AF, TCR_BF) from a probe's A [32, 8] and B [32, 4] (each
    element's flat index r·16 + c or k·8 + n), or a reason the layout is not TCR's."""
    first = {}
    for lane in range(32):
        g, q = divmod(lane, 4)
        for e in range(8):
            r, c = divmod(int(a[lane, e]), 16)
            if r not in (g, g + 8) or c - 2 * q not in _KK:
                return f"A element {e} of lane {lane} is ({r}, {c}), not in rows {g}, {g + 8} and columns 2q + 0, 1, 8, 9"
            code = (int(r == g + 8), _KK.index(c - 2 * q))
            if first.setdefault(("a", e), code) != code:
                return f"A element {e} is a different entry in lanes 0 and {lane}"
        for e in range(4):
            k, n = divmod(int(b[lane, e]), 8)
            if k not in (g, g + 8) or n not in (2 * q, 2 * q + 1):
                return f"B element {e} of lane {lane} is ({k}, {n}), not in rows {g}, {g + 8} and columns {2 * q}, {2 * q + 1}"
            code = 2 * (k == g + 8) + (n == 2 * q + 1)
            if first.setdefault(("b", e), code) != code:
                return f"B element {e} is a different entry in lanes 0 and {lane}"
    a_codes = [first["a", e] for e in range(8)]
    b_codes = [first["b", e] for e in range(4)]
    if sorted(a_codes) != [(h, f) for h in (0, 1) for f in range(4)] or sorted(b_codes) != [0, 1, 2, 3]:
        return "the elements do not cover the lane's rows and columns once each"
    return (sum(h << e for e, (h, _) in enumerate(a_codes)), sum(f << 2 * e for e, (_, f) in enumerate(a_codes)),
            sum(c << 2 * e for e, c in enumerate(b_codes)))


def tcr_layout(device):
    """TCR's layout constants on `device` (probed once per device: hc_mix_probe.comp), or the reason it cannot
    run there (str)."""
    key = (id(device), getattr(device, "serial", None))
    if key not in _tcr_layouts:
        if tc_tile_n(device) != 8:
            _tcr_layouts[key] = ("needs VK_NV_cooperative_matrix's 16 × 8 × 16 fp16 shape accumulating in fp32 "
                                 "and 32-lane subgroups")
        else:
            out = tcr_probe(device)
            if int(out[512]) != 80404:
                _tcr_layouts[key] = f"element counts (A, B, C) {int(out[512])} are not 8, 4, 4 a lane"
            else:
                _tcr_layouts[key] = tcr_layout_from(out[:256].reshape(32, 8), out[256:384].reshape(32, 4))
    return _tcr_layouts[key]


def tcr_probe(device):
    """hc_mix_probe.comp's output on `device`: A's elements [32 lanes × 8], B's [32 × 4], C's [32 × 4],
    each the flat index of its entry, then the element counts (8, 4, 4 as 80404)."""
    with device.in_use:                     # (close() waits for it: the recording's pools are destroyed here)
        pipe = device.pipelines.get("hc_mix_probe", 3, {"VEC4": 1}, (32, 24), full_subgroups=True)
        buf = Buffer(device, 4 * 520)
        try:
            buf.write(np.full(520, -2, np.float32))
            rec = Recorder(device)
            push = pack_fields("hc_mix_probe", {"VEC4": 1},
                               mix_fields(0, 0, 0, 0, 0.0, 0.0, (0, 0, 0), (0, 0), (0, 0, 0), 0))
            rec.dispatch(pipe, [buf, buf, buf], push, (1, 1, 1), writes=[(buf, 0, 4 * 520)])   # (the block unread)
            r = rec.finish()
            try:
                r.submit()
            finally:
                r.destroy()
            return buf.read(0, 4 * 520).view(np.float32)
        finally:
            buf.destroy()


# TCR (hc_mix_tcr.comp): tiles of 16 tokens per subgroup (tt of them: tt = 2 measured fastest on the
# H200), workgroups of 4 subgroups, 16-chunk steps of one stream; fn split once per call (HC_MIX_FN_SPLIT).
TCR_TT = 2
TCR_SPLITS = (16, 32, 64)               # chunks per stream and split: G = ceil(chunks / split) splits
TCR_SPLIT = 32                          # where none fits the workgroups in one wave (tcr_split_chunks)
TCR_MIN_T = 512                         # from this many tokens plan.mix_kernel picks TCR where the device runs it
TCR_STEP_FLOATS = 64
TCR_STEP_WORDS = 4 * 3 * 32 * 4         # per step of 64 floats: j, fn tile, lane, uvec4


def tcr_split_chunks(T, chunks, tt, wave):
    """TCR's chunks per split at T tokens of `chunks` chunks per stream, tt tiles a subgroup, on a device
    that runs about `wave` of its workgroups at once: where some splits of TCR_SPLITS make between half
    a wave and one wave of workgroups (token blocks × splits), the smallest of them (the most
    workgroups, each streaming its steps with no second wave behind it); otherwise TCR_SPLIT: a
    workgroup streams its steps with their loads' latency exposed, and a second wave behind the first
    costs more than longer workgroups do (H200, wave 256 = MIX_TARGET_GROUPS_DEFAULT:
    results/h200/hc_tune_tcr_rule2_h200.txt)."""
    blocks = -(-T // (TCR_BLOCK * tt))
    one_wave = [s for s in TCR_SPLITS if s <= chunks and wave / 2 <= blocks * -(-chunks // s) <= wave]
    if one_wave:
        return min(one_wave)
    return TCR_SPLIT if TCR_SPLIT <= chunks else TCR_SPLITS[0]


def tcr_words(D):
    """The length (uint32 words, held in an f32 tensor) of fn split for TCR at hidden size D."""
    return HC * D // TCR_STEP_FLOATS * TCR_STEP_WORDS


def _split16(v, sigma):
    """hc_mix_split.glsl's split16 in numpy float32: hi on fp16's grid by integer rounding, lo = (v·σ − hi)·2¹¹."""
    a = (np.asarray(v, np.float32) * np.float32(sigma)).astype(np.float32)
    normal = ((a.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    sub = (np.round(a * np.float32(16777216.0)) * np.float32(1.0 / 16777216.0)).astype(np.float32)
    hi = np.where(np.abs(a) < np.float32(1.0 / 16384.0), sub, normal).astype(np.float32)
    return hi, ((a - hi) * np.float32(2048.0)).astype(np.float32)


def _tcr_b_index(D, bf):
    """For every word group (step, j, n, lane) and element e: fn's row and column of TCR's B element."""
    steps = HC * D // TCR_STEP_FLOATS
    st, j, n, lane = np.meshgrid(np.arange(steps), np.arange(4), np.arange(3), np.arange(32), indexing="ij")
    g, q = lane // 4, lane % 4
    rows, cols = [], []
    for e in range(4):
        code = (bf >> (2 * e)) & 3
        rows.append(8 * n + 2 * q + (code & 1))
        cols.append(TCR_STEP_FLOATS * st + 4 * (4 * (g // 2) + j) + (g & 1) + 2 * (code >> 1))
    return np.stack(rows, -1), np.stack(cols, -1)            # [steps, 4, 3, 32, 4]


def _check_tcr_layout(op, layout):
    if not (isinstance(layout, (tuple, list)) and len(layout) == 3 and all(isinstance(v, int) and 0 <= v < 2**16
                                                                          for v in layout)):
        raise ValueError(f"{op}: layout must be TCR's three element codes (TCR_AH, TCR_AF, TCR_BF), "
                         f"e.g. {TCR_H200_LAYOUT}, got {layout!r}")
    return tuple(layout)


def _check_tcr_d(op, D):
    if D % TCR_STEP_FLOATS:
        raise ValueError(f"{op}: TCR takes the streams in steps of {TCR_STEP_FLOATS} floats: D must be a multiple "
                         f"of {TCR_STEP_FLOATS}, got {D}")


@register
class HcMixFnSplit(OpDef):
    """HC_MIX_FN_SPLIT(fn [m,4D], layout=(ah, af, bf)) -> [tcr_words(D)]: fn as TCR's B elements, each split
    into fp16 hi and lo (hc_mix_fn_split.comp), uint32 words held in an f32 tensor — what HC_MIX_TCR
    reads instead of splitting fn in every workgroup."""
    name, n_inputs = "HC_MIX_FN_SPLIT", 1

    def infer(self, inputs, params):
        (fn,) = inputs
        check_shape("fn", fn.shape, (None, None))
        check_fn_rows(self.name, "fn", fn)
        check_unit_inner(self.name, "fn", fn)
        check_params(self.name, params, ("layout",))
        _check_tcr_layout(self.name, params.get("layout"))
        if fn.shape[1] % HC:
            raise ValueError(f"{self.name}: fn's columns are the 4 streams' D each: a multiple of 4, got {fn.shape[1]}")
        _check_tcr_d(self.name, fn.shape[1] // HC)
        return (tcr_words(fn.shape[1] // HC),), "f32"

    def lower(self, node, device):
        (fn,), out = node.inputs, node.output
        m, D = fn.shape[0], fn.shape[1] // HC
        if not vec4_ok(D, [fn]) or out.offset % 4:
            raise ValueError(f"{self.name}: fn's offset and row stride, and the output's offset, must be multiples of 4 "
                             f"floats, got {fn.offset}, {fn.strides[0]}, {out.offset}")
        steps = HC * D // TCR_STEP_FLOATS
        push = mix_fields(0, D // 4, 0, steps, 0.0, 0.0, (0, 0, 0), (fn.offset // 4, fn.strides[0] // 4),
                          (out.offset // 4, 0, 0), 0)
        return [Launch("hc_mix_fn_split", [fn, fn, out], (2,), push, grid_1d(steps * TCR_STEP_WORDS // 4, TCR_WG),
                       defines={"VEC4": 1},
                       spec=(TCR_WG, m, *node.params["layout"]))]

    def reference(self, fn, layout=TCR_H200_LAYOUT):
        fn = np.asarray(fn, np.float32)
        m, D = fn.shape[0], fn.shape[1] // HC
        rows, cols = _tcr_b_index(D, layout[2])
        v = np.where(rows < m, np.pad(fn, ((0, N_MIX - m), (0, 0)))[np.minimum(rows, N_MIX - 1), cols], 0).astype(np.float32)
        hi, lo = _split16(v, 1.0)
        h16, l16 = hi.astype(np.float16).view(np.uint16).astype(np.uint32), lo.astype(np.float16).view(np.uint16).astype(np.uint32)
        words = np.stack([h16[..., 0] | h16[..., 1] << 16, h16[..., 2] | h16[..., 3] << 16,
                          l16[..., 0] | l16[..., 1] << 16, l16[..., 2] | l16[..., 3] << 16], -1)
        return words.astype(np.uint32).reshape(-1).view(np.float32)


def tcr_fn_from_split(words, m, D, layout=TCR_H200_LAYOUT):
    """fn [m, 4D] as TCR's products see it (hi + 2⁻¹¹·lo of each B element) from HC_MIX_FN_SPLIT's words."""
    w = np.asarray(words, np.float32).view(np.uint32).reshape(-1, 4, 3, 32, 4)
    halves = np.stack([w & 0xFFFF, w >> 16], -1).astype(np.uint16).view(np.float16).astype(np.float64)
    hi = halves[..., :2, :].reshape(*w.shape[:-1], 4)          # elements 0..3: word 0 (0, 1), word 1 (2, 3)
    lo = halves[..., 2:, :].reshape(*w.shape[:-1], 4)
    rows, cols = _tcr_b_index(D, layout[2])
    fn = np.zeros((N_MIX, HC * D))
    fn[rows, cols] = hi + lo / 2048.0
    return fn[:m]


@register
class HcMixTcr(OpDef):
    """HC_MIX_TCR(X [T,4,D], fn_split [tcr_words(D)], m=, groups=G, split=, tt=, cm=, layout=, norm_eps=) -> partials
    [T,G,m+1]: the mixes' partial sums on tensor cores, x split in registers straight into the matrices'
    elements (hc_mix_tcr.comp; cm = 1 on VK_NV_cooperative_matrix where the probed element layout is
    `layout`, cm = 0 its emulation through shared memory); fn_split from HC_MIX_FN_SPLIT with the same
    layout. HC_MIX_REDUCE finishes."""
    name, n_inputs = "HC_MIX_TCR", 2

    def infer(self, inputs, params):
        X, fw = inputs
        check_shape("X", X.shape, (None, HC, None))
        check_unit_inner(self.name, "X", X)
        check_params(self.name, params, ("m", "groups", "split", "tt", "cm", "layout", "norm_eps"))
        D = X.shape[2]
        _check_tcr_d(self.name, D)
        check_shape("fn_split", fw.shape, (tcr_words(D),))
        m = check_layout_param(self.name, params, "m")
        if m > N_MIX:
            raise ValueError(f"{self.name}: m (fn rows) must be 1..{N_MIX}, got {m}")
        split, G = check_layout_param(self.name, params, "split"), check_layout_param(self.name, params, "groups")
        if split % 16 or G != -(-(D // 4) // split):
            raise ValueError(f"{self.name}: split (chunks of 4 floats per stream) must be a multiple of 16 and groups "
                             f"= ceil({D // 4} / split), got split {split}, groups {G}")
        if params.get("tt") not in (1, 2, 4) or params.get("cm") not in (0, 1) or isinstance(params.get("cm"), bool):
            raise ValueError(f"{self.name}: tt (16-token tiles a subgroup) must be 1, 2 or 4 and cm 0 or 1, "
                             f"got tt {params.get('tt')!r}, cm {params.get('cm')!r}")
        _check_tcr_layout(self.name, params.get("layout"))
        check_eps("norm_eps", params.get("norm_eps", 1e-6))
        return (X.shape[0], G, m + 1), "f32"

    def lower(self, node, device):
        X, fw = node.inputs
        out, pr = node.output, node.params
        check_partials(self.name, out)
        T, _, D = X.shape
        tt, m = pr["tt"], pr["m"]
        if not vec4_ok(D, [X]) or fw.offset % 4:
            raise ValueError(f"{self.name}: X's offset and strides and fn_split's offset must be multiples of 4, got "
                             f"{X.offset}, {X.strides}, {fw.offset}")
        need = 4 * (TCR_BLOCK * tt * N_MIX + TCR_BLOCK * tt) + (0 if pr["cm"] else 4 * 4 * (tt * 256 + 3 * 128))
        if need > device.caps.limits.max_shared_memory:
            raise HCUnsupported(f"{self.name}: tt = {tt} ({TCR_BLOCK * tt} tokens a workgroup) keeps {need} B in shared "
                                f"memory, {device.name} has {device.caps.limits.max_shared_memory} B")
        defines = {"VEC4": 1, "CM_TT": tt}
        if pr["cm"]:
            lay = tcr_layout(device)
            if isinstance(lay, str):
                raise HCUnsupported(f"{self.name}: cm = 1 cannot run on {device.name}: {lay} (cm = 0 emulates it)")
            if lay != tuple(pr["layout"]):
                raise ValueError(f"{self.name}: layout {tuple(pr['layout'])} is not {device.name}'s {lay}")
            defines.update(CM_NV=1, CM_N=8)
        push = {**mix_fields(T, D // 4, pr["split"], pr["groups"], 1.0 / (HC * D), check_eps("norm_eps", pr.get("norm_eps", 1e-6)),
                             (X.offset // 4, *strides_in(X, 4)), (fw.offset // 4, 0), (out.offset, out.strides[0], out.strides[1]),
                             TCR_BLOCK * tt), "zero": 0}
        return [Launch("hc_mix_tcr", [X, fw, out], (2,), push, grid_1d(-(-T // (TCR_BLOCK * tt)) * pr["groups"], 1),
                       defines=defines, spec=(TCR_WG, m, *pr["layout"]), full_subgroups=bool(pr["cm"]))]

    def reference(self, X, fw, m=24, groups=1, split=16, tt=1, cm=0, layout=TCR_H200_LAYOUT, norm_eps=1e-6):
        D = np.shape(X)[2]
        return reference_mix_partials(X, tcr_fn_from_split(fw, m, D, layout), groups, 4, split)
