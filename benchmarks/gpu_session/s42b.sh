#!/bin/bash
# After s42a.sh's PAD_I tests pass and PAD_I = True is committed (NOTES item 209's next step): GPT-OSS-120B's experts
# at TP=2 (E=128, H=2880, I=1440, k=4: two H100s hold its ~117 GB of int8 experts) and TP=4 (I=720) tuned in their
# form (clamped SwiGLU with biases), both formats, into the chain's tables, then benched on them.
# start.sh s42b.sh, then wait.sh 570 until CHAIN_DONE (~14 minutes warm); extract configs.tgz into the tables.
source benchmarks/gpu_session/common.sh "$1"
MS=1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192
for i in 1440 720; do
  step "tune 128,2880,$i,4 (bf16, int8)"; timeout 330 bash benchmarks/gpu_session/cli.sh tune --shape 128,2880,$i,4 \
    --activation swiglu_oai --biases --m $MS --budget-s 300 --out-dir "$D" --no-progress \
    2>&1 | grep -E "M=|took|Error|error"
  tables_tgz
done
step "bench"; timeout 200 bash benchmarks/gpu_session/cli.sh bench --shapes 128:2880:1440:4,128:2880:720:4 \
  --activation swiglu_oai --biases --m $MS --out "$R/gpt_oss_tp" 2>&1 | grep -E "^E128|Error|error"
step "done"; echo CHAIN_DONE
