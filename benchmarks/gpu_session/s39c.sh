#!/bin/bash
# Session 39's third chain: GPT-OSS-120B's experts shape (E=128, H=I=2880, k=4; clamped SwiGLU with biases) tuned in
# its form (int8 with the register form on offer, and bf16) and timed. start.sh s39c.sh, then wait.sh 570.
source benchmarks/gpu_session/common.sh "$1"
M=1,16,256,1024,2048,4096,8192
step "tune 128,2880,2880,4"; timeout 330 bash benchmarks/gpu_session/cli.sh tune --shape 128,2880,2880,4 \
  --activation swiglu_oai --biases --m $M --budget-s 280 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
tables_tgz
step "GPT-OSS-120B shape, tuned"; timeout 150 bash benchmarks/gpu_session/cli.sh bench --shapes 128:2880:2880:4 \
  --activation swiglu_oai --biases --m $M --quick --no-plot --out "$R/gpt_oss_120b" 2>&1 | tail -9
step "done"; echo CHAIN_DONE
