#!/bin/bash
# NOTES item 120: permute_k as one Triton launch (the register form's GPU tests), the A/B shipped /
# WSRR 256 with a tail pass of up to 192 rows on the 128-row entry at the small-expert prefill rows
# (three rounds, folded by fold_ab's rule), deepseek 4096 launch by launch, then the full bench. ~7 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k wsrr -p no:cacheprovider 2>&1 | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
step "A/B"; timeout 200 python3 benchmarks/variant_ab.py wsrr_tail --values 0,4 --rounds 3 --out "$R" \
    --m 2048,4096,8192 --shapes deepseek-v2-lite qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -7
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_wsrr_tail.json" --out-dir $D
tables_tgz
step "breakdown"; timeout 100 python3 benchmarks/decode_breakdown.py --out "$R" --m 4096,8192 \
    --shapes deepseek-v2-lite 2>&1 | grep -v -i warn | tail -2
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
