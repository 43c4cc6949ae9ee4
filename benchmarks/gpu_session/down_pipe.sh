#!/bin/bash
# NOTES item 149: the down GEMM's own software pipeline at decode (variant_ab.py down_pipe: num_stages 2-5,
# BLOCK_SIZE_K 128/256) on the rows under or nearest their lines, three settled rounds, the fold, then
# NOTES item 151: then LATE_EPILOGUE on the small-expert rows M=1-2 (three settled rounds) and its fold;
# the decode rows of every shape (M = 1-16, settled). ~11 minutes: start.sh down_pipe.sh, then wait.sh;
# extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
step "tune tests"; timeout 100 python3 -m pytest -q -m gpu tests/test_bench_tune.py -k tune_runs -p no:cacheprovider 2>&1 | tail -1
mkdir -p "$R/ab"
step "A/B down_pipe"; timeout 420 python3 benchmarks/variant_ab.py down_pipe --values 0,2,3,4,5,128,256 --rounds 3 \
    --out "$R/ab" --m 1,2,4,8 --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -12
step "fold"; python3 benchmarks/fold_ab.py "$R/ab/variant_ab_down_pipe.json" --out-dir $D --min-gain 0.01
mkdir -p "$R/late"
step "A/B late_epilogue"; timeout 200 python3 benchmarks/variant_ab.py late_epilogue --values 0,1,2,3 --rounds 3 \
    --out "$R/late" --m 1,2 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -6
step "fold late"; python3 benchmarks/fold_ab.py "$R/late/variant_ab_late_epilogue.json" --out-dir $D --min-gain 0.01
tables_tgz
step "decode bench"; timeout 150 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -28
step "done"; echo CHAIN_DONE
