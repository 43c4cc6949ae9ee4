#!/bin/bash
# NOTES item 116: PREFETCH_DOWN (gate_up asks the copy engine for its share of the down weights in L2).
# Its GPU tests and the other kernel variants', then the A/B shipped / whole share / half / quarter at
# decode sizes on all five shapes, three interleaved rounds. ~5 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -k "prefetch or kernel_variants" \
    -p no:cacheprovider 2>&1 | tail -6
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/small" "$R/large"
step "A/B small experts"; timeout 300 python3 benchmarks/variant_ab.py prefetch_down --rounds 3 --out "$R/small" \
    --m 1,2,4,8,16 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -12
step "A/B large experts"; timeout 400 python3 benchmarks/variant_ab.py prefetch_down --rounds 3 --out "$R/large" \
    --m 1,2,4,8,16 --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -16
step "done"; echo CHAIN_DONE
