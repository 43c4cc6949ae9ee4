#!/bin/bash
# NOTES item 168: the bf16 tables of qwen3 and 8x7b have no entry at M = 8 and 32-512 (qwen3) or 8, 32-128 and
# 512 (8x7b): those rows run a neighbour's entry, and int8's lead there (qwen3 M=256 1.55x, 8x7b M=128
# 1.04-1.06x, 8x7b M=512 near the 1.05x line) is read against it. A bf16 tune of those M, three interleaved
# rounds against the tables, the fold (1% floor); then int8's own borrowed rows (item 169). ~12 minutes warm; extract configs.tgz into
# src/experts_int8/kernels/configs, then the README's table wants new runs.
source benchmarks/gpu_session/common.sh "$1"
export TUNE_DTYPES=bf16
retune /tmp/retuned_gaps "128,2048,768,8 --m 8,32,64,128,256,512 --budget-s 120" \
    "8,4096,14336,2 --m 8,32,64,128,512 --budget-s 120"
ab retuned retuned/qwen3 --dtype bf16 --values 0,1 --rounds 3 --shapes qwen3-30b-a3b --m 8,32,64,128,256,512
ab retuned retuned/mixtral --dtype bf16 --values 0,1 --rounds 3 --shapes mixtral-8x7b --m 8,32,64,128,512
tar czf "$R/retuned/tables_bf16.tgz" -C /tmp/retuned_gaps .
# int8's own borrowed rows (item 169): qwen3 128-512 and 8x7b 128
export TUNE_DTYPES=int8
retune /tmp/retuned_gaps "128,2048,768,8 --m 128,256,512 --budget-s 90" "8,4096,14336,2 --m 128 --budget-s 45"
ab retuned retuned/qwen3_int8 --values 0,1 --rounds 3 --shapes qwen3-30b-a3b --m 128,256,512
ab retuned retuned/mixtral_int8 --values 0,1 --rounds 3 --shapes mixtral-8x7b --m 128
tables_tgz; tar czf "$R/retuned/tables_int8.tgz" -C /tmp/retuned_gaps .
step "done"; echo CHAIN_DONE
