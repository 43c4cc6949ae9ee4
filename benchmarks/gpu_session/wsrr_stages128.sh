#!/bin/bash
# NOTES item 111: the 128-row register-form tile with a ring of 5 at M=256-512 on the large-expert shapes
# (A/B shipped / WSRR entries on 5 stages / every prefill entry on the 128-row tile with 5), folded where
# one wins by 2%, then the kernel bench and the TP shards' bench on the tables. ~6 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "A/B"; timeout 200 python3 benchmarks/variant_ab.py wsrr_stages --values 0,2,4 --out "$R" \
    --m 256,512 --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -8
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_wsrr_stages.json" --out-dir $D
tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
mkdir -p "$R/tp"; step "bench_kernel TP shards"; timeout 200 python3 benchmarks/bench_kernel.py --shapes 8:4096:7168:2 8:4096:3584:2 \
    8:6144:8192:2 8:6144:4096:2 --m 256,512,1024,2048,4096,8192 --out "$R/tp" 2>&1 | tail -28
step "done"; echo CHAIN_DONE
