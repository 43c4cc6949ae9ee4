#!/bin/bash
# NOTES item 105: the register-form kernels with a tail pass on the small-expert shapes (A/B shipped /
# WSRR 256 + TAIL 32 / + TAIL 64 / WSRR 128 + TAIL 32), folded where one wins by 2%, then the kernel bench.
source benchmarks/gpu_session/common.sh "$1"
step "A/B"; timeout 300 python3 benchmarks/variant_ab.py wsrr_tail --values 0,1,2,3 --out "$R" \
    --m 2048,4096,8192 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -10
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_wsrr_tail.json" --out-dir $D
tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
