#!/bin/bash
# After s42a.sh's PAD_I tests pass (NOTES item 209's next step; s42a.sh runs it with CHAIN_PAD_I=1 before PAD_I = True
# is committed): GPT-OSS-120B's experts at TP=2 (E=128, H=2880, I=1440, k=4: two H100s hold its ~117 GB of int8
# experts) and TP=4 (I=720) tuned in their form (clamped SwiGLU with biases), both formats, into the chain's
# tables, then benched on them. S42B_SHAPES (the I values, default "1440 720") and S42B_BUDGET_S (each shape's
# tuning time, default 300) trim it.
# start.sh s42b.sh, then wait.sh 570 until CHAIN_DONE (~14 minutes warm); extract configs.tgz into the tables.
source benchmarks/gpu_session/common.sh "$1"
MS=1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192
shapes=""
for i in ${S42B_SHAPES:-1440 720}; do
  # the budget bounds the search; compiling and the pool come on top (the 1440 tune's 240 s took over 330)
  step "tune 128,2880,$i,4 (bf16, int8)"; timeout $((${S42B_BUDGET_S:-300} + 200)) bash benchmarks/gpu_session/cli.sh tune --shape 128,2880,$i,4 \
    --activation swiglu_oai --biases --m $MS --budget-s ${S42B_BUDGET_S:-300} --out-dir "$D" --no-progress \
    2>&1 | grep -E "M=|took|Error|error"
  tables_tgz; shapes="$shapes,128:2880:$i:4"
done
step "bench"; timeout 200 bash benchmarks/gpu_session/cli.sh bench --shapes ${shapes#,} \
  --activation swiglu_oai --biases --m $MS --out "$R/gpt_oss_tp" 2>&1 | grep -E "^E128|Error|error"
step "done"; echo CHAIN_DONE
