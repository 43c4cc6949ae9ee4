#!/bin/bash
# The tuner's and the bench's GPU tests, then three full settled benches on the shipped tables (the README's table: run 1,
# runs 2-3 beside it). start.sh bench3.sh, then wait.sh (~6 minutes).
source benchmarks/gpu_session/common.sh "$1"
step "tuner test"; timeout 200 python3 -m pytest -q -m gpu tests/test_bench_tune.py -k "tune_runs or bench_runs" -p no:cacheprovider 2>&1 | tail -1
for run in 1 2 3; do
  step "bench $run"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R/run$run" $([ $run = 1 ] || echo --no-plot) \
    2>&1 | tail -3
done
step "done"; echo CHAIN_DONE
