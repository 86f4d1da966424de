#!/usr/bin/env bash
# Every measurement the open issues quote, in one call of the GPU machine (device time is scarce:
# one machine start instead of five). Each step has its own time limit and its output file; a
# summary of every step (command, exit status, last lines) goes to OUT/summary.txt, everything to
# OUT/results.tgz (the device tool returns at most 8 files).
#
#   . .vkdev/enter.sh; export PYTHONPATH=$PWD:$PYTHONPATH; bash tools/gpu_session.sh $OUT [STEP ...]
#
# STEP: eval, library, soak, site, profile, model, decode, variants, mix, tc, mixtests, layout, tc_ablate,
# spread, timeline, v4tests, mqa_ablate, mix_ablate, carry_ablate (default: the first six, in that order; decode: tools/bench_decode_ops.py, the model's decode kernels and their
# variants; variants: the model bench with fused series at other kernel knobs — a call of its own;
# mix: the mixes kernels for many tokens, KSPLIT against TC, and the prefill site with and without
# its post carrying the next mixes, each dispatch timed on its own; tc: the tensor-core mixes kernel —
# the device's cooperative-matrix shapes, its tests at subgroup 32, KSPLIT against it; mixtests: the
# mixes and site-chain tests at subgroup 32; layout: HC_MIX and the carried prefill site at the
# defaults, then the site with the carry in HC_MIX's KSPLIT layout (256 / 4 / 2); tc_ablate:
# tools/ablate_tc.py; spread: the model bench beside a series without GEMV_SPREAD; timeline: the fused
# decode step dispatch by dispatch, profiled; v4tests: the model's kernels against float64 at the
# device's subgroup size; mqa_ablate: tools/ablate_mqa.py, the tiled MQA_ATTENTION with parts of it removed;
# mix_ablate: tools/ablate_mix.py, KSPLIT (HC_MIX at prefill) with parts removed; carry_ablate: the
# same tool on the carrying post inside the prefill site). A call may run
# 10 minutes: split them, e.g. `eval library soak profile`, then `site model`. `model` needs the
# safetensors and ml_dtypes wheels in .vkdev/whl (results/README.md); `site` needs PyTorch with CUDA. Files in
# results.tgz: eval_h200.{txt,json}, bench_library_h200.{txt,json}, soak_library_h200.{txt,json},
# site_compare.{txt,json}, site_compare.bench.json, profile_site_h200.txt, model_bench_v4.{txt,json},
# decode_ops_h200.{txt,json}, model_variants_h200.{txt,json}, hc_tune_mix_h200.{txt,json}, hc_tune_carry_h200.{txt,json},
# info_tc_h200.txt, tc_tests_h200.txt, hc_tune_tc_h200.{txt,json}, hc_tune_tc_carry_h200.{txt,json},
# mix_tests_h200.txt, hc_tune_layout{,_mix}_h200.{txt,json}, ablate_tc_h200.txt, model_spread_h200.{txt,json},
# model_timeline_h200.{txt,json}, v4_tests_h200.txt, ablate_mqa_h200.txt, ablate_mix_h200.txt,
# hc_tune_rb_h200.{txt,json}, hc_tune_rb_split_h200.{txt,json}.
set -u
out=${1:?usage: gpu_session.sh OUT [STEP ...]}
shift
steps=${*:-eval library soak site profile model}
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
        library) step library 120 bench_library_h200.txt python3 tools/bench_library.py --spin-us 0,2000 \
                     --json "$r/bench_library_h200.json" ;;
        soak) step soak 120 soak_library_h200.txt python3 tools/soak_library.py --json "$r/soak_library_h200.json" ;;
        site) step site 420 site_compare.log python3 tools/site_torch_compare.py --out "$r/site_compare" ;;
        profile) step profile 120 profile_site_h200.txt python3 tools/profile_site.py ;;
        model) step model 540 model_bench_v4.txt python3 tools/model_gpu_bench.py --out "$r/model_bench_v4.json" \
                   --timeline --variants "route_rank=0" ;;
        decode) step decode 300 decode_ops_h200.txt python3 tools/bench_decode_ops.py --json "$r/decode_ops_h200.json" ;;
        variants) step variants 560 model_variants_h200.txt python3 tools/model_gpu_bench.py \
                      --out "$r/model_variants_h200.json" --variants "fold_mb=64;fold_mb=0" ;;
        mix) step mix 200 hc_tune_mix_h200.txt python3 tools/hc_tune.py --ops HC_MIX,HC_SITE --t 512,4096 \
                 --d 4096,7168 --set mix.kernel=ksplit,tc --per-dispatch --out "$r/hc_tune_mix_h200.json"
             step carry 200 hc_tune_carry_h200.txt python3 tools/hc_tune.py --ops HC_SITE --t 64,512,4096 \
                 --d 4096,7168 --site-path three-op --set carry.prefill=0,1 --per-dispatch \
                 --out "$r/hc_tune_carry_h200.json" ;;
        tc) step tc_info 60 info_tc_h200.txt python3 -m dsv4_vk info
            step tc_tests 240 tc_tests_h200.txt python3 -m pytest -q -p no:cacheprovider tests/hc_cases.py \
                -k "test_mix or carrying_at_prefill"
            step tc_tune 240 hc_tune_tc_h200.txt python3 tools/hc_tune.py --ops HC_MIX --t 512,4096 \
                --d 4096,7168 --set mix.kernel=ksplit,tc --per-dispatch --out "$r/hc_tune_tc_h200.json"
            step tc_carry 240 hc_tune_tc_carry_h200.txt python3 tools/hc_tune.py --ops HC_SITE --t 512,4096 \
                --d 4096 --site-path three-op --set carry.kernel=ksplit,tc --set mix.kernel=ksplit,tc --per-dispatch \
                --out "$r/hc_tune_tc_carry_h200.json" ;;
        mixtests) step mixtests 120 mix_tests_h200.txt python3 -m pytest -q -p no:cacheprovider tests/hc_cases.py \
                      -k "test_mix or carrying or site_chain" ;;
        layout) step layout 120 hc_tune_layout_h200.txt python3 tools/hc_tune.py --ops HC_MIX,HC_SITE --t 512,4096 \
                    --d 4096,7168 --site-path three-op --set carry.prefill=1 --per-dispatch --out "$r/hc_tune_layout_h200.json"
                step layout_mix 120 hc_tune_layout_mix_h200.txt python3 tools/hc_tune.py --ops HC_SITE --t 512,4096 \
                    --d 4096,7168 --site-path three-op --set carry.tb=256 --set carry.lpt=4 --set carry.tpl=2 \
                    --per-dispatch --out "$r/hc_tune_layout_mix_h200.json" ;;
        tc_ablate) step tc_ablate 150 ablate_tc_h200.txt python3 tools/ablate_tc.py ;;
        spread) step spread 400 model_spread_h200.txt python3 tools/model_gpu_bench.py --out "$r/model_spread_h200.json" \
                    --variants "gemv_spread=0" ;;
        v4tests) step v4tests 240 v4_tests_h200.txt python3 -m pytest -q -p no:cacheprovider tests/v4_ops_cases.py \
                     tests/test_model_ops.py ;;
        mqa_ablate) step mqa_ablate 300 ablate_mqa_h200.txt python3 tools/ablate_mqa.py ;;
        mix_ablate) step mix_ablate 300 ablate_mix_h200.txt python3 tools/ablate_mix.py base nofnlds noproducts noxload ;;
        *) echo "unknown step $s (eval, library, soak, site, profile, model, decode, variants, mix, tc, mixtests, layout, tc_ablate, spread, timeline, v4tests, mqa_ablate, mix_ablate, carry_ablate)" >> "$summary" ;;
    esac
done
tar czf "$out/results.tgz" -C "$out" r
cat "$summary"
