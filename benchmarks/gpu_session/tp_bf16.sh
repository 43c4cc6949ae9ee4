#!/bin/bash
# NOTES item 167: the tensor-parallel shards' bf16 tables (mixtral-8x7b/8x22b at TP=2, 4) have no TMA entry, so
# the shards' int8/bf16 ratios are read against a baseline item 163 found 2-5% slow at prefill on the five
# shapes. TMA weight tiles on the shards' bf16 entries (`variant_ab.py tma --dtype bf16`, value 1: both GEMMs),
# two interleaved rounds, the fold (1% floor), then the shards' bench on the result. ~8 minutes warm.
# start.sh tp_bf16.sh, then wait.sh; extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
SHARDS="8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2"
ab tma tma --dtype bf16 --values 0,1 --rounds 2 --m 1,2,4,16,256,512,1024,2048,4096,8192 --shapes $SHARDS
tables_tgz
step "shards' bench"; timeout 300 python3 benchmarks/bench_kernel.py --shapes $SHARDS --m 1,2,4,16,256,512,1024,2048,4096,8192 \
    --out "$R/bench" --no-plot 2>&1 | grep -A45 "^shape"
step "done"; echo CHAIN_DONE
