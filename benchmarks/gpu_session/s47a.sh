#!/bin/bash
# The next session's first chain (NOTES "Next GPU session (after the forty-seventh)"). First, on either card,
# session 47's tests (test_cli.py, the offload and expert-parallel refusal tests, the split's expert_map).
# On an H200: s44b.sh's H200 branch (item 214's FP16_DOT A/B on the tables' decode entries and its fold, then
# the full bench once). On an H100: the bf16 tables the H100 still lacks (mixtral-8x22b, jamba: their int8 rows
# are read against bf16 on the heuristic), then those two shapes' bench on them.
# start.sh s47a.sh, then wait.sh 560 until CHAIN_DONE (~12-15 minutes warm); extract configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
step "session 47's tests on the GPU (test_cli.py; offload to the CPU; transformers' expert parallelism)"
timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/test_cli.py tests/test_transformers.py \
  tests/test_parallel.py -k "test_cli or offload or transformers_expert or expert_map or parallel" 2>&1 | tail -4
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  CHAIN_NESTED=1 bash benchmarks/gpu_session/s44b.sh "$R"
else
  for spec in 8,6144,16384,2 16,4096,14336,2; do
    step "tune $spec (bf16)"; timeout 330 bash benchmarks/gpu_session/cli.sh tune --shape $spec --dtypes bf16 \
      --budget-s 150 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|wrote|Error|error"
    tables_tgz
  done
  step "bench on the new tables"; timeout 300 bash benchmarks/gpu_session/cli.sh bench \
    --shapes mixtral-8x22b,jamba-1.5-mini --out "$R/h100_bf16" 2>&1 | grep -E "^[a-z]|Error|error" \
    | grep -v "^experts_int8"
fi
step "done"; echo CHAIN_DONE
