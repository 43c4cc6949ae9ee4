#!/bin/bash
# #3's rows on an H200 in what is left of a session's device time (~13 minutes warm): 8x7b int8 and bf16 decode
# at M=2,4 searched again on the routing draws (the rows furthest from #3's lines), then the full bench on the
# chain's tables. The GPU tests ran on an H100 this session (s54a.sh). start.sh s54b.sh, then wait.sh 560.
source benchmarks/gpu_session/common.sh "$1"
step "tune 8x7b M=2,4"; timeout 200 bash benchmarks/gpu_session/cli.sh tune --shape 8,4096,14336,2 --m 2,4 \
  --dtypes int8,bf16 --budget-s 60 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
tables_tgz
step "full bench"; timeout 560 bash benchmarks/gpu_session/cli.sh bench --out "$R/full" 2>&1 \
  | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
step "done"; echo CHAIN_DONE
