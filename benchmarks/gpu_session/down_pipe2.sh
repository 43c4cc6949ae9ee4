#!/bin/bash
# NOTES item 153: a down K tile of 64 (variant_ab.py down_pipe 64) beside 3-5 stages and K 128 on the small
# shapes' decode rows, three settled rounds, the fold, the decode rows of every shape.
# start.sh down_pipe2.sh, then wait.sh (~4 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
rm -rf "$R/ab" "$R/late" "$R/retuned"; mkdir -p "$R/ab"  # a warm machine keeps the last chain's results
step "A/B down_pipe"; timeout 300 python3 benchmarks/variant_ab.py down_pipe --values 0,3,4,5,64,128 --rounds 3 \
    --out "$R/ab" --m 1,2,4,8,16 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -10
step "fold"; python3 benchmarks/fold_ab.py "$R/ab/variant_ab_down_pipe.json" --out-dir $D --min-gain 0.01
tables_tgz
step "decode bench"; timeout 150 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -28
step "done"; echo CHAIN_DONE
