#!/bin/bash
# The 8-warp 128x128 Gluon tiles with 4 stages (value 5) against the tables, M=256 included; the winners
# folded into the int8 tables, then the full kernel bench on them (tables back as configs.tgz).
source benchmarks/gpu_session/common.sh "$1"
step "gluon a/b";    timeout 200 python3 benchmarks/variant_ab.py gluon --values 0,3,5 --m 256,512,1024,2048,4096,8192 \
                       --out "$R" --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini
                     mv "$R/variant_ab_gluon.json" "$R/variant_ab_gluon_large.json"
                     timeout 80 python3 benchmarks/variant_ab.py gluon --values 0,3,5 --m 1024,2048,4096,8192 --out "$R" \
                       --shapes qwen3-30b-a3b deepseek-v2-lite
step "fold";         for f in "$R"/variant_ab_gluon*.json; do python3 benchmarks/fold_ab.py "$f" --out-dir $D; done
                     tables_tgz
step "bench_kernel"; timeout 200 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
