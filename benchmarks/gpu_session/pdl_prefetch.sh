#!/bin/bash
# NOTES item 156: the down GEMM's wait for gate_up after its own loads and an L2 prefetch (down PDL_PREFETCH).
# Its GPU tests (and FUSED_DECODE's new one), then variant_ab pdl_prefetch on the decode rows of three shapes
# (three settled rounds), the fold, the decode rows of those shapes.
# start.sh pdl_prefetch.sh, then wait.sh twice (~7 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
rm -rf "$R/ab"; mkdir -p "$R/ab"  # a warm machine keeps the last chain's results
step "GPU tests"; timeout 240 python3 -m pytest -q tests/test_gpu.py -k "programmatic or prefetch or fused_decode" \
    2>&1 | tail -5
step "A/B pdl_prefetch"; timeout 480 python3 benchmarks/variant_ab.py pdl_prefetch --values 0,1,2,4,16 --rounds 3 \
    --out "$R/ab" --m 1,2,4,8,16 --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b 2>&1 | grep -v -i warn | tail -16
step "fold"; python3 benchmarks/fold_ab.py "$R/ab/variant_ab_pdl_prefetch.json" --out-dir $D --min-gain 0.01
tables_tgz
step "decode bench"; timeout 150 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot \
    --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b 2>&1 | tail -16
step "done"; echo CHAIN_DONE
