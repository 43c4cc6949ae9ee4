#!/bin/bash
# Re-tune the decode rows that moved past item 221's prediction on the routing draws (session 50's H100
# bench), straight into the shipped tables (merged; a new winner needs the tuner's confirmation), then
# bench those shapes' decode rows. One device call; stops starting new tunes after $1 seconds.
export PYTHONPATH=$PWD/src
D=src/experts_int8/kernels/configs
stop_at=${1:-330}
for spec in "8,4096,14336,2 2,4,8" "8,6144,16384,2 2,4,8" "128,2048,768,8 4,8" "16,4096,14336,2 16,32"; do
  set -- $spec
  [ $SECONDS -gt $stop_at ] && { echo "skipped (time): $spec"; continue; }
  echo "--- tune $1 M=$2 ($SECONDS s)"
  timeout 150 bash benchmarks/gpu_session/cli.sh tune --shape $1 --dtypes int8,bf16 --out-dir $D --budget-s 70 \
    --no-progress --m $2 2>&1 | grep -E "M=|took|Error|error"
done
tar czf "$OUT/configs.tgz" $D/*.json
echo "--- bench ($SECONDS s)"
timeout 150 python3 benchmarks/bench_kernel.py --shapes mixtral-8x7b mixtral-8x22b qwen3-30b-a3b jamba-1.5-mini \
  --m 2,4,8,16,32 --out "$OUT" 2>&1 | grep -E "^[a-z]|Error|error"
echo "total $SECONDS s"
