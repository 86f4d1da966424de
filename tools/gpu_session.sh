#!/usr/bin/env bash
# The measurements the docs quote, in one call of a GPU machine (one machine start for several
# steps). Each step has its own time limit and output file; a summary of every step (command, exit
# status, last lines) goes to OUT/summary.txt, everything to OUT/results.tgz.
#
#   bash tools/gpu_session.sh $OUT [STEP ...]
#
# STEP (default: eval site model):
#   eval      python -m dsv4_vk eval: every HC case against float64 at the device's subgroup size
#   info      python -m dsv4_vk info: the device report and each HC op's plan
#   floor     python -m dsv4_vk floor: dispatch latency, barrier, submit round trip, copy bandwidth
#   bench     python -m dsv4_vk bench: the HC ops against the copy bandwidth
#   library   tools/bench_library.py: host time per call of the library paths
#   soak      tools/soak_library.py: 10,000 decode steps, memory flat
#   site      tools/site_torch_compare.py: the site beside PyTorch (needs PyTorch with CUDA)
#   model     tools/model_gpu_bench.py: DeepSeek-V4 flash-1gpu decode (needs safetensors, ml_dtypes)
#   decode    tools/bench_decode_ops.py: the model's decode kernels one by one
#   mix       tools/hc_tune.py: the mixes and the prefill site, each dispatch timed on its own
#   gemv      tools/bench_gemv.py; moe: tools/bench_moe.py
#   hctests   the HC case tests at the device's subgroup size
#   v4tests   the model's kernels against float64 at the device's subgroup size
#   quanttests  the FP8/FP4, grouped-expert, matrix-unit, decode-fold (merged attention, V4_GATE) kernels'
#             and the host-memory experts' tests at the device's subgroup size
#   coldgemv / coldmoe  the one-token GEMV over FP8/FP4 weights and the FP4 experts with their staged
#             kernels' knobs swept, weights read from device memory (--cold), as in the decode step (the GEMV:
#             lanes a cluster 8/16/32 by workgroup size 64/128/256 at wq_b, wo_a, wo_b, plain and with the
#             norm folded, 108 rows; 32 lanes, 256 invocations are its defaults on the H200; then FP8 at 4 rows
#             a cluster with one scale word a step for the cluster's rows and without, 12 rows)
#   ablatedec  the same staged kernels at their default knobs (cold) again with their code decode, x
#             reads, products, code loads or x staging (the GEMV: or its folded norm's 1/rms) removed
#             (--ablate): where their time goes
#   fp8step   flash-1gpu in the published FP8/FP4 layout: the fused decode step dispatch by dispatch
#             (--timeline) and the decode knobs side by side in the model
#   flash43   V4-Flash's depth in the published layout beside BF16, and with 16 decode attention splits
#             (merged by MQA_COMBINE, and inside MQA_ATTENTION)
#   offload   flash-43 in the published layout with 0, 3, 8 and 43 layers' routed experts in host memory
#   prefillk  the prefill's grouped expert GEMM: f32 lanes (tiles, literal arrays, prefetch), matrix units
#   prefillkabl  the same GEMM on the matrix units at its default tiling without and with x rounded to fp16 once
#             by a pass before it (mul_mat_id_coopmat.x_half), then at that tiling with its products, k-loop
#             staging, k-loop loads, x rows' scan or FP8/FP4 scale scan removed (--ablate): where its time goes
#   prefilla  the prefill attention kernels (f32 lanes, matrix units)
#   prefill   flash-1gpu's 4k-token prefill at the default chunk (512) and at 1024 and 2048, with the experts' x
#             (mul_mat_id_coopmat.x_half) or MUL_MAT's (coopmat.x_half) rounded to fp16 once, and with the
#             matrix-unit forms off
#   gemm      MUL_MAT on the matrix units at the model's prefill shapes beside cuBLAS: the default tiling with
#             x rounded to fp16 by its first pass (coopmat.x_half) and without, then the default with its
#             products, staging or loads removed
#   prefill43 V4-Flash's depth in the published layout: its 4k-token prefill at chunks 512, 1024, 2048, and
#             with the matrix-unit forms off
#   moedec    the one-token experts in the model's layout (FP4 routed experts, the FP8 shared one last in the
#             same dispatch; V4-Flash-43's 8 routed + shared, 7 routes, --cold), the staged kernels at their
#             default knobs beside the SwiGLU's last route first, the sum's route groups and 4 rows a cluster, fewer lanes a
#             cluster, each row checked against float64; then flash-43 in the published layout with those
#             knobs as decode variants (MUL_MAT_ID's GPU ms a token each)
#   moedec65  the same one-token sweep over 65 experts (64 routed + shared)
# A device call may run 10 minutes: split long lists, e.g. `eval library soak`, then `site model`.
set -u
out=${1:?usage: gpu_session.sh OUT [STEP ...]}
shift
steps=${*:-eval site model}
r="$out/r"
mkdir -p "$r"
summary="$out/summary.txt"

step() {   # step NAME LIMIT_S FILE COMMAND...
    local name=$1 limit=$2 file=$3
    shift 3
    echo "== $name ($(date -u +%H:%M:%S)): $*" >> "$summary"
    timeout "$limit" "$@" > "$r/$file" 2>&1
    echo "exit $?" >> "$summary"
    tail -n 6 "$r/$file" >> "$summary"
}

for s in $steps; do
    case $s in
        eval) step eval 240 eval_h200.txt python3 -m dsv4_vk eval --json "$r/eval_h200.json" ;;
        info) step info 60 info_h200.txt python3 -m dsv4_vk info ;;
        floor) step floor 120 floor_h200.txt python3 -m dsv4_vk floor --out "$r/floor_h200.json" ;;
        bench) step bench 300 bench_h200.txt python3 -m dsv4_vk bench --warm-ms 500 --json "$r/bench_h200.json" ;;
        library) step library 120 bench_library_h200.txt python3 tools/bench_library.py --spin-us 0,2000 \
                     --json "$r/bench_library_h200.json" ;;
        soak) step soak 120 soak_library_h200.txt python3 tools/soak_library.py --json "$r/soak_library_h200.json" ;;
        site) step site 420 site_compare.log python3 tools/site_torch_compare.py --out "$r/site_compare" ;;
        model) step model 540 model_bench_v4.txt python3 tools/model_gpu_bench.py --out "$r/model_bench_v4.json" \
                   --timeline ;;
        decode) step decode 300 decode_ops_h200.txt python3 tools/bench_decode_ops.py --json "$r/decode_ops_h200.json" ;;
        mix) step mix 300 hc_tune_mix_h200.txt python3 tools/hc_tune.py --ops HC_MIX,HC_SITE --t 512,1024,2048,4096 \
                 --d 4096,7168 --per-dispatch --warm-ms 500 --out "$r/hc_tune_mix_h200.json" ;;
        gemv) step gemv 300 gemv_h200.txt python3 tools/bench_gemv.py --json "$r/gemv_h200.json" ;;
        moe) step moe 300 moe_h200.txt python3 tools/bench_moe.py --json "$r/moe_h200.json" ;;
        hctests) step hctests 300 hc_tests_h200.txt python3 -m pytest -q -p no:cacheprovider tests/hc_cases.py \
                     tests/test_hc.py ;;
        v4tests) step v4tests 300 v4_tests_h200.txt python3 -m pytest -q -p no:cacheprovider tests/v4_ops_cases.py \
                     tests/test_model_ops.py ;;
        quanttests) step quanttests 420 quant_tests_h200.txt python3 -m pytest -q -p no:cacheprovider \
                        tests/test_quant.py tests/test_mul_mat_coopmat.py tests/test_moe_grouped.py \
                        tests/test_moe_coopmat.py tests/test_attention_prefill.py tests/v4_ops_cases.py \
                        tests/v4_gate_cases.py tests/test_offload.py -k "not subgroup" ;;
        coldgemv) step coldgemv 300 gemv_cold_h200.txt python3 tools/bench_gemv.py --cold --formats fp8,fp4 \
                      --shapes wq_b,wo_a,wo_b --x-shared 1 --xs-rows -1 --xs-unroll 2 --xs-groups 1024 \
                      --xs-wg 64,128,256 --xs-lanes 8,16,32 --json "$r/gemv_cold_h200.json"
                  step coldgemv_scale 120 gemv_cold_scale_h200.txt python3 tools/bench_gemv.py --cold --formats fp8 \
                      --shapes wq_b,wo_a,wo_b --x-shared 1 --xs-rows 4 --xs-one-scale 0,1 \
                      --json "$r/gemv_cold_scale_h200.json" ;;
        coldmoe) step coldmoe 300 moe_cold_h200.txt python3 tools/bench_moe.py --cold --formats fp4 --experts 65 \
                     --routes-per-token 7 --x-shared 1 --xs-rows 1,2,4 --xs-unroll 1,2,4 --xs-groups 256,1024 \
                     --json "$r/moe_cold_h200.json" ;;
        ablatedec) step ablatedec_gemv 330 gemv_ablate_h200.txt python3 tools/bench_gemv.py --cold --formats fp8,fp4 \
                       --shapes wq_b,wo_a,wo_b --x-shared 1 --xs-rows -1 \
                       --ablate nocvt,nodecode,nox,nofma,noload,nostage,nonorm \
                       --json "$r/gemv_ablate_h200.json"
                   step ablatedec_moe 240 moe_ablate_h200.txt python3 tools/bench_moe.py --cold --formats fp4 \
                       --experts 65 --routes-per-token 7 --x-shared 1 --xs-unroll 1 \
                       --ablate nocvt,nodecode,nox,nofma,noload,nostage --json "$r/moe_ablate_h200.json" ;;
        fp8step) step fp8step 420 model_fp8_step_h200.txt python3 tools/model_gpu_bench.py --preset flash-1gpu \
                     --dtype fp8 --skip unfused,multi,host --timeline --variants \
                     "mqa_merge=1;gate=0;gemv_xs_wg=64;gemv_xs_unroll=4;gemv_xs_rows=1;moe_xs_unroll=2;moe_xs_rows=1;moe_xs_groups=256" \
                     --out "$r/model_fp8_step_h200.json" ;;
        flash43) step flash43 540 model_flash43_h200.txt python3 tools/model_gpu_bench.py --preset flash-43 \
                     --dtype fp8 --compare-dtype bf16 --skip unfused,multi,host --variants "mqa_splits=16;mqa_merge=1,mqa_splits=16" \
                     --out "$r/model_flash43_h200.json" ;;
        offload) step offload 540 offload_h200.txt python3 tools/model_gpu_bench.py --preset flash-43 --dtype fp8 \
                     --skip unfused,multi,host --offload-layers 0,3,8,43 --out "$r/offload_h200.json" ;;
        prefillk) step prefillk 480 moe_prefill_h200.txt python3 tools/bench_moe.py --prefill 512,2048 --replays 5 \
                      --repeat 2 --formats bf16,fp4+fp8 --cm-tiles "16x64x16x32x32;64x64x32x32x32;64x64x32x32x64" \
                      --tiles "32x64x32x4x4;64x64x32x4x4;64x64x32x4x4x1;64x64x32x8x4;64x64x32x8x4x1;32x64x32x4x8x1;64x128x32x8x8x1;64x64x32x4x4x0x1;64x64x32x4x4x1x1;64x64x32x8x4x1x1;32x64x32x4x8x1x1" \
                      --json "$r/moe_prefill_h200.json" ;;
        prefillkabl) step prefillkxh 120 moe_prefill_xhalf_h200.txt python3 tools/bench_moe.py --prefill 512,2048 \
                         --replays 5 --repeat 2 --formats bf16,fp4+fp8 --prefill-kernels coopmat --cm-tiles default \
                         --cm-x-half 0,1 --json "$r/moe_prefill_xhalf_h200.json"
                     step prefillkabl 460 moe_prefill_ablate_h200.txt python3 tools/bench_moe.py --prefill 512,2048 \
                         --replays 5 --repeat 2 --formats bf16,fp4+fp8 --prefill-kernels coopmat --cm-tiles default \
                         --ablate nomma,nostage,noload,noscan,nowscan --json "$r/moe_prefill_ablate_h200.json" ;;
        prefilla) step prefilla 240 attention_prefill_h200.txt python3 tools/bench_primitives.py --attention \
                      --attn-positions 4096 --attn-variants cm_tile=16,cm_heads=2 --json "$r/attention_prefill_h200.json" ;;
        prefill) step prefill 540 prefill_h200.txt python3 tools/model_gpu_bench.py --preset flash-1gpu --prompt 4096 \
                     --max-ctx 8192 --skip unfused,multi,host --tokens 4 \
                     --prefill-variants "chunk=1024;chunk=2048;moe_x_half=1;x_half=1;moe_coopmat=0,mqa_coopmat=0" \
                     --out "$r/prefill_h200.json" ;;
        gemm) step gemm 420 gemm_xhalf_h200.txt python3 tools/bench_primitives.py --gemm --gemm-t 512,4096 \
                  --gemm-shapes 4096x4096,32768x1024,4096x8192,1024x4096 --torch-dtypes fp16,bf16 --no-f32 \
                  --coopmat-tiles default,128x128/64x32/64/1/pass/8/1 --coopmat-ablate nomma,nostage,noload \
                  --replays 5 --json "$r/gemm_xhalf_h200.json" ;;
        prefill43) step prefill43 540 prefill_flash43_h200.txt python3 tools/model_gpu_bench.py --preset flash-43 \
                       --dtype fp8 --prompt 4096 --max-ctx 8192 --skip unfused,multi,host --tokens 4 \
                       --prefill-variants "chunk=1024;chunk=2048;moe_coopmat=0,mqa_coopmat=0" \
                       --out "$r/prefill_flash43_h200.json" ;;
        moedec) step moedec 180 moe_decode_h200.txt python3 tools/bench_moe.py --cold --formats fp4 --shared-fp8 \
                    --experts 9 --routes-per-token 7 --x-shared 1 --xs-rows 2,4 --xs-unroll 1 --xs-groups 1024 \
                    --xs-heavy 0,1 --xs-route-groups 1,2,4,7 --xs-lanes 0,8 --json "$r/moe_decode_h200.json"
                step moedec_model 390 model_moedec_h200.txt python3 tools/model_gpu_bench.py --preset flash-43 \
                    --dtype fp8 --skip unfused,multi,host --prompt 64 --tokens 32 --variants \
                    "moe_xs_heavy=1;moe_xs_route_groups=2;moe_xs_route_groups=4;moe_xs_route_groups=7;moe_xs_lanes=8;moe_xs_sum_rows=4;moe_xs_heavy=1,moe_xs_route_groups=4" \
                    --out "$r/model_moedec_h200.json" ;;
        moedec65) step moedec65 300 moe_decode65_h200.txt python3 tools/bench_moe.py --cold --formats fp4 --shared-fp8 \
                      --experts 65 --routes-per-token 7 --x-shared 1 --xs-rows 2 --xs-unroll 1 --xs-groups 1024 \
                      --xs-heavy 0,1 --xs-route-groups 1,2,4,7 --xs-lanes 0,8,16 --json "$r/moe_decode65_h200.json" ;;
        *) echo "unknown step $s (eval info floor bench library soak site model decode mix gemv moe hctests v4tests" \
                "quanttests coldgemv coldmoe ablatedec fp8step flash43 offload prefillk prefillkabl prefilla prefill gemm" \
                "prefill43 moedec moedec65)" \
               >> "$summary" ;;
    esac
done
tar czf "$out/results.tgz" -C "$out" r
cat "$summary"
