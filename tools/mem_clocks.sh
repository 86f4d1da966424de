#!/bin/bash
# Copy bandwidth with the GPU's clocks sampled beside it (NVIDIA machines): is a slow copy a slow
# clock? Writes under $1 (default $OUT): smi.csv (nvidia-smi every 50 ms), smi_q_{start,end}.txt,
# mem_probe.{txt,json}; extra arguments go to tools/mem_probe.py.
#   . .vkdev/enter.sh; bash tools/mem_clocks.sh $OUT --mib 1024 --types 1,4 --rounds 3
set -u
out=${1:-$OUT}; shift || true
mkdir -p "$out"
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER > "$out/smi_q_start.txt" 2>&1
nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,clocks.max.sm,power.draw,utilization.gpu,clocks_event_reasons.active \
    --format=csv -lms 50 > "$out/smi.csv" 2>&1 &
smi=$!
sleep 1
python3 "$(dirname "$0")/mem_probe.py" --out "$out/mem_probe.json" "$@" 2>&1 | tee "$out/mem_probe.txt"
sleep 1
kill $smi
nvidia-smi -q -d CLOCK,PERFORMANCE,POWER > "$out/smi_q_end.txt" 2>&1
