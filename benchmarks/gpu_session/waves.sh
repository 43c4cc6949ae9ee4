#!/bin/bash
# NOTES item 125: TILE_N (gate_up programs narrower than their dot, so decode grids fill whole waves).
# Its GPU tests, the A/B over resident programs a SM at decode (three rounds), the fold, a launch-by-launch
# breakdown of the M=1 rows with the best-predicted values. ~6 minutes: start.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k "tile_n or pairs or split_k" \
    -p no:cacheprovider 2>&1 | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/waves"
step "A/B waves"; timeout 420 python3 benchmarks/variant_ab.py waves --values 0,1,2,3,4,6,12 --rounds 3 \
    --out "$R/waves" --m 1,2,4 --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b \
    deepseek-v2-lite 2>&1 | grep -v -i warn | tail -16
step "fold"; python3 benchmarks/fold_ab.py "$R/waves/variant_ab_waves.json" --out-dir $D
tables_tgz
step "breakdown"; for v in 1 2; do timeout 60 python3 benchmarks/decode_breakdown.py --out "$R" --m 1 \
    --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite --variant waves=$v 2>&1 | grep -v -i warn | tail -3; done
step "done"; echo CHAIN_DONE
