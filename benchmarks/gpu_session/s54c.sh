#!/bin/bash
# s54b.sh's first step in about 5 minutes warm, for an H200 with little device time left: the 8x7b int8 and bf16
# entries at M=2,4 searched again on the routing draws (the rows furthest from #3's lines; the tuner prints each
# winner against the shipped entry), then the 8x7b decode rows (M=1-16) benched on the chain's tables
# (BEFORE=1: benched on the shipped tables first too).
# start.sh s54c.sh, then wait.sh 540 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
rows() { step "bench 8x7b decode ($1)"; timeout 150 bash benchmarks/gpu_session/cli.sh bench --shapes mixtral-8x7b \
  --m 1,2,4,8,16 --out "$R/$1" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"; }
[ -n "$BEFORE" ] && rows shipped  # (the chain's tables are still the shipped ones)
step "tune 8x7b M=2,4"; timeout 200 bash benchmarks/gpu_session/cli.sh tune --shape 8,4096,14336,2 --m 2,4 \
  --dtypes int8,bf16 --budget-s 60 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
tables_tgz
rows retuned
step "done"; echo CHAIN_DONE
