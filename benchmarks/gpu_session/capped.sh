#!/bin/bash
# NOTES item 92 (ran at bd2803f; register_cap and the variants down_gluon 5 and fused_tiles 7 were reverted after
# it, since nothing won): two 8-warp programs a SM with registers capped, down GEMM alone (down_gluon 5), folded,
# then both GEMMs (fused_tiles 7) on top, folded (configs.tgz); the bench; the Gluon GPU tests.
source benchmarks/gpu_session/common.sh "$1"
S="mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite"
step "down_gluon 5"; timeout 200 python3 benchmarks/variant_ab.py down_gluon --values 0,5 --m 1024,2048,4096,8192 \
    --out "$R" --shapes $S 2>&1 | grep -v -i warn | tail -22
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_down_gluon.json" --out-dir $D
step "fused_tiles 7"; timeout 200 python3 benchmarks/variant_ab.py fused_tiles --values 0,7 --m 1024,2048,4096,8192 \
    --out "$R" --shapes $S 2>&1 | grep -v -i warn | tail -22
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_fused_tiles.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 200 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "gluon gpu tests"; timeout 240 python3 -m pytest -q -m gpu tests/test_gpu.py -k gluon -p no:cacheprovider 2>&1 | tail -4
step "done"; echo CHAIN_DONE
