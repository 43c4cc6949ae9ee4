#!/bin/bash
# NOTES item 76: every GPU test (the fp16 conversion in both kernel families), then FP16_DOT at prefill.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -5
step "fp16_dot prefill (gluon)"; timeout 200 python3 benchmarks/variant_ab.py fp16_dot --m 1024,2048,4096,8192 --out "$R" \
                    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b deepseek-v2-lite qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -20
mv "$R/variant_ab_fp16_dot.json" "$R/variant_ab_fp16_dot_gluon.json"
step "done"; echo CHAIN_DONE
