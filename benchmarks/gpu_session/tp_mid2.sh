#!/bin/bash
# NOTES "Next GPU session (after the thirty-second)", item 1: the shards between decode and prefill. An int8 tune
# of the four shard shapes at M=64-256 (their int8 M=128 entries tie or lose against bf16, item 176), a bf16 tune
# of the three shards item 176 did not tune at M=32-128, three interleaved rounds each, the folds (1% floor), then
# the shards' bench at every M. ~13 minutes warm; start.sh tp_mid2.sh, then wait.sh until CHAIN_DONE; extract
# the shard tables from configs.tgz. Write the prediction in NOTES first.
source benchmarks/gpu_session/common.sh "$1"
SHARDS="8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2"
export TUNE_DTYPES=int8
retune /tmp/retuned_mid_int8 "8,4096,7168,2 --m 64,128,256 --budget-s 60" "8,4096,3584,2 --m 64,128,256 --budget-s 60" \
    "8,6144,8192,2 --m 64,128,256 --budget-s 60" "8,6144,4096,2 --m 64,128,256 --budget-s 60"
ab retuned "mid/int8" --dtype int8 --values 0,1 --rounds 3 --m 64,128,256 --shapes $SHARDS
export TUNE_DTYPES=bf16
retune /tmp/retuned_mid_bf16 "8,4096,7168,2 --m 32,64,128 --budget-s 60" "8,6144,8192,2 --m 32,64,128 --budget-s 60" \
    "8,6144,4096,2 --m 32,64,128 --budget-s 60"
ab retuned "mid/bf16" --dtype bf16 --values 0,1 --rounds 3 --m 32,64,128 --shapes 8:4096:7168:2 8:6144:8192:2 8:6144:4096:2
tables_tgz
step "shards' bench"; timeout 300 python3 benchmarks/bench_kernel.py --shapes $SHARDS --out "$R/bench" --no-plot 2>&1 \
    | grep -A70 "^shape"
step "done"; echo CHAIN_DONE
