#!/bin/bash
# NOTES "Next GPU session (after the twenty-eighth)": the decode rows nearest their lines re-tuned now that the
# tuner's PDL refinement offers the down GEMM's one prefetched tile (tune.pdl_variants; the shipped entry is
# every search's first candidate), the re-tunes against the shipped entries in three settled rounds, the
# fold, then the decode rows of every shape. Write the prediction in NOTES first.
# start.sh retune_s28.sh, then wait.sh twice (~11 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
retune /tmp/retuned_s28 "8,4096,14336,2 --m 2 --budget-s 150" "128,2048,768,8 --m 2,4,8 --budget-s 90" \
    "64,2048,1408,6 --m 2 --budget-s 90"
mkdir -p "$R/retuned"
step "A/B retuned"; timeout 240 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 --out "$R/retuned" \
    --m 2,4,8 --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -10
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
tables_tgz; cp -r /tmp/retuned_s28 "$R/retuned/tables"
step "decode bench"; timeout 150 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -28
step "done"; echo CHAIN_DONE
