#!/bin/bash
# NOTES item 133: LATE_EPILOGUE (the epilogue's loads after the K loop, per entry) -- the GPU tests of the
# Triton kernels, the A/B on the shipped decode entries (values 0 shipped / 1 both GEMMs late / 2 gate_up
# late / 3 down late; three rounds), the fold (1% floor and the rounds rule), the decode bench on the result.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k "kernel_variants or sum_last or biases or fp16" \
    -p no:cacheprovider 2>&1 | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/late"
step "A/B late_epilogue"; timeout 330 python3 benchmarks/variant_ab.py late_epilogue --values 0,1,2,3 --rounds 3 \
    --out "$R/late" --m 1,2,4,8,16 --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b \
    deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/late/variant_ab_late_epilogue.json" --out-dir $D --min-gain 0.01
tables_tgz
step "decode bench"; timeout 150 python3 benchmarks/bench_kernel.py --m 1,2,4,8,16 --out "$R" 2>&1 | tail -28
step "done"; echo CHAIN_DONE
