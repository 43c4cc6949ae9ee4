#!/bin/bash
# The next GPU session's measurements (benchmarks/NOTES.md "Next GPU session"), in order of need, each
# with its own time limit: tests ~2 min, DEDUP_PAIRS A/B ~2, int8 decode re-tune ~4 and its bench ~1,
# e2e in max-autotune mode (three columns, batch 1) ~5, DEQUANT_ONCE A/B ~2, full kernel bench
# ~3, where a decode step's time goes ~4. Tuned tables are written into the package copy and come back as configs.tgz
# (their file names do not survive $OUT).
R=$1
export PYTHONPATH=$PWD/src
D=src/experts_int8/kernels/configs
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -8
step "dedup";        timeout 240 python3 benchmarks/variant_ab.py dedup --m 2,4,8,16,32 --out "$R" \
                       --shapes mixtral-8x7b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite
step "tune";         # decode again: the one-launch sum made split-K cheaper, DEDUP_PAIRS is new
                     for shape in 8,4096,14336,2 8,6144,16384,2 16,4096,14336,2 128,2048,768,8 64,2048,1408,6; do
                       timeout 100 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D \
                         --budget-s 40 --no-progress --m 1,2,4,8,16 2>&1 | grep -E " M=|took|rror"
                     done
step "bench decode"; timeout 150 python3 benchmarks/bench_kernel.py --m 1,2,4,8,16,32,64 --out "$R" 2>&1 | tail -38
                     tar czf "$R/configs.tgz" $D/*.json
step "e2e";          timeout 600 bash benchmarks/gpu_session/cli.sh bench-e2e --config mixtral-8x7b --random-weights \
                       --decode loop --batch 1 --reps 2 --compile-mode max-autotune --out "$R" 2>&1 \
                       | grep -E "batch|tok/s|wrote|rror"
step "dequant";      timeout 200 python3 benchmarks/variant_ab.py dequant --m 1024,2048,4096,8192 --out "$R" \
                       --shapes mixtral-8x7b mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite
step "bench_kernel"; timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "decode step";  for column in ours-int8 ours-bf16; do
                       timeout 300 python3 benchmarks/decode_step_diag.py --column $column --compile-mode max-autotune \
                         --out "$R" 2>&1 | tail -9
                     done
step "done"; echo CHAIN_DONE
