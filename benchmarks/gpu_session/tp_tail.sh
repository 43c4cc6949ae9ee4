#!/bin/bash
# NOTES item 108: the tail pass on the tensor-parallel shards' prefill rows (mixtral-8x7b and 8x22b at
# TP=2 and 4), shipped / TAIL_ROWS 16 / 32 / 64 at M=1024 and 2048, folded where one wins by 2%. ~4 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "tail A/B, TP shards"; timeout 280 python3 benchmarks/variant_ab.py tail --values 0,1,2,3 --out "$R" \
    --m 1024,2048 --shapes 8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2 2>&1 | grep -v -i warn | tail -10
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_tail.json" --out-dir $D && tables_tgz
step "done"; echo CHAIN_DONE
