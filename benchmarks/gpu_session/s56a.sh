#!/bin/bash
# Item 234 on an H200, cut to one call (~6-8 minutes warm): the tuner ranking candidates under the power cap
# (tune --warm-s 0.5, as the bench times rows) on 8x7b int8 decode M=1-8, then qwen3 prefill M=2048, each row
# benched before and after on the chain's tables. start.sh s56a.sh && wait.sh 540; extract configs.tgz
# (cmp each file against src/experts_int8/kernels/configs).
source benchmarks/gpu_session/common.sh "$1"
bench8x7b() {
  step "bench 8x7b decode ($1)"; timeout 90 bash benchmarks/gpu_session/cli.sh bench --shapes mixtral-8x7b \
    --m 1,2,4,8 --out "$R/$1_8x7b" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
}
benchqwen() {
  step "bench qwen3 prefill ($1)"; timeout 60 bash benchmarks/gpu_session/cli.sh bench --shapes qwen3-30b-a3b \
    --m 2048 --out "$R/$1_qwen3" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
}
warm_tune() {  # warm_tune SPEC M BUDGET
  step "tune $1 M=$2 --warm-s 0.5"; timeout $(($3 + 90)) bash benchmarks/gpu_session/cli.sh tune --shape $1 --m $2 \
    --dtypes int8 --warm-s 0.5 --budget-s $3 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
  tables_tgz
}
bench8x7b before
warm_tune 8,4096,14336,2 1,2,4,8 140
bench8x7b after
benchqwen before
warm_tune 128,2048,768,8 2048 80
benchqwen after
step "done"; echo CHAIN_DONE
