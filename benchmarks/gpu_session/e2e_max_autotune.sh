#!/bin/bash
# NOTES item 25's measurement: batch-1 decode of our two columns with the decode step compiled
# in max-autotune mode (inductor autotunes the dense GEMMs), to compare with the reduce-overhead run of
# the same commit. Detached like chain.sh: bash start.sh e2e_max_autotune.sh, then wait.sh.
R=$1
export PYTHONPATH=$PWD/src
exec >"$R/chain.log" 2>&1
echo "=== e2e max-autotune ($(date +%T))"
timeout 1100 bash benchmarks/gpu_session/cli.sh bench-e2e --config mixtral-8x7b --random-weights --decode loop \
  --batch 1 --reps 2 --columns ours-bf16,ours-int8 --compile-mode max-autotune --out "$R" 2>&1 | grep -v -i warn
echo "=== done ($(date +%T))"; echo CHAIN_DONE
