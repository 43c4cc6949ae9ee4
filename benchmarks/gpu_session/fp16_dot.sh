#!/bin/bash
# NOTES item 75: the int8 -> fp16 conversion and gate_up's dot in fp16 (FP16_DOT): GPU tests, then the A/B.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests (fp16)"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k "fp16" -p no:cacheprovider 2>&1 | tail -4
step "fp16_dot decode"; timeout 240 python3 benchmarks/variant_ab.py fp16_dot --m 1,2,4,8,16 --out "$R" \
                    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
mv "$R/variant_ab_fp16_dot.json" "$R/variant_ab_fp16_dot_decode.json"
step "fp16_dot prefill"; timeout 150 python3 benchmarks/variant_ab.py fp16_dot --m 128,256,512 --out "$R" \
                    --shapes mixtral-8x7b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -13
mv "$R/variant_ab_fp16_dot.json" "$R/variant_ab_fp16_dot_prefill.json"
step "done"; echo CHAIN_DONE
