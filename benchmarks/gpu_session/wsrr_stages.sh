#!/bin/bash
# NOTES item 110: the register-form kernels' ring depth (WSRR_STAGES). Their GPU tests (rings of 2, 3, 5
# among them), then the A/B shipped / WSRR entries on 3 stages / on 5 / every prefill entry on 5 (entries
# not on WSRR first take WSRR 256 + TAIL_ROWS 32), on all five shapes and the TP shards, folded where one
# wins by 2%, then the kernel bench. ~9 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -k "wsrr or tail" -p no:cacheprovider 2>&1 | tail -6
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/small" "$R/large" "$R/tp"
step "A/B small experts"; timeout 200 python3 benchmarks/variant_ab.py wsrr_stages --values 0,1,2,3 --out "$R/small" \
    --m 1024,2048,4096,8192 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -10
step "A/B large experts"; timeout 300 python3 benchmarks/variant_ab.py wsrr_stages --values 0,1,2 --out "$R/large" \
    --m 512,1024,2048,4096,8192 --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -16
step "A/B TP shards"; timeout 200 python3 benchmarks/variant_ab.py wsrr_stages --values 0,2 --out "$R/tp" \
    --m 256,1024,4096 --shapes 8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2 2>&1 | grep -v -i warn | tail -13
step "fold"; for g in small large tp; do python3 benchmarks/fold_ab.py "$R/$g/variant_ab_wsrr_stages.json" --out-dir $D; done
tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
