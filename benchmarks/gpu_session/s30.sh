#!/bin/bash
# NOTES item 165: the TMA fallback's tests on the GPU; int8 on the bf16 baseline's own entries at the
# small-expert prefill rows (`variant_ab.py float_entry`, item 164) and a fresh int8 tune of those rows, each
# timed against the tables and folded; then three full settled benches on the result (the README's table).
# start.sh s30.sh, then wait.sh until CHAIN_DONE (~17 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
step "tests"; timeout 120 python3 -m pytest -q tests/test_fused_experts.py -k "tma" -p no:cacheprovider 2>&1 | tail -2
SMALL="--m 2048,4096,8192 --shapes qwen3-30b-a3b deepseek-v2-lite"
mkdir -p "$R/float_entry" "$R/retuned"
step "A/B float_entry"; timeout 300 python3 benchmarks/variant_ab.py float_entry --values 0,1,2,3 --rounds 2 \
    $SMALL --out "$R/float_entry" 2>&1 | grep -v -i warn | tail -8
step "fold"; python3 benchmarks/fold_ab.py "$R/float_entry/variant_ab_float_entry.json" --out-dir $D --min-gain 0.01
tables_tgz
retune /tmp/retuned_s30 "128,2048,768,8 --m 2048,4096,8192 --budget-s 100" "64,2048,1408,6 --m 2048,4096,8192 --budget-s 100"
step "A/B retuned"; timeout 240 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 $SMALL \
    --out "$R/retuned" 2>&1 | grep -v -i warn | tail -8
step "fold"; python3 benchmarks/fold_ab.py "$R/retuned/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
tables_tgz; tar czf "$R/retuned/tables.tgz" -C /tmp/retuned_s30 .
for run in 1 2 3; do
  step "bench $run"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R/run$run" $([ $run = 1 ] || echo --no-plot) \
    2>&1 | tail -3
done
step "done"; echo CHAIN_DONE
