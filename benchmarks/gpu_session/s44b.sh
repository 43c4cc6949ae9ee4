#!/bin/bash
# The forty-fourth session's second chain. On an H200: item 214's FP16_DOT A/B on the tables' decode entries
# (s44a.sh ran on an H100, on heuristics) with its fold, then the full bench once on the folded tables. On an
# H100 (no tables; s44a.sh's bench read int8 prefill at 0.93-0.98x bf16 on qwen3 2048-8192 and deepseek
# 4096-8192): the first H100 tables, both formats, for those two shapes, then their bench on them.
# start.sh s44b.sh, then wait.sh 560 until CHAIN_DONE (~10-11 minutes warm); extract configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  ab fp16_dot fp16_dot_mixtral --shapes mixtral-8x7b mixtral-8x22b --m 4,8 --rounds 3 --warm-s 0.5
  ab fp16_dot fp16_dot_jamba --shapes jamba-1.5-mini --m 1,2,4,8,16 --rounds 3 --warm-s 0.5
  ab fp16_dot fp16_dot_small --shapes qwen3-30b-a3b deepseek-v2-lite --m 1,2,4,8 --rounds 3 --warm-s 0.5
  tables_tgz
  step "full bench"; timeout 540 bash benchmarks/gpu_session/cli.sh bench --out "$R/full" 2>&1 \
    | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
else
  MS=1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192
  for spec in 128,2048,768,8 64,2048,1408,6; do
    step "tune $spec (bf16, int8)"; timeout 330 bash benchmarks/gpu_session/cli.sh tune --shape $spec --m $MS \
      --budget-s 150 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
    tables_tgz
  done
  step "bench on the new tables"; timeout 150 bash benchmarks/gpu_session/cli.sh bench \
    --shapes qwen3-30b-a3b,deepseek-v2-lite --out "$R/h100_small" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
fi
step "done"; echo CHAIN_DONE
