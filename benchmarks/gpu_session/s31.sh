#!/bin/bash
# Thirty-first session, one chain on one set of tables (NOTES items 170-172): m2.sh's decode variants at 8x7b
# M=2, bf16_gaps.sh's tunes where a table borrows another M's entry, the bench's GPU tests, then three full
# settled benches on the result (the README's table). ~24 minutes warm; start.sh s31.sh, then wait.sh until
# CHAIN_DONE; extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
# 1. item 170: every decode variant touching 8x7b M=2's down grid or bytes in flight, three rounds, folds
for v in "split_k 1,2,4" "down_tile 0,1,2" "down_pipe 0,2,3,5,128" "deep 0,1,2,4" "decode_tile 0,1,3" "tma 0,1,2,3" \
    "pdl_prefetch 0,2,4"; do
  set -- $v; ab "$1" "m2/$1" --values "$2" --rounds 3 --m 2 --shapes mixtral-8x7b
done
tables_tgz
# 2. item 171: bf16 entries at the M the bf16 tables lack, then int8's own borrowed rows
export TUNE_DTYPES=bf16
retune /tmp/retuned_gaps "128,2048,768,8 --m 8,32,64,128,256,512 --budget-s 120" \
    "8,4096,14336,2 --m 8,32,64,128,512 --budget-s 120"
ab retuned gaps/qwen3_bf16 --dtype bf16 --values 0,1 --rounds 3 --shapes qwen3-30b-a3b --m 8,32,64,128,256,512
ab retuned gaps/mixtral_bf16 --dtype bf16 --values 0,1 --rounds 3 --shapes mixtral-8x7b --m 8,32,64,128,512
tar czf "$R/gaps/tables_bf16.tgz" -C /tmp/retuned_gaps .
export TUNE_DTYPES=int8
retune /tmp/retuned_gaps "128,2048,768,8 --m 128,256,512 --budget-s 90" "8,4096,14336,2 --m 128 --budget-s 45"
ab retuned gaps/qwen3_int8 --values 0,1 --rounds 3 --shapes qwen3-30b-a3b --m 128,256,512
ab retuned gaps/mixtral_int8 --values 0,1 --rounds 3 --shapes mixtral-8x7b --m 128
tables_tgz; tar czf "$R/gaps/tables_int8.tgz" -C /tmp/retuned_gaps .
# 3. item 172: the bench's GPU tests (config_source per row), then three full runs on the folded tables
step "bench tests"; timeout 100 python3 -m pytest -q -m gpu tests/test_bench_tune.py -k "bench_runs" -p no:cacheprovider 2>&1 | tail -1
for run in 1 2 3; do
  step "bench $run"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R/run$run" $([ $run = 1 ] || echo --no-plot) \
    2>&1 | tail -3
done
step "done"; echo CHAIN_DONE
