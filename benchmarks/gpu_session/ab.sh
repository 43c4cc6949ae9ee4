#!/bin/bash
# The Gluon and FUSED_DECODE A/Bs, their winners folded into the int8 tables (benchmarks/fold_ab.py,
# >= 2% faster than the shipped config), then the full kernel bench on the folded tables. The tables
# come back as configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
step "gluon a/b";    timeout 330 python3 benchmarks/variant_ab.py gluon --m 256,512,1024,2048,4096,8192 --out "$R" \
                       --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite
step "fused decode"; timeout 200 python3 benchmarks/variant_ab.py fused_decode --m 1,2,4,8 --out "$R" \
                       --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b
step "fold";         for v in gluon fused_decode; do
                       [ -f "$R/variant_ab_$v.json" ] && python3 benchmarks/fold_ab.py "$R/variant_ab_$v.json" --out-dir $D
                     done
                     tables_tgz
step "bench_kernel"; timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
