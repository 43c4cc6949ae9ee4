#!/bin/bash
# NOTES "Next GPU session (after the twenty-fifth)": the decode rows of every shape re-tuned with the tuner's
# PDL forms (tune.pdl_variants; item 145 timed them on four rows only), the re-tunes timed against the
# shipped entries in three settled rounds (variant_ab.py retuned) and folded under the 1% floor and the
# rounds rule, then three full benches on the result (the README's table: run 1, runs 2-3 beside it).
# ~15 minutes: start.sh retune_pdl.sh, then wait.sh until CHAIN_DONE (extract configs.tgz into
# src/experts_int8/kernels/configs).
source benchmarks/gpu_session/common.sh "$1"
retune /tmp/retuned_pdl "8,4096,14336,2 --m 1,2,4,8,16 --budget-s 40" "8,6144,16384,2 --m 1,2,4,8,16 --budget-s 40" \
  "16,4096,14336,2 --m 1,2,4,8,16 --budget-s 40" "128,2048,768,8 --m 1,2,4,8,16 --budget-s 40" \
  "64,2048,1408,6 --m 1,2,4,8,16 --budget-s 40"
mkdir -p "$R/retuned"
step "A/B retuned"; timeout 400 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 --out "$R/retuned" \
    --m 1,2,4,8,16 --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite 2>&1 \
    | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
# 8x7b M=2-4 without the align launch (DEDUP_PAIRS, +9-11% in item 136) now that the launches can overlap (PDL)
step "A/B dedup"; timeout 150 python3 benchmarks/variant_ab.py dedup --values 0,1,2,3 --rounds 3 --out "$R/retuned" \
    --m 2,4 --shapes mixtral-8x7b 2>&1 | grep -v -i warn | tail -3
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_dedup.json" --out-dir $D --min-gain 0.01
tables_tgz
for run in 1 2 3; do
  step "bench $run"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R/run$run" $([ $run = 1 ] || echo --no-plot) \
    2>&1 | tail -3
done
step "done"; echo CHAIN_DONE
