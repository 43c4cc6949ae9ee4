#!/bin/bash
# Session 50's second call (~470 s of device time left). On an H200: #3's decode rows on the routing draws
# (M <= 16, every shape; the H200 tables were tuned on one draw a row, item 221). On an H100: re-tune the bf16
# mixtral-8x7b M=64 entry (slower than its M=128 row, item 222) and bench around it.
export PYTHONPATH=$PWD/src
D=src/experts_int8/kernels/configs
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 280 python3 benchmarks/bench_kernel.py --m 1,2,4,8,16 --out "$OUT" 2>&1 | grep -E "^[a-z]|Error|error"
else
  timeout 150 bash benchmarks/gpu_session/cli.sh tune --shape 8,4096,14336,2 --dtypes bf16 --out-dir $D \
    --budget-s 90 --no-progress --m 64 2>&1 | grep -E "M=|took|Error|error"
  tar czf "$OUT/configs.tgz" $D/*.json
  timeout 100 python3 benchmarks/bench_kernel.py --shapes mixtral-8x7b --m 32,64,128 --out "$OUT" 2>&1 \
    | grep -E "^[a-z]|Error|error"
fi
echo "total $SECONDS s"
