#!/bin/bash
# Thirty-first session, one chain on one set of tables (NOTES items 170-172): m2.sh (the decode variants at
# 8x7b M=2), bf16_gaps.sh (tunes where a table borrows another M's entry), then bench3.sh (three full settled
# benches on the result: the README's table). ~25 minutes warm; start.sh s31.sh, then wait.sh until
# CHAIN_DONE; extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
export CHAIN_NESTED=1
for script in m2 bf16_gaps bench3; do bash "benchmarks/gpu_session/$script.sh" "$R"; done
tables_tgz; step "done"; echo CHAIN_DONE
