#!/bin/bash
# Gluon tiles: the GPU test of 256-row blocks, the GLUON A/B with the 8-warp tiles (values 3, 4), the
# winners folded into the int8 tables, then the full kernel bench on them (tables back as configs.tgz).
source benchmarks/gpu_session/common.sh "$1"
step "gluon tests";  timeout 150 python3 -m pytest -q -m gpu tests/test_gpu.py -k "gluon and (bm256 or w8_s3)" -p no:cacheprovider 2>&1 | tail -4
step "gluon a/b";    timeout 240 python3 benchmarks/variant_ab.py gluon --m 512,1024,2048,4096,8192 --out "$R" \
                       --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini
                     mv "$R/variant_ab_gluon.json" "$R/variant_ab_gluon_large.json"
                     timeout 90 python3 benchmarks/variant_ab.py gluon --m 2048,4096,8192 --out "$R" \
                       --shapes qwen3-30b-a3b deepseek-v2-lite
step "fold";         for f in "$R"/variant_ab_gluon*.json; do python3 benchmarks/fold_ab.py "$f" --out-dir $D; done
                     tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
