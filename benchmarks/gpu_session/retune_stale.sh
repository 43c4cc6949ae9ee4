#!/bin/bash
# NOTES item 136 (the next session's first run): the entries no graph-timed tune has seen since the first
# (eager-timed) tables, re-tuned into a folder of their own, then timed against the shipped entries in
# three interleaved rounds (variant_ab.py retuned) and folded under the 1% floor and the rounds rule, then
# the 8x22b TP=4 shard's M=2 row on LATE_EPILOGUE (item 135's one unmeasured candidate), 8x22b M=1 with
# the down GEMM's SUM_LAST and 8x7b M=2-4 on DEDUP_PAIRS re-timed on the new kernels (the two Mixtral lines
# closest to their targets), then the full bench on the result. ~12 minutes: start.sh retune_stale.sh,
# then wait.sh twice.
source benchmarks/gpu_session/common.sh "$1"
retune /tmp/retuned "64,2048,1408,6 --m 256,512 --budget-s 60" "8,6144,16384,2 --m 128 --budget-s 60" \
  "16,4096,14336,2 --m 128 --budget-s 60" "8,4096,14336,2 --m 64 --budget-s 60"
mkdir -p "$R/retuned"
step "A/B retuned"; timeout 300 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 --out "$R/retuned" \
    --m 64,128,256,512 --shapes deepseek-v2-lite mixtral-8x22b jamba-1.5-mini mixtral-8x7b 2>&1 | grep -v -i warn | tail -16
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
step "A/B late_epilogue, 8x22b TP=4"; timeout 120 python3 benchmarks/variant_ab.py late_epilogue --values 0,2 --rounds 3 \
    --out "$R/retuned" --m 2 --shapes 8:6144:4096:2 2>&1 | grep -v -i warn | tail -2
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_late_epilogue.json" --out-dir $D --min-gain 0.01
step "A/B sum_last, 8x22b M=1"; timeout 120 python3 benchmarks/variant_ab.py sum_last --values 0,1 --rounds 3 \
    --out "$R/retuned" --m 1 --shapes mixtral-8x22b 2>&1 | grep -v -i warn | tail -2
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_sum_last.json" --out-dir $D --min-gain 0.01
step "A/B dedup, 8x7b M=2-4"; timeout 150 python3 benchmarks/variant_ab.py dedup --values 0,1 --rounds 3 \
    --out "$R/retuned" --m 2,4 --shapes mixtral-8x7b 2>&1 | grep -v -i warn | tail -3
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_dedup.json" --out-dir $D --min-gain 0.01
tables_tgz
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
