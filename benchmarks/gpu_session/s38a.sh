#!/bin/bash
# Session 38, first chain (it replaces s37c.sh, never run, less its tests, which ran in session 37): the int8 prefill rows of
# Nemotron 3 Nano's shape tuned again without a gate on a larger budget (NOTES item 194 has the
# prediction), and ungated_decode.py on the result. start.sh s38a.sh, then wait.sh 500 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "tune int8 prefill rows of 128,2688,1856,6 without a gate"; timeout 400 bash benchmarks/gpu_session/cli.sh tune \
  --shape 128,2688,1856,6 --no-gate --dtypes int8 --m 512,1024,2048,4096 --max-candidates 48 --budget-s 330 \
  --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|tuning|Error|error" | tail -8
tables_tgz
step "ungated decode and prefill vs bf16, retuned"; timeout 200 python3 benchmarks/ungated_decode.py --out "$R/ungated_retuned.json"
step "done"; echo CHAIN_DONE
