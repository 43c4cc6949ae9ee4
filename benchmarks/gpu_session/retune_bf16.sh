#!/bin/bash
# NOTES item 166: the bf16 baseline re-tuned (the tuner's current refinements: TMA, PDL, the down GEMM's own
# pipeline) at the rows where int8's ratio sits nearest a line: the small-expert prefill rows and Mixtral 8x7b
# M=2; timed against the bf16 tables in three interleaved rounds, folded under the 1% floor, then those rows
# benched. start.sh retune_bf16.sh, then wait.sh; extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
export TUNE_DTYPES=bf16
retune /tmp/retuned_bf16 "128,2048,768,8 --m 2048,4096,8192 --budget-s 60" "64,2048,1408,6 --m 2048,4096,8192 --budget-s 60" \
    "8,4096,14336,2 --m 2 --budget-s 60"
ab retuned retuned/prefill --dtype bf16 --values 0,1 --rounds 3 --shapes qwen3-30b-a3b deepseek-v2-lite --m 2048,4096,8192
ab retuned retuned/decode --dtype bf16 --values 0,1 --rounds 3 --shapes mixtral-8x7b --m 2
tables_tgz; tar czf "$R/retuned/tables.tgz" -C /tmp/retuned_bf16 .
step "bench"; timeout 150 python3 benchmarks/bench_kernel.py --out "$R/bench" --no-plot --m 2,2048,4096,8192 \
    --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite 2>&1 | tail -30
step "done"; echo CHAIN_DONE
