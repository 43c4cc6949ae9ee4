#!/bin/bash
# NOTES item 88: FP16_DOT on the one-wgmma Gluon entries at prefill sizes, winners folded (configs.tgz).
source benchmarks/gpu_session/common.sh "$1"
step "fp16_dot prefill"; timeout 240 python3 benchmarks/variant_ab.py fp16_dot --m 512,1024,2048,4096,8192 --out "$R" \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_fp16_dot.json" --out-dir $D && tables_tgz
step "done"; echo CHAIN_DONE
