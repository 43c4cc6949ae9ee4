#!/bin/bash
# NOTES item 99: the 128-row register-form tile (WSRR_ROWS=128, two programs a SM). Its GPU tests (both
# tiles) first, then the A/B on every shape at prefill sizes: shipped, WSRR 256-row, WSRR 128-row (folded
# where one wins by 2%), the full kernel bench on the folded tables, then every GPU test. ~9 minutes: two
# wait calls.
source benchmarks/gpu_session/common.sh "$1"
step "wsrr tests"; timeout 240 python3 -m pytest -q -m gpu tests/test_gpu.py -k wsrr -p no:cacheprovider 2>&1 | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || { step "wsrr tests failed: stop"; echo CHAIN_DONE; exit 1; }
step "wsrr A/B"; timeout 300 python3 benchmarks/variant_ab.py wsrr --values 0,1,3 --out "$R" --m 256,512,1024,2048,4096,8192 \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -32
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_wsrr.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "gpu tests"; timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -5
step "done"; echo CHAIN_DONE
