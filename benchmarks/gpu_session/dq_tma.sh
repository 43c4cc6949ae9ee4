#!/bin/bash
# NOTES item 87: dequantize-once with TMA float GEMMs at M=4096-8192 on the large-expert shapes
# (variant_ab dequant, value 2), the winners folded into the int8 tables (back as configs.tgz), then
# the kernel bench of those rows, bf16 and int8 in one run.
source benchmarks/gpu_session/common.sh "$1"
S="mixtral-8x7b jamba-1.5-mini mixtral-8x22b"
step "dequant + tma"; timeout 240 python3 benchmarks/variant_ab.py dequant --m 4096,8192 --out "$R" --shapes $S \
    2>&1 | grep -v -i warn | tail -8
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_dequant.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 200 python3 benchmarks/bench_kernel.py --shapes $S --m 4096,8192 --out "$R" 2>&1 | tail -12
step "done"; echo CHAIN_DONE
