#!/bin/bash
# NOTES item 118: SUM_LAST on the align path. The GPU tests of SUM_LAST and of every kernel variant,
# then the A/B shipped / align-path entries with SUM_LAST / with SUM_LAST and a split of I in two, at
# decode sizes on all five shapes, three interleaved rounds; folded where a winner's slowest round
# beat the shipped entry's fastest. ~6 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -k "sum_last or kernel_variants" \
    -p no:cacheprovider 2>&1 | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/small" "$R/large"
step "A/B small experts"; timeout 300 python3 benchmarks/variant_ab.py sum_last --values 0,3,4 --rounds 3 \
    --out "$R/small" --m 1,2,4,8,16 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -12
step "A/B large experts"; timeout 400 python3 benchmarks/variant_ab.py sum_last --values 0,3,4 --rounds 3 \
    --out "$R/large" --m 1,2,4,8,16 --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -16
step "fold"; for g in small large; do python3 benchmarks/fold_ab.py "$R/$g/variant_ab_sum_last.json" --out-dir $D; done
tables_tgz
step "done"; echo CHAIN_DONE
