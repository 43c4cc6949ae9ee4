#!/bin/bash
# The next GPU session's measurements (benchmarks/NOTES.md "Next GPU session"), in order of need, each
# with its own time limit: tests ~2 min, DEDUP_PAIRS A/B ~2, e2e in max-autotune mode (three columns,
# batch 1 and 8) ~6, where a decode step's time goes (int8 and bf16 experts) ~4, full kernel bench ~3.
R=$1
export PYTHONPATH=$PWD/src
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -8
step "dedup";        timeout 240 python3 benchmarks/variant_ab.py dedup --m 2,4,8,16,32 --out "$R" \
                       --shapes mixtral-8x7b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite
step "e2e";          timeout 600 bash benchmarks/gpu_session/cli.sh bench-e2e --config mixtral-8x7b --random-weights \
                       --decode loop --batch 1,8 --reps 2 --compile-mode max-autotune --out "$R" 2>&1 \
                       | grep -E "batch|tok/s|wrote|rror"
step "decode step";  for column in ours-int8 ours-bf16; do
                       timeout 200 python3 benchmarks/decode_step_diag.py --column $column --compile-mode max-autotune \
                         --out "$R" 2>&1 | tail -9
                     done
step "bench_kernel"; timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
