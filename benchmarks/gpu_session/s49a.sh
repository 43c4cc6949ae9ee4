#!/bin/bash
# The forty-ninth session's chain. First the tests: every GPU-marked test (session 49 took four probes' changes:
# tune times candidates on the bench's pools and graphs and confirms a winner by fresh timings, ops' checks were
# split, the kernels re-wrapped), then the unmarked tests not yet passed on a GPU since their last change
# (test_parallel.py whole: session 48's run failed there on ef1cbf1's import defect, fixed in b90f7db). Then, on an
# H200, s44b.sh's H200 branch (item 214's A/B and fold, the full bench); on an H100, item 219's bf16 tables for
# mixtral-8x22b and jamba over the bench's 14 M (now with the confirmed search) and their bench.
# start.sh s49a.sh, then wait.sh 560 until CHAIN_DONE (~25 minutes warm); extract configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
step "gpu-marked tests, whole"
timeout 500 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE -m gpu tests/ 2>&1 | tail -15
step "unmarked tests not yet passed on a GPU (test_parallel.py; sessions 48-49's)"
timeout 400 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE -m "not gpu" tests/test_parallel.py \
  tests/test_validation.py tests/test_layer.py tests/test_bench_tune.py tests/test_transformers.py tests/test_cli.py \
  -k "test_parallel or test_validation or test_layer or test_bench_tune or fresh_process or too_old or offload or \
missing_from_the_files or leaves_the_callers or missing_optional or stale or index" 2>&1 | tail -15
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  CHAIN_NESTED=1 bash benchmarks/gpu_session/s44b.sh "$R"
else
  MS=1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192
  for spec in 8,6144,16384,2 16,4096,14336,2; do
    step "tune $spec (bf16, 14 M)"; timeout 400 bash benchmarks/gpu_session/cli.sh tune --shape $spec --dtypes bf16 \
      --m $MS --budget-s 200 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|wrote|Error|error"
    tables_tgz
  done
  step "bench on the new tables"; timeout 300 bash benchmarks/gpu_session/cli.sh bench \
    --shapes mixtral-8x22b,jamba-1.5-mini --out "$R/h100_bf16" 2>&1 | grep -E "^[a-z]|Error|error" \
    | grep -v "^experts_int8"
fi
step "done"; echo CHAIN_DONE
