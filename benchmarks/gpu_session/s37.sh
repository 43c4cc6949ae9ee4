#!/bin/bash
# Session 37: experts without a gate (NemotronH) on the H200. Their kernel path and the nemotron_h row through
# the Triton kernel, then their decode and prefill timed against bf16 (benchmarks/ungated_decode.py; NOTES item
# 192 has the prediction). start.sh s37.sh, then wait.sh 570 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
t() { timeout "$1" python3 -m pytest -q -n 12 -p no:cacheprovider -rfE "${@:2}" 2>&1 | tail -12; }
step "kernel tests (unmarked and marked)"; t 420 tests/test_fused_experts.py tests/test_validation.py tests/test_layer.py
step "gpu-marked tests, other files"; t 420 -m gpu tests/ --ignore=tests/test_fused_experts.py
step "nemotron_h and the interface through the kernel"; t 300 -k "nemotron or interface or shards" \
  tests/test_transformers.py tests/test_cli.py tests/test_parallel.py tests/test_evaluate.py
step "ungated decode and prefill vs bf16"; timeout 400 python3 benchmarks/ungated_decode.py --out "$R/ungated.json"
step "done"; echo CHAIN_DONE
