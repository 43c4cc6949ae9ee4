#!/bin/bash
# Session 39's second chain (NOTES item 202): the register form's GPU tests (GPT-OSS's form among them: every
# activation with and without expert biases, odd K tiles in both GEMMs, a masked last down program), GPT-OSS-20B's
# experts shape tuned again in its form with the register form on offer (int8, M >= 1024) and timed, then
# Nemotron 3 Nano's ungated shape timed three times at prefill (NOTES "Next GPU session" step 2).
# start.sh s39b.sh, then wait.sh 570 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "tests"; timeout 300 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py -k "wsrr or gluon or bias" \
  2>&1 | tail -4
GPT_OSS=(--shapes 32:2880:2880:4 --activation swiglu_oai --biases --quick --no-plot)
step "tune 32,2880,2880,4 int8"; timeout 200 bash benchmarks/gpu_session/cli.sh tune --shape 32,2880,2880,4 \
  --activation swiglu_oai --biases --dtypes int8 --m 1024,2048,4096,8192 --budget-s 150 --out-dir "$D" --no-progress \
  2>&1 | grep -E "M=|took|Error|error"
tables_tgz
step "GPT-OSS-20B shape, register form on offer"; timeout 120 bash benchmarks/gpu_session/cli.sh bench "${GPT_OSS[@]}" \
  --m 256,1024,2048,4096,8192 --out "$R/gpt_oss_wsrr" 2>&1 | tail -8
for run in 1 2 3; do
  step "Nemotron 3 Nano shape, run $run"; timeout 100 bash benchmarks/gpu_session/cli.sh bench --shapes 128:2688:1856:6 \
    --no-gate --activation relu2 --m 2048,4096,8192 --quick --no-plot --out "$R/nemotron_run$run" 2>&1 | grep E128
done
step "done"; echo CHAIN_DONE
