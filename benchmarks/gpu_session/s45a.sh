#!/bin/bash
# The next session's first chain (NOTES "Next GPU session (after the forty-fourth)"). On an H200: s44b.sh's H200
# branch (item 214's FP16_DOT A/B on the tables' decode entries and its fold, then the full bench once). On an
# H100: the tables item 216 left out, qwen3's bf16 and mixtral-8x7b's both formats (each step's timeout leaves
# the tuner's overrun room: item 216's qwen3 ran past 330 s on a 150 s budget), then their bench.
# start.sh s45a.sh, then wait.sh 560 until CHAIN_DONE (~13-17 minutes warm); extract configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
step "session 44's changes on the GPU (tuner logging, strided ids and map, dtype casts, input checks)"
timeout 300 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/test_fused_experts.py tests/test_layer.py \
  tests/test_validation.py tests/test_routing.py "tests/test_bench_tune.py::test_tune_runs_on_gpu" 2>&1 | tail -6
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  CHAIN_NESTED=1 bash benchmarks/gpu_session/s44b.sh "$R"
else
  MS=1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192
  tune() {  # SHAPE DTYPES BUDGET_S
    step "tune $1 ($2)"; timeout $(($3 * 2 + 120)) bash benchmarks/gpu_session/cli.sh tune --shape $1 --dtypes $2 \
      --m $MS --budget-s $3 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|wrote|Error|error"
    tables_tgz
  }
  tune 128,2048,768,8 bf16 120
  tune 8,4096,14336,2 int8,bf16 200
  step "bench on the new tables"; timeout 150 bash benchmarks/gpu_session/cli.sh bench \
    --shapes qwen3-30b-a3b,mixtral-8x7b --out "$R/h100_tables" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
fi
step "done"; echo CHAIN_DONE
