#!/bin/bash
# NOTES item 138: the small-expert decode rows under the 75% line at M=2-8 (qwen3, deepseek) and deepseek's
# M=4096 prefill row (the one prefill row over 1.05x in every run) re-tuned on the kernels with the
# epilogue's loads before the K loop, timed against the shipped entries in three interleaved rounds,
# folded under the 1% floor, then the full kernel bench on the result. start.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
retune /tmp/retuned_small "128,2048,768,8 --m 2,4,8 --budget-s 30" "64,2048,1408,6 --m 2,4,8 --budget-s 30" \
  "64,2048,1408,6 --m 4096 --budget-s 60"
mkdir -p "$R/small"
step "A/B retuned"; timeout 200 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 --out "$R/small" \
    --m 2,4,8,4096 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -8
step "fold"; python3 benchmarks/fold_ab.py "$R/small/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
tables_tgz
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
