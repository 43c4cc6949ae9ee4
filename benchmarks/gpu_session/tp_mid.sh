#!/bin/bash
# NOTES item 176: the shards between decode and prefill (M=32-128). First both formats' bench there (is either
# table's entry weak, as the decode rows were in item 175?), then a bf16 tune of the TP=4 8x7b shard at those M
# (budget 30 s) against its table, three rounds, the fold. ~4 minutes warm: the session's last device minutes.
source benchmarks/gpu_session/common.sh "$1"
SHARDS="8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2"
step "shards' bench, M=32-128"; timeout 150 python3 benchmarks/bench_kernel.py --shapes $SHARDS --m 32,64,128 \
    --out "$R/bench_mid" --no-plot 2>&1 | grep -A20 "^shape"
export TUNE_DTYPES=bf16
retune /tmp/retuned_mid "8,4096,3584,2 --m 32,64,128 --budget-s 30"
ab retuned "mid_bf16" --dtype bf16 --values 0,1 --rounds 3 --m 32,64,128 --shapes 8:4096:3584:2
tables_tgz; step "done"; echo CHAIN_DONE
