#!/bin/bash
# The register-form entries for the tensor-parallel shards' tables (mixtral-8x7b and 8x22b at TP=2 and 4:
# I = 7168, 3584, 8192, 4096): the A/B of shipped, WSRR 256-row and 128-row at prefill sizes, folded
# where one wins by 2%; then the kernel bench on the main tables (a second run of wsrr128.sh's tables).
# ~5 minutes: one wait call.
source benchmarks/gpu_session/common.sh "$1"
step "wsrr A/B, TP shards"; timeout 300 python3 benchmarks/variant_ab.py wsrr --values 0,1,3 --out "$R" \
    --m 256,512,1024,2048,4096,8192 --shapes 8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2 2>&1 \
    | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_wsrr.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 240 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
