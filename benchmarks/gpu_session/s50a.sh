#!/bin/bash
# The fiftieth session's chain. First the tests changed since their last GPU run: test_parallel.py whole (a
# split module now checks its group's rank and size; transformers' expert-parallel refusal's fix), the commit
# test's fix, the torch path under torch.compile (an op of its own, cudagraph_unsafe), the routing draws, and
# the GPU-marked tuner tests (tune routes 16 draws at decode sizes). Then the
# full bench on the routing draws (item 221's prediction), after, on an H200, item 214's A/B and fold
# (s44b.sh's H200 branch, whose bench is that full bench).
# start.sh s50a.sh, then wait.sh 560 until CHAIN_DONE (~12-15 minutes warm); extract configs.tgz on an H200.
source benchmarks/gpu_session/common.sh "$1"
step "tests changed since their last GPU run"
timeout 450 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_parallel.py tests/test_compile.py \
  tests/test_bench_tune.py -k "test_parallel or test_compile or commit_is_reported or draws or runs_on_gpu or \
tune" 2>&1 | tail -15
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  CHAIN_NESTED=1 bash benchmarks/gpu_session/s44b.sh "$R"
else
  step "full bench on the routing draws"; timeout 540 bash benchmarks/gpu_session/cli.sh bench --out "$R/full" 2>&1 \
    | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
fi
step "done"; echo CHAIN_DONE
