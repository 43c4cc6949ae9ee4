#!/bin/bash
# Session 38, fourth chain: Nemotron 3 Nano's ungated int8 prefill rows searched deeper with the Gluon kernels
# running (NOTES item 197 has the prediction), then ungated_decode.py on the result.
# start.sh s38d.sh, then wait.sh 560 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "tune int8 M=2048-8192 of 128,2688,1856,6 without a gate, deeper"; timeout 380 bash benchmarks/gpu_session/cli.sh tune \
  --shape 128,2688,1856,6 --no-gate --dtypes int8 --m 2048,4096,8192 --max-candidates 64 --budget-s 300 \
  --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|tuning|Error|error" | tail -8
tables_tgz
step "ungated decode and prefill vs bf16"; timeout 200 python3 benchmarks/ungated_decode.py --out "$R/ungated_deeper.json"
step "done"; echo CHAIN_DONE
