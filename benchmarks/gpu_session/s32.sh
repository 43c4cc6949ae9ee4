#!/bin/bash
# The next session's chain (NOTES "Next GPU session (after the thirty-first)"): tp_decode.sh (both formats'
# shard decode entries re-tuned, then the shards' bench), then bench3.sh (the GPU tests of the tuner and the
# bench, three full settled runs: the README's table). ~19 minutes warm; start.sh s32.sh, then wait.sh until
# CHAIN_DONE; extract configs.tgz into src/experts_int8/kernels/configs. Write the predictions in NOTES first.
source benchmarks/gpu_session/common.sh "$1"
export CHAIN_NESTED=1
for script in tp_decode bench3; do bash "benchmarks/gpu_session/$script.sh" "$R"; done
tables_tgz; step "done"; echo CHAIN_DONE
