#!/bin/bash
# NOTES item 206's next step: the bench's GPU tests (`--settle-every-row` among them, not yet run on a GPU), then
# the decode rows of all five shapes with the section's idle only and with it before every row too, two rounds
# interleaved. Prediction (NOTES, next GPU session after the fortieth): with --settle-every-row the int8 decode
# rows read within 1% of s40a.sh's rows alone (8x7b M=1 ~93 us, M=2 ~150, M=16 ~339); bf16's do not move.
# start.sh s41a.sh, then wait.sh 560 (4-6 minutes warm).
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests of the bench"; timeout 150 python3 -m pytest -q -m gpu tests/test_bench_tune.py -k bench_runs_on_gpu \
  -p no:cacheprovider 2>&1 | tail -2
for round in 1 2; do
  for form in "" "--settle-every-row"; do
    step "decode round $round ${form:-(per section)}"
    timeout 120 bash benchmarks/gpu_session/cli.sh bench --m 1,2,4,8,16 $form --no-plot \
      --out "$R/round${round}${form:+_every_row}" 2>&1 | grep -E "^(mixtral|jamba|qwen3|deepseek)"
  done
done
step "done"; echo CHAIN_DONE
