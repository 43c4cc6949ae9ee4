#!/bin/bash
# NOTES item 152: the small-expert decode rows re-tuned from the tables item 149 folded (the shipped entry is
# every search's first candidate; its refinements now include the down GEMM's pipeline), the re-tunes
# against the shipped entries in three settled rounds, the fold, then the decode rows of every shape.
# start.sh retune_s27.sh, then wait.sh (~6 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
retune /tmp/retuned_s27 "128,2048,768,8 --m 1,2,4,8 --budget-s 90" "64,2048,1408,6 --m 1,2,4,8 --budget-s 90"
mkdir -p "$R/retuned"
step "A/B retuned"; timeout 200 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 --out "$R/retuned" \
    --m 1,2,4,8 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -8
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
tables_tgz; cp -r /tmp/retuned_s27 "$R/retuned/tables"
step "decode bench"; timeout 150 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -28
step "done"; echo CHAIN_DONE
