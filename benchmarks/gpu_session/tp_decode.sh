#!/bin/bash
# NOTES item 174's follow-up: the shards' decode entries (M = 1-16) predate PDL, PDL_PREFETCH, TILE_N and SUM_LAST.
# A tune of both formats on the four shard shapes, three interleaved rounds against the tables, the folds (1%
# floor), then the shards' bench (the README's shard sentence). ~12 minutes warm; start.sh tp_decode.sh, then
# wait.sh until CHAIN_DONE; extract the shard tables from configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
SHARDS="8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2"
for dtype in int8 bf16; do
  export TUNE_DTYPES=$dtype
  retune /tmp/retuned_tp_$dtype "8,4096,7168,2 --m 1,2,4,8,16 --budget-s 60" "8,4096,3584,2 --m 1,2,4,8,16 --budget-s 60" \
      "8,6144,8192,2 --m 1,2,4,8,16 --budget-s 60" "8,6144,4096,2 --m 1,2,4,8,16 --budget-s 60"
  ab retuned "tp_decode/$dtype" --dtype $dtype --values 0,1 --rounds 3 --m 1,2,4,8,16 --shapes $SHARDS
  tar czf "$R/tp_decode/tables_$dtype.tgz" -C /tmp/retuned_tp_$dtype .
done
tables_tgz
step "shards' bench"; timeout 300 python3 benchmarks/bench_kernel.py --shapes $SHARDS --m 1,2,4,8,16,256,512,1024,2048,4096,8192 \
    --out "$R/bench" --no-plot 2>&1 | grep -A50 "^shape"
step "done"; echo CHAIN_DONE
