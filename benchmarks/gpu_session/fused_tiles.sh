#!/bin/bash
# NOTES item 84: Gluon tiles with gate and up as one wgmma (variant_ab fused_tiles) at prefill sizes, the
# winners folded into the int8 tables (back as configs.tgz), then the full kernel bench on them.
source benchmarks/gpu_session/common.sh "$1"
step "fused_tiles prefill"; timeout 420 python3 benchmarks/variant_ab.py fused_tiles --m 512,1024,2048,4096,8192 --out "$R" \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_fused_tiles.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
