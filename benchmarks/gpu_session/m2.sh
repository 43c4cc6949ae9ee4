#!/bin/bash
# NOTES item 166's lead: 8x7b M=2 int8 reads 85.7% of copy where M=1 reads 90.5% and M=4 94%, and needs
# <= 137.8 µs (90.8%) for 1.8x against bf16's re-tuned entry. Its down GEMM read ~80% of copy (item 127).
# Every decode variant that touches the down launch's grid or the loop's bytes in flight, on the current
# entry (PDL 2, down PDL_PREFETCH 1), three rounds each; then the folds (1% floor). ~4 minutes warm.
# start.sh m2.sh, then wait.sh; extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
for v in "split_k 1,2,4" "down_tile 0,1,2" "down_pipe 0,2,3,5,128" "deep 0,1,2,4" "decode_tile 0,1,3" "tma 0,1,2,3" \
    "pdl_prefetch 0,2,4"; do
  set -- $v; ab "$1" "$1" --values "$2" --rounds 3 --m 2 --shapes mixtral-8x7b
done
tables_tgz
step "bench"; timeout 120 python3 benchmarks/bench_kernel.py --out "$R/bench" --no-plot --shapes mixtral-8x7b \
    --m 1,2,4,8,16 2>&1 | grep -A7 "^shape"
step "done"; echo CHAIN_DONE
