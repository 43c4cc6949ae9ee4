#!/bin/bash
# NOTES item 89: the Gluon kernels with and without TRIM_TAIL at prefill sizes (variant_ab untrim: value
# 0 is the shipped, trimmed kernel; 1 turns trimming off), entries where untrimmed wins by >= 2% folded
# back (configs.tgz); then the full kernel bench and every GPU test on those tables.
source benchmarks/gpu_session/common.sh "$1"
step "untrim prefill"; timeout 300 python3 benchmarks/variant_ab.py untrim --m 512,1024,2048,4096,8192 --out "$R" \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_untrim.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "gpu tests"; timeout 400 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -5
step "done"; echo CHAIN_DONE
