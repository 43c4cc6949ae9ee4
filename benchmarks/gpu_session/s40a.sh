#!/bin/bash
# Session 40's three benches (bench3.sh, --warm-s 0.5) read int8 decode 3-15% slower than session 32's (8x7b M=1
# 85% of copy, from 89%) and bf16's unchanged. Is it the half second of untimed replays before each row, or
# the code since? 8x7b's decode rows 1, 2 and 16 with --warm-s 0 and 0.5, the GPU's SM clock and
# power sampled every 50 ms beside each line's time stamp (and qwen3's prefill row 8192 the same way).
# start.sh s40a.sh, then wait.sh 200.
source benchmarks/gpu_session/common.sh "$1"
q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$q --format=csv,noheader >/dev/null 2>&1 || q=${q/clocks_event/clocks_throttle}
nvidia-smi --query-gpu=$q --format=csv -lms 50 >"$R/clocks.csv" 2>&1 & smi=$!
stamp() { while IFS= read -r line; do echo "$(date +%H:%M:%S.%3N) $line"; done; }
for warm in 0 0.5; do
  step "decode --warm-s $warm"; timeout 60 bash benchmarks/gpu_session/cli.sh bench --shapes mixtral-8x7b \
    --m 1,2,16 --warm-s $warm --no-plot --out "$R/warm_$warm" 2>&1 | stamp | grep -E "mixtral|layer"
done
for warm in 0 0.5; do  # s39e.sh read bf16's qwen3 prefill 6-16% slower with 0.5 than with 0, int8 1-8%
  step "prefill --warm-s $warm"; timeout 60 bash benchmarks/gpu_session/cli.sh bench --shapes qwen3-30b-a3b \
    --m 8192 --warm-s $warm --no-plot --out "$R/prefill_$warm" 2>&1 | stamp | grep -E "qwen3|layer"
done
kill $smi
step "done"; echo CHAIN_DONE
