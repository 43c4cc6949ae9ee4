#!/bin/bash
# The next session's first chain (NOTES "Next GPU session (after the forty-eighth)"). First, on either card,
# the tests that have not passed on a GPU since their last change: test_parallel.py whole (session 48's first
# run failed there on ef1cbf1's import defect, fixed in b90f7db), and session 48's new tests. On an H200:
# s44b.sh's H200 branch (item 214's FP16_DOT A/B and fold, then the full bench once). On an H100: the bf16 tables
# of mixtral-8x22b and jamba tuned over the bench's 14 M (item 219: on tune's default 8 M they regressed the
# rows between), then those two shapes' bench on them.
# start.sh s48a.sh, then wait.sh 560 until CHAIN_DONE (~20 minutes warm); extract configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
step "tests not yet passed on a GPU (test_parallel.py; session 48's)"
timeout 560 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_parallel.py tests/test_validation.py \
  tests/test_layer.py tests/test_transformers.py tests/test_cli.py tests/test_bench_tune.py -k "test_parallel or test_validation or test_layer or \
fresh_process or too_old or offload or missing_from_the_files or leaves_the_callers or missing_optional or \
in_their_form or no_matplotlib" 2>&1 | tail -15
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
