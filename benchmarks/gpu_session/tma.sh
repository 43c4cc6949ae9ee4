#!/bin/bash
# NOTES item 73: weight tiles by TMA (tensor descriptors): its GPU tests, then the A/B.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests (tma)"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k tma -p no:cacheprovider 2>&1 | tail -4
step "tma decode"; timeout 300 python3 benchmarks/variant_ab.py tma --m 1,2,4,8,16 --out "$R" \
                    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
mv "$R/variant_ab_tma.json" "$R/variant_ab_tma_decode.json"
step "tma prefill"; timeout 200 python3 benchmarks/variant_ab.py tma --m 256,8192 --values 0,1 --out "$R" \
                    --shapes mixtral-8x7b jamba-1.5-mini qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -8
mv "$R/variant_ab_tma.json" "$R/variant_ab_tma_prefill.json"
step "done"; echo CHAIN_DONE
