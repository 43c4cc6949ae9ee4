#!/bin/bash
# NOTES item 122: the 192-row register-form tile, first time on a GPU. Its GPU tests (with every other
# register-form and tail test), then the A/B shipped / WSRR 256 / WSRR 192 and shipped / WSRR 256 + tail
# 192 on the 128-row entry / WSRR 192 + tail 32 on the small-expert prefill rows (three rounds), folded
# by fold_ab's rule, then the full bench. ~9 minutes: start.sh, then wait.sh twice.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 400 python3 -m pytest -q -m gpu tests/test_gpu.py -k "wsrr or tail" -p no:cacheprovider 2>&1 | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/wsrr" "$R/tail"
step "A/B tiles"; timeout 300 python3 benchmarks/variant_ab.py wsrr --values 0,1,4 --rounds 3 --out "$R/wsrr" \
    --m 1024,2048,4096,8192 --shapes deepseek-v2-lite qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -9
step "A/B tails"; timeout 300 python3 benchmarks/variant_ab.py wsrr_tail --values 0,4,5 --rounds 3 --out "$R/tail" \
    --m 2048,4096,8192 --shapes deepseek-v2-lite qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -7
step "fold"; for g in wsrr tail; do python3 benchmarks/fold_ab.py "$R/$g/variant_ab_$g.json" --out-dir $D; done
tables_tgz
step "breakdown"; timeout 100 python3 benchmarks/decode_breakdown.py --out "$R" --m 2048,4096 \
    --shapes deepseek-v2-lite --variant wsrr_tail=5 2>&1 | grep -v -i warn | tail -2
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
