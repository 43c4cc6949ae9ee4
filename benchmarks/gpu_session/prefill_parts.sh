#!/bin/bash
# Fifteenth session: where prefill's int8 time goes launch by launch, against bf16's (the same profiled
# CUDA-graph sweep as decode_breakdown at prefill M), then the prepared decode A/B `deep` (item 78).
source benchmarks/gpu_session/common.sh "$1"
S="mixtral-8x7b jamba-1.5-mini qwen3-30b-a3b"
for dt in int8 bf16; do
  step "prefill breakdown $dt"; timeout 200 python3 benchmarks/decode_breakdown.py --dtype $dt --m 512,2048,4096 \
      --shapes $S --out "$R" 2>&1 | grep -v -i warn | tail -12
  mv "$R/decode_breakdown.json" "$R/prefill_breakdown_$dt.json"
done
step "deep decode"; timeout 200 python3 benchmarks/variant_ab.py deep --m 1,2,4 --out "$R" \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -14
step "done"; echo CHAIN_DONE
