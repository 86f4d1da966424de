#!/bin/bash
# `python -m dsv4_vk bench` with nvidia-smi clocks sampled beside it, once with the clock warm-up
# (default) and once without (--warm-ms 0). Writes under $1: smi.csv, bench_{warm,cold}.{txt,json};
# further arguments go to both bench runs.
#   . .vkdev/enter.sh; bash tools/bench_clocks.sh $OUT --d 4096 --t 4096 --op HC_PRE,HC_POST,HC_STEP
set -u
out=${1:-$OUT}; shift || true
mkdir -p "$out"
nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,power.draw,utilization.gpu,clocks_event_reasons.active \
    --format=csv -lms 100 > "$out/smi.csv" 2>&1 &
smi=$!
for mode in warm cold; do
    extra=(); [ $mode = cold ] && extra=(--warm-ms 0)
    echo "== $mode $(date +%T.%N)" >> "$out/smi_marks.txt"
    timeout ${BENCH_TIMEOUT:-100} python3 -m dsv4_vk bench "$@" "${extra[@]}" --json "$out/bench_$mode.json" \
        > "$out/bench_$mode.txt" 2>&1
    echo "== $mode done rc=$? $(date +%T.%N)" >> "$out/smi_marks.txt"
done
kill $smi
