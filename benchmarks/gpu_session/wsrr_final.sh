#!/bin/bash
# NOTES item 112: each register-form tile on its own ring (4 slots on 256 rows, 5 on 128) with the tables'
# WSRR_STAGES entries dropped: the GPU tests of the register form and the tail pass, then the kernel bench
# and the TP shards' bench. ~6 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 240 python3 -m pytest -q -m gpu tests/test_gpu.py -k "wsrr or tail" -p no:cacheprovider 2>&1 | tail -4
step "bench_kernel"; timeout 200 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
mkdir -p "$R/tp"; step "bench_kernel TP shards"; timeout 100 python3 benchmarks/bench_kernel.py --shapes 8:4096:7168:2 \
    8:4096:3584:2 8:6144:8192:2 8:6144:4096:2 --m 256,512,1024,2048,4096,8192 --out "$R/tp" 2>&1 | tail -28
step "done"; echo CHAIN_DONE
