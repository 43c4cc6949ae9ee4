#!/bin/bash
# The GPU tests the twenty-eighth session's final step did not reach (the register-form and tail-pass
# cases of test_gpu.py) and the PDL prefetch tests (the folded 8x7b M=2 entry runs PDL form 2 with one
# prefetched tile), then three full settled benches (the README's table). start.sh final29.sh, wait.sh twice.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py tests/test_pdl_prefetch.py \
    -k "wsrr or tail_pass or pdl or prefetch" -p no:cacheprovider 2>&1 | tail -4
for run in 1 2 3; do
  step "bench $run"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R/run$run" $([ $run = 1 ] || echo --no-plot) \
    2>&1 | tail -3
done
step "done"; echo CHAIN_DONE
