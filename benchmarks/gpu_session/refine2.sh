#!/bin/bash
# NOTES item 148: the tuner refines a winning variant once more (tune.search refine_rounds=2). The decode
# rows nearest or under their lines re-tuned with it, the re-tunes against the shipped entries in three
# settled rounds, the fold, then the decode rows of every shape (M = 1-16, settled).
# start.sh refine2.sh, then wait.sh (~9 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
step "tuner test"; timeout 100 python3 -m pytest -q -m gpu tests/test_bench_tune.py -k tune_runs -p no:cacheprovider 2>&1 | tail -1
retune /tmp/retuned_refine2 "8,4096,14336,2 --m 1,2,4 --budget-s 60" "128,2048,768,8 --m 1,2,4,8 --budget-s 60" \
  "64,2048,1408,6 --m 1,2,4,8 --budget-s 60"
mkdir -p "$R/retuned"
step "A/B retuned"; timeout 200 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 --out "$R/retuned" \
    --m 1,2,4,8 --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -12
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
tables_tgz
step "decode bench"; timeout 150 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -28
step "done"; echo CHAIN_DONE
