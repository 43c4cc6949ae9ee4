#!/bin/bash
# NOTES item 75: GPU tests of FP16_DOT again (the magnitude test fixed), then the tuner forced to it.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests (fp16)"; timeout 120 python3 -m pytest -q -m gpu tests/test_gpu.py -k "fp16" -p no:cacheprovider 2>&1 | tail -3
step "tune fp16"; timeout 330 python3 benchmarks/gpu_session/tune_fp16.py mixtral-8x7b mixtral-8x22b 2>&1 | grep -v -i warn | grep "===\|M=\|us" | tail -30
step "done"; echo CHAIN_DONE
