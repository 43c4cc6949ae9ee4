#!/bin/bash
# The measurements of benchmarks/NOTES.md "Next GPU session", in order, each with its own time limit.
# Expected: tests ~2 min, variants ~6, align ~1, lookup ~2, tune ~11 (7 shapes x ~90 s), bench ~2,
# e2e ~7: about 31 minutes, so the e2e step (last) only fits when the earlier ones run short.
R=$1
export PYTHONPATH=$PWD/src
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 420 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -15
step "variants";     for v in "split_k --m 1,2,4,8,16" "pairs --m 1,2" "fuse --m 256,1024,4096,8192"; do
                       timeout 300 python3 benchmarks/variant_ab.py $v --out "$R"; done
step "align";        timeout 200 python3 benchmarks/align_ab.py --out "$R"
step "lookup";       timeout 300 python3 benchmarks/lookup_ab.py --out "$R" | tail -20
step "tune";         mkdir -p "$R/configs"
for shape in "8,6144,16384,2" "16,4096,14336,2" "64,2048,1408,6" "8,4096,14336,2 --tp 2" "8,4096,14336,2 --tp 4" \
             "8,6144,16384,2 --tp 2" "8,6144,16384,2 --tp 4"; do
  timeout 400 bash benchmarks/gpu_session/cli.sh tune --shape $shape --out-dir "$R/configs" --budget-s 60 --no-progress \
    --m 1,2,4,8,16,32,64,128,256,512,1024,2048,4096 2>&1 | tail -4
done
step "bench_kernel"; cp "$R"/configs/*.json src/experts_int8/kernels/configs/ 2>/dev/null
                     timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -80
step "e2e";          timeout 900 bash benchmarks/gpu_session/cli.sh bench-e2e --config mixtral-8x7b --random-weights --decode loop --out "$R" 2>&1 \
                       | grep -v -i warn
step "done"; echo CHAIN_DONE
