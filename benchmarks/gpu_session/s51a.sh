#!/bin/bash
# The fifty-first session's chain: the decode entries on the routing draws, on whichever card comes. The
# tables were tuned on one routing draw a row (item 221); session 50 re-tuned the H100 rows that moved past
# the prediction (item 222). Here every shape's M=2..64 entries, both formats, are searched again into the
# chain's tables (a new winner needs the tuner's confirmation: 3 alternated timings, 2% faster), between a
# decode bench before and the full bench after. Then, on an H200 with time left, item 214's FP16_DOT A/B.
# start.sh s51a.sh, then wait.sh 560 until CHAIN_DONE (~24 minutes warm); extract configs.tgz (cmp first).
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests through the op (its device switch is new; one GPU never enters it)"
timeout 150 python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider -rfE tests/test_gpu.py -k "test_bf16 or \
cuda_graph or inductor or programmatic or another_gpu" 2>&1 | tail -6
step "decode bench before"; timeout 200 bash benchmarks/gpu_session/cli.sh bench --m 1,2,4,8,16,32,64 \
  --out "$R/before" 2>&1 | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
for spec in 8,4096,14336,2 8,6144,16384,2 16,4096,14336,2 128,2048,768,8 64,2048,1408,6; do
  step "tune $spec M=2..64 (int8, bf16)"; timeout 240 bash benchmarks/gpu_session/cli.sh tune --shape $spec \
    --m 2,4,8,16,32,64 --dtypes int8,bf16 --budget-s 75 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
  tables_tgz
done
step "full bench after"; timeout 540 bash benchmarks/gpu_session/cli.sh bench --out "$R/full" 2>&1 \
  | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ $SECONDS -lt 1500 ]; then
  ab fp16_dot fp16_dot_small --shapes qwen3-30b-a3b deepseek-v2-lite --m 1,2,4,8 --rounds 3 --warm-s 0.5
  tables_tgz
fi
step "done"; echo CHAIN_DONE
