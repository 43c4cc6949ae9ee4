#!/bin/bash
# The next session's first chain (NOTES "Next GPU session (after the forty-sixth)"). First, on either card, the
# tests sessions 45 and 46's changes touched (bare-import registration, model.dequantize(), gradients through the op,
# the split and converter fixes),
# under device_map="cuda". On an H200: s44b.sh's H200 branch (item 214's FP16_DOT A/B on the tables' decode
# entries and its fold, then the full bench once). On an H100: the full bench of the five shapes on the H100
# tables (item 217 shipped the last of them), then GPT-OSS-20B's H100 tables (E=32, N=2880).
# start.sh s46a.sh, then wait.sh 560 until CHAIN_DONE (~12-16 minutes warm); extract configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
step "sessions 45-46's changes on the GPU (registration on import, dequantize, split checks, tables, greedy, E=0)"
timeout 360 python3 -m pytest -q -n 8 -p no:cacheprovider -rfE tests/test_parallel.py tests/test_transformers.py \
  tests/test_fused_experts.py tests/test_export.py tests/test_cli.py tests/test_validation.py tests/test_bench_tune.py \
  tests/test_bench_e2e.py tests/test_routing.py tests/test_quant.py -k "parallel or bare_import or dequantize or fused_layout or bad_scales or \
  quantize_in_memory or gradients or adapters or index_names or fused or integration_loads or state_dict or \
  requires_grad or greedy or int8_weights or without_local or rejected or cached_table or shipped_entries or \
  refine_rounds or output_folder or warp_count or device_names or many_tokens or one_file or \
  logits_dtype or stacked" 2>&1 \
  | tail -4
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  CHAIN_NESTED=1 bash benchmarks/gpu_session/s44b.sh "$R"
else
  step "full bench on the H100 tables"; timeout 330 bash benchmarks/gpu_session/cli.sh bench --out "$R/h100_full" 2>&1 \
    | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
  step "tune GPT-OSS-20B (32,2880,2880,4)"; timeout 400 bash benchmarks/gpu_session/cli.sh tune --shape 32,2880,2880,4 --activation swiglu_oai --biases \
    --dtypes int8,bf16 --budget-s 150 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|wrote|Error|error"
  tables_tgz
fi
step "done"; echo CHAIN_DONE
