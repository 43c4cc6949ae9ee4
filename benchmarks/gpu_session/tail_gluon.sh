#!/bin/bash
# NOTES item 106: every GPU test (the tail pass on WSRR, Gluon and Triton entries and on a Gluon tail
# entry), then the A/B shipped / WSRR 256 + TAIL 32 / WSRR 256 + TAIL 192 on the entry for 128 rows an
# expert, folded where one wins by 2%, then the kernel bench. ~10 minutes: two wait calls.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 420 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -8
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
step "A/B"; timeout 300 python3 benchmarks/variant_ab.py wsrr_tail --values 0,1,4 --out "$R" \
    --m 2048,4096,8192 --shapes deepseek-v2-lite qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -10
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_wsrr_tail.json" --out-dir $D
tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
