#!/bin/bash
# NOTES item 115: a row block's expert id loaded with the padded row count (one global latency before the
# loader starts, not two). The register form's GPU tests, then the A/B EARLY_EXPERT off / on, 2 rounds.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 120 python3 -m pytest -q -m gpu tests/test_gpu.py -k "wsrr and not ring_depths" -p no:cacheprovider 2>&1 | tail -3
step "A/B"; timeout 150 python3 benchmarks/variant_ab.py wsrr_early --values 0,1 --rounds 2 --out "$R" \
    --m 2048,8192 --shapes deepseek-v2-lite qwen3-30b-a3b mixtral-8x7b 2>&1 | grep -v -i warn | tail -6
step "done"; echo CHAIN_DONE
