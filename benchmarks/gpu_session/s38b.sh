#!/bin/bash
# Session 38, second chain: the Gluon wgmma kernels on experts without a gate (NOTES item 195 has the
# prediction): their GPU tests, then Nemotron 3 Nano's int8 prefill rows tuned with them on offer, then
# ungated_decode.py on the result. start.sh s38b.sh, then wait.sh 560 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "tests"; timeout 300 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py tests/test_gluon.py \
  -k "gluon or wsrr" 2>&1 | tail -4
step "tune int8 prefill rows of 128,2688,1856,6 without a gate, Gluon on offer"; timeout 330 bash benchmarks/gpu_session/cli.sh tune \
  --shape 128,2688,1856,6 --no-gate --dtypes int8 --m 512,1024,2048,4096 --budget-s 240 \
  --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|tuning|Error|error" | tail -8
tables_tgz
step "ungated decode and prefill vs bf16"; timeout 240 python3 benchmarks/ungated_decode.py --out "$R/ungated_gluon.json"
step "done"; echo CHAIN_DONE
