#!/bin/bash
# NOTES items 142-143: the bench's GPU test, then the full kernel bench $RUNS times (default 2) with the
# GPU's clocks, power, temperature and clock-event reasons sampled every 100 ms, every bench line stamped
# with its time (8x22b M=1's slow mode, item 139). RUNS=3 start.sh clocks.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
step "GPU test of the bench"; timeout 120 python3 -m pytest -q -m gpu tests/test_bench_tune.py -p no:cacheprovider \
  -k bench_runs_on_gpu 2>&1 | tail -2
q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$q --format=csv,noheader >/dev/null 2>&1 || q=${q/clocks_event/clocks_throttle}
for run in $(seq ${RUNS:-2}); do
  step "bench $run"
  nvidia-smi --query-gpu=$q --format=csv -lms 100 >"$R/clocks_$run.csv" 2>&1 & smi=$!
  timeout 330 python3 -u benchmarks/bench_kernel.py --out "$R/run$run" 2>&1 \
    | while IFS= read -r line; do echo "$(date +%H:%M:%S.%3N) $line"; done >"$R/bench_$run.log"
  kill $smi; grep -E "^[0-9:.]+ +(# |  M=1 |mixtral-8x22b +1 )" "$R/bench_$run.log" | head -30
done
step "done"; echo CHAIN_DONE
