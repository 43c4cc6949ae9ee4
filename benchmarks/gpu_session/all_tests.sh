#!/bin/bash
# Every test on the GPU: the marked GPU tests, then the unmarked ones, which run there too (bf16 added to the
# kernel tests' dtypes, the models on cuda through the Triton kernel; item 181 found two faults that only
# show there). ~20 minutes: start.sh all_tests.sh, then wait.sh 570 until CHAIN_DONE (three calls).
source benchmarks/gpu_session/common.sh "$1"
step "gpu-marked tests"; timeout 900 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -rfE 2>&1 | tail -8
step "unmarked tests"; timeout 1200 python3 -m pytest -q -m "not gpu" tests/ -p no:cacheprovider -rfE 2>&1 | tail -12
step "done"; echo CHAIN_DONE
