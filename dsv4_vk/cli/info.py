"""`python -m dsv4_vk info [--json] [--all]`: what the device is and can do."""
import json
import sys

from ..vk import Device, VulkanError, list_devices
from . import apply_device, parser


def report(dev):
    """The device report as a dict (capabilities plus HC kernel choices where known)."""
    out = dev.caps.as_dict()
    out.pop("memory_types", None)
    out["host_heap"] = dev.caps.host_heap()      # where routed experts go that the device's memory does not hold
    try:
        from ..hc.plan import describe
        out.update(describe(dev))           # the HC plan: hc, hc_mix, hc_carry
    except ImportError:
        pass
    from ..ops.mul_mat import describe as mul_mat_describe
    out["mul_mat"] = mul_mat_describe(dev)  # the kernel of MUL_MAT over many tokens, and why
    from ..ops.mul_mat import describe_quant
    out["gemv_quant"] = describe_quant(dev)  # the one-token GEMV over FP8 weights
    from ..ops.moe_grouped import describe as experts_describe
    out["mul_mat_id"] = experts_describe(dev)  # the experts' kernel over a prefill chunk, and why
    from ..ops.moe_coopmat import describe as experts_gemm_describe
    out["mul_mat_id_gemm"] = experts_gemm_describe(dev)   # the grouped path's GEMM: matrix units or f32 lanes
    from ..ops.compress import describe as indexer_describe
    out.update(indexer_describe(dev))       # index_score, topk: the indexer's kernels
    from ..ops.v4_attention import describe as attention_describe
    out["mqa_attention"] = attention_describe(dev)     # the attention's kernels at decode and prefill
    from ..ops.v4_gate import describe as router_describe
    out["v4_gate"] = router_describe(dev)   # the router at decode: one dispatch or two
    return out


def carry_summary(dev, D=4096):
    """Where a site's post carries the next site's mixes at hidden size D (hc.plan.carry_summary)."""
    from ..hc.plan import carry_summary as summary
    return summary(dev, D)


def _shapes(shapes):
    """Cooperative-matrix shapes as "MxNxK a·b+c", sorted, comma-separated ("" for none)."""
    return ", ".join(sorted({f"{c['m']}x{c['n']}x{c['k']} {c['a']}·{c['b']}+{c['c']}" for c in shapes}))


def _human(rep):
    sg, ts, lim = rep["subgroup"], rep["timestamps"], rep["limits"]
    lines = [
        f"device        {rep['index']}: {rep['name']} ({rep['type']})",
        f"api / driver  Vulkan {rep['api_version']}, {rep['driver_name']} {rep['driver_info']}",
        f"subgroup      size {sg['size']} (min {sg['min_size']}, max {sg['max_size']}), "
        f"size control {sg['size_control']}, full subgroups {sg['full_subgroups']}",
        f"subgroup ops  {', '.join(sg['operations'])} (compute stage: {sg['compute_stage']})",
        f"timestamps    {'yes' if ts['valid_bits'] else 'no'}, {ts['valid_bits']} bits, {ts['period_ns']} ns/tick",
        f"workgroups    count {lim['max_workgroup_count']}, size {lim['max_workgroup_size']}, "
        f"invocations {lim['max_workgroup_invocations']}",
        f"memory        shared {lim['max_shared_memory']} B, push constants {lim['max_push_constants']} B, "
        f"storage range {lim['max_storage_buffer_range']} B",
        "coop. matrix  " + (_shapes(rep.get("coopmat", ()))
                            or "none (the tensor-core kernels need VK_NV_cooperative_matrix, fp16 arithmetic)"),
        "coop. KHR     " + (_shapes(rep.get("coopmat_khr", ())) or "none")
        + " (VK_KHR_cooperative_matrix: reported, the kernels use the NV extension)",
        "float modes   " + ("; ".join(f"{k.replace('_', ' ')}: {' '.join(v) or 'none'}"
                                     for k, v in rep["float_controls"].items()) + " (what a shader may ask for)"
                            if rep.get("float_controls") else "unknown (Vulkan < 1.2)"),
        "heaps         " + ", ".join(f"{h['size'] / 2**30:.1f} GiB{' device-local' if h['device_local'] else ''}"
                                     + (" host-visible (Model's expert_offload places routed experts here)"
                                        if i == rep.get("host_heap") else "")
                                     for i, h in enumerate(rep["memory_heaps"])),
    ]
    for op, choice in rep.get("hc", {}).items():
        lines.append(f"{op:13s} {choice['path']}: {choice['reason']}")
    mix = rep.get("hc_mix")
    if mix:
        lines.append("HC_MIX        " + (f"many tokens: TCR from {mix['from_tokens']} tokens (tensor cores, element layout "
                                        f"{tuple(mix['layout'])})" if mix["kernel"] == "tcr"
                                        else f"many tokens: KSPLIT (TCR {mix['tcr']})"))
    mm = rep.get("mul_mat")
    if mm:
        lines.append(f"MUL_MAT       512 tokens over bf16/f16 weights: {mm['kernel']} — {mm['reason']}")
        for fmt, q in mm.get("quant", {}).items():
            lines.append(f"MUL_MAT       512 tokens over {fmt.upper()} [4096, 4096]: {q['kernel']} — {q['reason']}")
        if mm.get("f32"):
            lines.append(f"MUL_MAT       512 tokens over f32 weights: {mm['f32']['kernel']} — {mm['f32']['reason']}")
    gq = rep.get("gemv_quant")
    if gq:
        lines.append(f"MUL_MAT       one token over FP8 [{gq['N']}, {gq['K']}]: {gq['kernel']}"
                     + (f", {gq['rows']} rows a cluster" if gq.get("rows") else "") + f" — {gq['reason']}")
    mi = rep.get("mul_mat_id")
    if mi:
        lines.append(f"MUL_MAT_ID    {mi['T']} tokens × {mi['routes']} routes: {mi['kernel']} — {mi['reason']}"
                     + (" (tiles {} route slots × {} outputs, k step {}, {} × {} an invocation)".format(*mi["tile"])
                        if mi.get("tile") else ""))
        sq = mi.get("swiglu_quantised")
        if sq and sq["kernel"] != mi["kernel"]:
            lines.append(f"MUL_MAT_ID    its SwiGLU over {sq['experts']} FP8/FP4 experts: {sq['kernel']} — {sq['reason']}")
    mg = rep.get("mul_mat_id_gemm")
    if mg:
        lines.append(f"MUL_MAT_ID    grouped GEMM over bf16 experts: {mg['kernel']} — {mg['reason']}"
                     + (" (tiles {} route slots × {} outputs, warps {} × {}, k step {})".format(*mg["tile"])
                        if mg.get("tile") else ""))
    isc, tk = rep.get("index_score"), rep.get("topk")
    if isc:
        lines.append(f"INDEX_SCORE   {isc['heads']} heads × {isc['head_dim']}: {isc['kernel']} — {isc['reason']}")
    if tk:
        lines.append(f"TOPK          k {tk['k']}: workgroup {tk['workgroup']}, {tk['bits']}-bit digits, "
                     f"{tk['scan']} bin scan")
    mqa = rep.get("mqa_attention")
    if mqa:
        lines.append(f"MQA_ATTENTION {mqa['heads']} heads × {mqa['head_dim']}: decode {mqa['decode']} (splits "
                     f"{mqa['decode_splits']}), prefill {mqa['prefill']} — {mqa['reason']}")
    rt = rep.get("v4_gate")
    if rt:
        lines.append(f"V4_GATE       one token, {rt['experts']} experts × {rt['D']}: "
                     + (f"one dispatch, {rt['workgroups']} workgroups of {rt['workgroup']}, {rt['rows']} gate rows "
                        f"each" if rt["kernel"] == "fused" else "MUL_MAT then V4_ROUTE") + f" — {rt['reason']}")
    carry = rep.get("hc_carry")
    if carry:
        lines.append(f"HC_POST_MIX   the post carries the next site's mixes (D = {carry['D']}) at T " +
                     ", ".join(f"{span}: {'yes' if on else 'no'}" for span, on in carry.items() if span != "D"))
    return "\n".join(lines)


def main(argv=None):
    ap = parser("info", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--all", action="store_true", help="list every physical device, not just the chosen one")
    args = ap.parse_args(argv)
    apply_device(args)
    try:
        if args.all:
            devs = list_devices()
            print(json.dumps(devs, indent=2) if args.json else
                  "\n".join(f"{i}: {d['name']} ({d['type']}, subgroup {d['subgroup']['size']})"
                            for i, d in enumerate(devs)))
            return 0
        dev = Device()
        rep = report(dev)
    except VulkanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(rep, indent=2) if args.json else _human(rep))
    dev.close()
    return 0
