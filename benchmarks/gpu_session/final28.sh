#!/bin/bash
# Every GPU test on the session's final kernels and tables, then three full settled benches (the README's
# table: run 1, runs 2-3 beside it). start.sh final28.sh, then wait.sh twice (~10 minutes).
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 400 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -6
for run in 1 2 3; do
  step "bench $run"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R/run$run" $([ $run = 1 ] || echo --no-plot) \
    2>&1 | tail -3
done
step "done"; echo CHAIN_DONE
