#!/bin/bash
# The next GPU session's measurements (benchmarks/NOTES.md "Next GPU session"), in order of need, each
# with its own time limit: tests ~3 min, PDL and SUM_TOPK A/Bs ~2, full bench ~2, decode tuning ~6,
# bench of the re-tuned decode rows ~1, e2e (batch 1 and 8) ~5. Tuned tables are written into the
# package copy and come back as configs.tgz (their file names do not survive $OUT).
R=$1
export PYTHONPATH=$PWD/src
D=src/experts_int8/kernels/configs
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -15
step "pdl";          timeout 200 python3 benchmarks/variant_ab.py pdl --m 1,2,4,16,256 --out "$R"
                     timeout 150 python3 benchmarks/variant_ab.py sum_topk --m 1,2 --out "$R" \
                       --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite
step "bench_kernel"; timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -80
step "tune";         for shape in "8,6144,16384,2 --tp 4 --dtypes int8"; do
                       timeout 90 bash benchmarks/gpu_session/cli.sh tune --shape $shape --out-dir $D --budget-s 20 \
                         --no-progress --m 1,2,4,8,16,32,64 2>&1 | grep -E " M=|took|rror"
                     done
                     # the decode entries that matter most again, now with SUM_TOPK among the variants
                     for shape in 8,4096,14336,2 8,6144,16384,2 16,4096,14336,2 128,2048,768,8 64,2048,1408,6; do
                       timeout 90 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D \
                         --budget-s 30 --no-progress --m 1,2,4 2>&1 | grep -E " M=|took|rror"
                     done
step "bench decode"; timeout 150 python3 benchmarks/bench_kernel.py --m 1,2,4,8,16,32,64 --out "$R" 2>&1 | tail -40
step "refresh";      python3 benchmarks/refresh_tables.py "$R"/bench_kernel_*.json  # full run + decode run (same routing)
                     tar czf "$R/configs.tgz" $D/*.json
step "e2e";          timeout 420 bash benchmarks/gpu_session/cli.sh bench-e2e --config mixtral-8x7b --random-weights --decode loop \
                       --batch 1,8 --reps 2 --out "$R" 2>&1 | grep -v -i warn
step "done"; echo CHAIN_DONE
