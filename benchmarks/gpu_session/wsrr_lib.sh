#!/bin/bash
# NOTES item 97: the library's WSRR kernels (kernels/gluon_wsrr.py): their GPU tests first, then every GPU
# test, then the full kernel bench (the shipped tables now carry WSRR entries).
source benchmarks/gpu_session/common.sh "$1"
step "wsrr tests";   timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k wsrr -p no:cacheprovider 2>&1 | tail -15
step "gpu tests";    timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -8
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
