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
        *) echo "unknown step $s (eval info floor bench library soak site model decode mix gemv moe hctests v4tests)" \
               >> "$summary" ;;
    esac
done
tar czf "$out/results.tgz" -C "$out" r
cat "$summary"
