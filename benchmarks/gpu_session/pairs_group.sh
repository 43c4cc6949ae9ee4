#!/bin/bash
# NOTES item 72: PAIRS with the pairs as the grid's fast index (L2 shares the experts they share).
source benchmarks/gpu_session/common.sh "$1"
step "pairs_group"; timeout 230 python3 benchmarks/variant_ab.py pairs_group --m 2,4,8 --out "$R" \
                      --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite jamba-1.5-mini 2>&1 | grep -v -i warn | tail -12
step "done"; echo CHAIN_DONE
