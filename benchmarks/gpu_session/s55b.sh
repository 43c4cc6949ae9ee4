#!/bin/bash
# Item 234 on an H200: the tuner ranking candidates under the power cap (tune --warm-s 0.5, as the bench times
# rows) at the rows nearest #3's lines: 8x7b int8 decode M=1-8 and the small-expert prefill rows (qwen3 2048,
# deepseek 4096), each row benched before and after on the chain's tables. start.sh s55b.sh, then wait.sh 560
# until CHAIN_DONE (~11 minutes warm); extract configs.tgz (cmp each file against src/experts_int8/kernels/configs).
source benchmarks/gpu_session/common.sh "$1"
rows() {  # rows LABEL: the rows item 234 predicts for
  step "bench 8x7b decode ($1)"; timeout 120 bash benchmarks/gpu_session/cli.sh bench --shapes mixtral-8x7b \
    --m 1,2,4,8,16 --out "$R/$1_8x7b" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
  for s in qwen3-30b-a3b deepseek-v2-lite; do
    step "bench $s prefill ($1)"; timeout 90 bash benchmarks/gpu_session/cli.sh bench --shapes $s \
      --m 2048,4096,8192 --out "$R/$1_$s" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
  done
}
warm_tune() {  # warm_tune SPEC M BUDGET
  step "tune $1 M=$2 --warm-s 0.5"; timeout 300 bash benchmarks/gpu_session/cli.sh tune --shape $1 --m $2 \
    --dtypes int8 --warm-s 0.5 --budget-s $3 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
  tables_tgz
}
rows before
warm_tune 8,4096,14336,2 1,2,4,8 150
warm_tune 128,2048,768,8 2048 100
warm_tune 64,2048,1408,6 4096 100
rows after
step "done"; echo CHAIN_DONE
