#!/bin/bash
# NOTES item 98's outcome: the non-persistent WSRR kernels restored; their GPU tests, then the full bench.
source benchmarks/gpu_session/common.sh "$1"
step "wsrr tests"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k "wsrr or gluon_entry" -p no:cacheprovider 2>&1 | tail -5
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
