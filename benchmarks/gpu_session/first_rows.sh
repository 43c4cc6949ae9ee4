#!/bin/bash
# NOTES item 139: is the warm-cache bench's slower M=1 row the order (timed straight after the weight
# pool's fill) or noise? The full bench with Triton's cache cold, the same with it warm, then warm with
# 8x22b alone. One device call on a fresh machine: bash benchmarks/gpu_session/first_rows.sh
export PYTHONPATH=$PWD/src
rows() { grep -E "^(mixtral|jamba|qwen|deepseek)" | awk '$2 <= 2'; }
for run in cold warm; do
  echo "=== $run ($(date +%T))"; timeout 240 python3 benchmarks/bench_kernel.py --out "$OUT" --no-plot 2>&1 | rows
done
echo "=== warm, 8x22b alone"; timeout 60 python3 benchmarks/bench_kernel.py --out "$OUT" --no-plot \
  --shapes mixtral-8x22b --m 1,2,4 2>&1 | rows
