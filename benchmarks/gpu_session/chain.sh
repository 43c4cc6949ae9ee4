#!/bin/bash
# The measurements of benchmarks/NOTES.md "Next GPU session", in order of need, each with its own time
# limit, sized for one session's 30 minutes of device time (machine start included): tests ~2 min,
# variant A/Bs ~5, align ~1, tuning ~8 (7 new shapes at 40 s of search each, plus the decode M of the
# two shipped tables again with the variants), full bench ~3, e2e (batch 1 and 8) ~5.
R=$1
export PYTHONPATH=$PWD/src
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 240 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -15
step "variants";     timeout 180 python3 benchmarks/variant_ab.py split_k --m 1,2,4,8,16 --out "$R"
                     timeout 100 python3 benchmarks/variant_ab.py pairs --m 1,2 --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b --out "$R"
                     timeout 150 python3 benchmarks/variant_ab.py fuse --m 1024,8192 --shapes mixtral-8x7b qwen3-30b-a3b --out "$R"
step "align";        timeout 120 python3 benchmarks/align_ab.py --out "$R"
step "tune";         mkdir -p "$R/configs"; cp src/experts_int8/kernels/configs/*.json "$R/configs/"  # merged into
for shape in "8,6144,16384,2" "16,4096,14336,2" "64,2048,1408,6" "8,4096,14336,2 --tp 2" "8,4096,14336,2 --tp 4" \
             "8,6144,16384,2 --tp 2" "8,6144,16384,2 --tp 4"; do
  timeout 150 bash benchmarks/gpu_session/cli.sh tune --shape $shape --out-dir "$R/configs" --budget-s 40 --no-progress \
    --m 1,2,4,8,16,32,64,128,256,512,1024,2048,4096 2>&1 | tail -3
done
for shape in "8,4096,14336,2" "128,2048,768,8"; do
  timeout 90 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir "$R/configs" --budget-s 30 \
    --no-progress --m 1,2,4,8,16 2>&1 | tail -8
done
step "bench_kernel"; cp "$R"/configs/*.json src/experts_int8/kernels/configs/
                     timeout 360 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -80
step "e2e";          timeout 420 bash benchmarks/gpu_session/cli.sh bench-e2e --config mixtral-8x7b --random-weights --decode loop \
                       --batch 1,8 --reps 2 --out "$R" 2>&1 | grep -v -i warn
step "done"; echo CHAIN_DONE
