#!/bin/bash
# NOTES item 86: the Gluon down GEMM's own tile (variant_ab down_gluon) at prefill sizes, the
# winners folded into the int8 tables (back as configs.tgz), then the full kernel bench on them, then
# every GPU test on those tables.
source benchmarks/gpu_session/common.sh "$1"
step "down_gluon prefill"; timeout 420 python3 benchmarks/variant_ab.py down_gluon --m 512,1024,2048,4096,8192 --out "$R" \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_down_gluon.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "gpu tests"; timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -5
step "done"; echo CHAIN_DONE
