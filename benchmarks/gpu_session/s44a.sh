#!/bin/bash
# The next session's first chain (NOTES "Next GPU session (after the forty-third)"): FP16_DOT at decode on the
# entries without it (item 214's prediction; folded where every round wins by 1%), then the full bench twice
# with the folds and the idle before every row (item 212: the bench's default now) to restate #3's table, then
# GPT-OSS-120B's TP=2 shard on both tuned tables (item 213). start.sh s44a.sh, then wait.sh 560 until
# CHAIN_DONE (~15 minutes warm); extract configs.tgz into the tables.
source benchmarks/gpu_session/common.sh "$1"
ab fp16_dot fp16_dot_mixtral --shapes mixtral-8x7b mixtral-8x22b --m 4,8 --rounds 3 --warm-s 0.5
ab fp16_dot fp16_dot_jamba --shapes jamba-1.5-mini --m 1,2,4,8,16 --rounds 3 --warm-s 0.5
ab fp16_dot fp16_dot_small --shapes qwen3-30b-a3b deepseek-v2-lite --m 1,2,4,8 --rounds 3 --warm-s 0.5
tables_tgz
for r in 1 2; do
  step "full bench, run $r"; timeout 540 bash benchmarks/gpu_session/cli.sh bench --out "$R/full$r" 2>&1 \
    | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
done
step "bench GPT-OSS-120B TP=2 (both tables)"; timeout 240 bash benchmarks/gpu_session/cli.sh bench \
  --shapes 128:2880:1440:4 --activation swiglu_oai --biases --no-plot --out "$R/gpt_oss_tp2" 2>&1 | grep -E "^E128|Error|error"
step "done"; echo CHAIN_DONE
