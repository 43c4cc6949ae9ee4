#!/bin/bash
# The full kernel bench alone (README's table), on the tables as committed.
source benchmarks/gpu_session/common.sh "$1"
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
