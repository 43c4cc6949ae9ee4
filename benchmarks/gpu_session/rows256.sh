#!/bin/bash
# NOTES item 90: 256-row Gluon blocks with TRIM_TAIL (variant_ab fused_tiles values 5, 6) against the
# shipped entries from M=1024, winners folded (configs.tgz), then the full kernel bench on those tables.
source benchmarks/gpu_session/common.sh "$1"
step "fused_tiles 256 rows"; timeout 300 python3 benchmarks/variant_ab.py fused_tiles --values 0,5,6 --m 1024,2048,4096,8192 \
    --out "$R" --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -22
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_fused_tiles.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
