#!/bin/bash
# NOTES item 139's lead: 8x22b M=1 read 152-155 µs in some full benches and 171-175 in others (its new
# entry; alone it reads 152.8-152.9 every time). Six processes, each the bench in its full order for the
# first two shapes (8x7b, then 8x22b) at M=1-2, alternating the shipped 8x22b table with 8fa6454's
# (through EXPERTS_INT8_CACHE), the GPU's clocks and power read before each. One device call (~3 min):
#   EXPERTS_INT8_COMMIT=<sha> bash benchmarks/gpu_session/slow_mode.sh
export PYTHONPATH=$PWD/src
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader; }
for i in 1 2 3; do
  for v in new old; do
    if [ $v = old ]; then export EXPERTS_INT8_CACHE=$PWD/benchmarks/gpu_session/tables_8fa6454; else unset EXPERTS_INT8_CACHE; fi
    echo "=== $v $i  clocks: $(clocks)"
    timeout 90 python3 benchmarks/bench_kernel.py --out "$OUT/$v$i" --no-plot --shapes mixtral-8x7b mixtral-8x22b \
      --m 1,2 2>&1 | grep -E "^mixtral"
  done
done
echo "=== after  clocks: $(clocks)"
