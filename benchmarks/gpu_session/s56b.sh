#!/bin/bash
# s56a.sh's first part, cut to ~4 minutes warm for a nearly spent device budget: 8x7b int8 decode M=1,2 benched,
# searched under tune --warm-s 0.5 (budget 90 s), benched again. start.sh s56b.sh && wait.sh 300.
source benchmarks/gpu_session/common.sh "$1"
bench8x7b() {
  step "bench 8x7b decode ($1)"; timeout 60 bash benchmarks/gpu_session/cli.sh bench --shapes mixtral-8x7b \
    --m 1,2 --out "$R/$1_8x7b" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
}
bench8x7b before
step "tune 8x7b M=1,2 --warm-s 0.5"; timeout 150 bash benchmarks/gpu_session/cli.sh tune --shape 8,4096,14336,2 \
  --m 1,2 --dtypes int8 --warm-s 0.5 --budget-s 90 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
tables_tgz
bench8x7b after
step "done"; echo CHAIN_DONE
