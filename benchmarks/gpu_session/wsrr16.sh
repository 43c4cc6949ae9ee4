#!/bin/bash
# NOTES item 126: the 16-row register-form tile at decode. Its GPU tests (every register-form test on rows 16),
# then the A/B shipped / WSRR 16 with 16, 8 and 12 slots at M=1-16 on every shape (two rounds), the fold,
# a launch-by-launch breakdown. ~7 minutes: start.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k "wsrr and 16" -p no:cacheprovider \
    2>&1 | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/wsrr16"
step "A/B"; timeout 400 python3 benchmarks/variant_ab.py wsrr_decode --rounds 2 --out "$R/wsrr16" --m 1,2,4,8,16 \
    --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/wsrr16/variant_ab_wsrr_decode.json" --out-dir $D
tables_tgz
step "breakdown"; timeout 60 python3 benchmarks/decode_breakdown.py --out "$R" --m 2,8 \
    --shapes mixtral-8x7b qwen3-30b-a3b --variant wsrr_decode=1 2>&1 | grep -v -i warn | tail -4
step "done"; echo CHAIN_DONE
