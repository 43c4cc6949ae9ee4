#!/bin/bash
# NOTES item 112: items 110-111's ring-depth folds settled by interleaved rounds (variant_ab --rounds 3:
# shipped / WSRR entries on 5 stages / on 4, medians), folded where one wins by 2%, then the kernel bench.
source benchmarks/gpu_session/common.sh "$1"
mkdir -p "$R/large" "$R/tp"
step "A/B large experts"; timeout 280 python3 benchmarks/variant_ab.py wsrr_stages --values 0,2,5 --rounds 3 \
    --out "$R/large" --m 256,512,1024,2048 --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini 2>&1 | grep -v -i warn | tail -12
step "A/B TP shards"; timeout 200 python3 benchmarks/variant_ab.py wsrr_stages --values 0,2,5 --rounds 3 --out "$R/tp" \
    --m 256,4096 --shapes 8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2 2>&1 | grep -v -i warn | tail -8
step "fold"; for g in large tp; do python3 benchmarks/fold_ab.py "$R/$g/variant_ab_wsrr_stages.json" --out-dir $D; done
tables_tgz
step "bench_kernel"; timeout 240 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
