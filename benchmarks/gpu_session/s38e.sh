#!/bin/bash
# Session 38, fifth chain: the register form (WSRR) on experts without a gate and on I a multiple of 64 (NOTES
# item 198 has the prediction): its GPU tests with the Gluon ones, Nemotron 3 Nano's ungated int8 prefill
# rows tuned with it on offer, then ungated_decode.py. start.sh s38e.sh, then wait.sh 560 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "tests"; timeout 200 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py -k "wsrr or gluon" 2>&1 | tail -6
step "tune int8 M=2048-8192 of 128,2688,1856,6 without a gate, WSRR on offer"; timeout 230 bash benchmarks/gpu_session/cli.sh tune \
  --shape 128,2688,1856,6 --no-gate --dtypes int8 --m 2048,4096,8192 --budget-s 150 \
  --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|tuning|Error|error" | tail -8
tables_tgz
step "ungated decode and prefill vs bf16"; timeout 150 python3 benchmarks/ungated_decode.py --out "$R/ungated_wsrr.json"
step "done"; echo CHAIN_DONE
