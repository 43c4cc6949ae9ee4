#!/bin/bash
# NOTES item 157: one prefetched K tile (down PDL_PREFETCH 1) in PDL form 1 and form 2 on every shape's decode
# rows, three settled rounds, the fold, the decode rows of every shape; first the tuner's GPU test (its PDL
# refinement now offers the prefetch).
# start.sh pdl_form.sh, then wait.sh twice (~8 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
rm -rf "$R/ab"; mkdir -p "$R/ab"  # a warm machine keeps the last chain's results
step "tuner GPU test"; timeout 300 python3 -m pytest -q tests/test_bench_tune.py -k "tune_runs_on_gpu" 2>&1 | tail -3
step "A/B pdl_prefetch forms"; timeout 480 python3 benchmarks/variant_ab.py pdl_prefetch --values 0,101,201 --rounds 3 \
    --out "$R/ab" --m 1,2,4,8,16 --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b mixtral-8x22b jamba-1.5-mini \
    2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/ab/variant_ab_pdl_prefetch.json" --out-dir $D --min-gain 0.01
tables_tgz
step "decode bench"; timeout 200 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -27
step "done"; echo CHAIN_DONE
