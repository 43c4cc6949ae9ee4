#!/bin/bash
# Item 214's A/B on an H200 (the card it was written for; s44a.sh's ran on an H100): FP16_DOT at the decode
# entries without it, folded where every round wins by 1%, then the decode rows of every shape on the folded
# tables. The tables include s54b.sh's 8x7b M=2 entry. start.sh s55a.sh, then wait.sh 540 (~7 minutes warm).
source benchmarks/gpu_session/common.sh "$1"
ab fp16_dot fp16_dot_mixtral --shapes mixtral-8x7b mixtral-8x22b --m 4,8 --rounds 3 --warm-s 0.5
ab fp16_dot fp16_dot_jamba --shapes jamba-1.5-mini --m 1,2,4,8,16 --rounds 3 --warm-s 0.5
ab fp16_dot fp16_dot_small --shapes qwen3-30b-a3b deepseek-v2-lite --m 1,2,4,8 --rounds 3 --warm-s 0.5
tables_tgz
step "decode rows on the folded tables"; timeout 240 bash benchmarks/gpu_session/cli.sh bench --m 1,2,4,8,16 \
  --out "$R/decode" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
step "done"; echo CHAIN_DONE
