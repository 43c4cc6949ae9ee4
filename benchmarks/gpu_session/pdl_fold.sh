#!/bin/bash
# NOTES item 146: PDL as a config key, four decode entries folded: the GPU tests of PDL and of the align
# kernel (which now always lets its dependent in), then the decode rows of every shape (M = 1-16, settled).
# start.sh pdl_fold.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests"; timeout 90 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
  -k "programmatic or align or kernel_variants" 2>&1 | tail -2
step "decode bench"; timeout 200 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -28
step "done"; echo CHAIN_DONE
