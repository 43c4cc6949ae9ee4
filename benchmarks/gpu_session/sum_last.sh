#!/bin/bash
# SUM_LAST on the GPU: its tests, the decode A/B (M=1-8, five shapes), the winners folded into the
# int8 tables, then the decode rows of the kernel bench on them (tables back as configs.tgz).
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests";    timeout 60 python3 -m pytest -q -m gpu tests/test_gpu.py -k "sum_last" -p no:cacheprovider 2>&1 | tail -3
step "sum_last a/b"; timeout 70 python3 benchmarks/variant_ab.py sum_last --m 1,2,4,8 --out "$R" \
                       --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite
step "fold";         python3 benchmarks/fold_ab.py "$R/variant_ab_sum_last.json" --out-dir $D
                     tables_tgz
step "bench decode"; timeout 60 python3 benchmarks/bench_kernel.py --m 1,2,4,8,16 --no-plot --out "$R" 2>&1 | tail -30
step "done"; echo CHAIN_DONE
