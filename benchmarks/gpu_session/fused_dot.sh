#!/bin/bash
# NOTES item 155: FUSED_DECODE as tensor-core dots. Its GPU tests, then variant_ab fused_decode on the small
# shapes' decode rows (three settled rounds), the fold, the decode rows of those shapes.
# start.sh fused_dot.sh, then wait.sh (~5 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
rm -rf "$R/ab"; mkdir -p "$R/ab"  # a warm machine keeps the last chain's results
step "GPU tests"; timeout 200 python3 -m pytest -q -x tests/test_gpu.py -k "fused_decode" 2>&1 | tail -5
step "A/B fused_decode"; timeout 300 python3 benchmarks/variant_ab.py fused_decode --values 0,1,2,3,4 --rounds 3 \
    --out "$R/ab" --m 1,2,4,8 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -12
step "fold"; python3 benchmarks/fold_ab.py "$R/ab/variant_ab_fused_decode.json" --out-dir $D --min-gain 0.01
tables_tgz
step "decode bench"; timeout 120 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8 --no-plot \
    --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | tail -12
step "done"; echo CHAIN_DONE
