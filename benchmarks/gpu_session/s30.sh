#!/bin/bash
# NOTES "Next GPU session (after the twenty-ninth)": the TMA fallback's tests on the GPU, three full settled
# benches on the bf16 tables with TMA (the README's table, replacing item 163's projection), then int8 on the
# bf16 baseline's own entries at the small-expert prefill rows (`variant_ab.py float_entry`, item 164), the
# fold. start.sh s30.sh, then wait.sh twice (~12 minutes); extract configs.tgz into src/experts_int8/kernels/configs.
source benchmarks/gpu_session/common.sh "$1"
step "tests"; timeout 120 python3 -m pytest -q tests/test_fused_experts.py -k "tma" -p no:cacheprovider 2>&1 | tail -2
for run in 1 2 3; do
  step "bench $run"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R/run$run" $([ $run = 1 ] || echo --no-plot) \
    2>&1 | tail -3
done
mkdir -p "$R/float_entry"
step "A/B float_entry"; timeout 240 python3 benchmarks/variant_ab.py float_entry --values 0,1,2,3 --rounds 2 \
    --m 2048,4096,8192 --shapes qwen3-30b-a3b deepseek-v2-lite --out "$R/float_entry" 2>&1 | grep -v -i warn | tail -8
step "fold"; python3 benchmarks/fold_ab.py "$R/float_entry/variant_ab_float_entry.json" --out-dir $D --min-gain 0.01
tables_tgz
step "done"; echo CHAIN_DONE
