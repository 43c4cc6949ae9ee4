#!/bin/bash
# NOTES item 101 (runs at 32a531c only: measured, then reverted): the 256-row register-form tile with an expert's half-padding last block on the 128-row tile
# (TRIM_TAIL, on by default). The wsrr GPU tests (all three tile modes), then the A/B shipped / WSRR trimmed /
# WSRR untrimmed, folded where one wins by 2%, then the kernel bench. ~5 minutes: one wait call.
source benchmarks/gpu_session/common.sh "$1"
step "wsrr tests"; timeout 240 python3 -m pytest -q -m gpu tests/test_gpu.py -k wsrr -p no:cacheprovider 2>&1 | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || { step "wsrr tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/small" "$R/large"
step "A/B small experts"; timeout 200 python3 benchmarks/variant_ab.py wsrr --values 0,1,4 --out "$R/small" \
    --m 1024,2048,4096,8192 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -10
step "A/B large experts"; timeout 200 python3 benchmarks/variant_ab.py wsrr --values 0,1,4 --out "$R/large" \
    --m 512,1024,2048,4096,8192 --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -16
step "fold"; for g in small large; do python3 benchmarks/fold_ab.py "$R/$g/variant_ab_wsrr.json" --out-dir $D; done
tables_tgz
step "bench_kernel"; timeout 240 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
