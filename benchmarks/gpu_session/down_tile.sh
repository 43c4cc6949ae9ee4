#!/bin/bash
# NOTES item 69: the down GEMM's own column tile at decode.
source benchmarks/gpu_session/common.sh "$1"
step "down_tile"; timeout 330 python3 benchmarks/variant_ab.py down_tile --m 1,2,4,8,16 --out "$R" \
                    --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b jamba-1.5-mini 2>&1 | grep -v -i warn | tail -20
step "done"; echo CHAIN_DONE
