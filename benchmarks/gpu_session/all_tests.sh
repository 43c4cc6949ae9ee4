#!/bin/bash
# Every test on the GPU. The unmarked tests run there too (bf16 added to the kernel tests' dtypes, the models
# on cuda through the Triton kernel; item 181 found two faults that only show there), and no session has run
# them whole: first the kernel tests' file (the thirty-fourth's 540 s run stopped inside it), then the unmarked
# files that session did not run on the GPU, then the marked GPU tests (run whole before, >300 s).
# Serial runs are bound by Triton compiling each new config on one CPU core; the device has 16 and its image
# has pytest-xdist, so the files run on 12 workers (item 182; no test times the GPU against a bound).
# start.sh all_tests.sh, then wait.sh 570 until CHAIN_DONE (the steps are in order of value).
source benchmarks/gpu_session/common.sh "$1"
t() { timeout "$1" python3 -m pytest -q -n 12 -p no:cacheprovider -rfE "${@:2}" 2>&1 | tail -12; }
step "unmarked: kernel tests"; t 900 -m "not gpu" tests/test_fused_experts.py
step "unmarked: the other files"; t 900 -m "not gpu" tests/ --ignore=tests/test_fused_experts.py \
  --ignore=tests/test_transformers.py --ignore=tests/test_compile.py --ignore=tests/test_validation.py \
  --ignore=tests/test_routing.py --ignore=tests/test_quant.py
step "gpu-marked tests"; t 900 -m gpu tests/
step "done"; echo CHAIN_DONE
