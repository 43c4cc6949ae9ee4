#!/bin/bash
# Re-tune the decode token counts with the tuner timing CUDA-graph replays (the first tables of
# 8x22b, jamba, deepseek and the TP shards were searched with eager timing, which measures the host
# at these sizes), straight into the shipped tables (merged; the entry serving M now is the baseline),
# then the kernel benchmark at those M. One device call: stops starting new tunes after $1 seconds.
export PYTHONPATH=$PWD/src
D=src/experts_int8/kernels/configs
stop_at=${1:-300}
timeout 90 python3 -m pytest -q -m gpu tests/test_bench_tune.py -k tune -p no:cacheprovider 2>&1 | tail -2
for shape in "8,4096,14336,2" "16,4096,14336,2" "8,6144,16384,2" "128,2048,768,8" "64,2048,1408,6" \
             "8,4096,14336,2 --tp 2" "8,6144,16384,2 --tp 2" "8,4096,14336,2 --tp 4" "8,6144,16384,2 --tp 4"; do
  [ $SECONDS -gt $stop_at ] && { echo "skipped (time): $shape"; continue; }
  echo "--- tune $shape ($SECONDS s)"
  timeout 90 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D --budget-s 20 \
    --no-progress --m 1,2,4,8,16,32,64 2>&1 | grep -E "int8 M=|took|Error|error"
done
tar czf "$OUT/configs.tgz" $D/*.json
echo "--- bench ($SECONDS s)"
timeout 130 python3 benchmarks/bench_kernel.py --m 1,2,4,8,16,32,64,128 --out "$OUT" 2>&1 | tail -42
echo "total $SECONDS s"
