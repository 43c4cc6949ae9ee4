#!/bin/bash
# NOTES items 67-68: the align kernel's GPU tests and its launch in the decode breakdown, then a
# prefill re-tune of the large-expert shapes at M=512-2048 (merged into the shipped tables; the entry
# serving M now is timed first) and the kernel bench at the prefill M on the resulting tables.
source benchmarks/gpu_session/common.sh "$1"
step "align tests";  timeout 120 python3 -m pytest -q -m gpu tests/ -k "align or pairs" -p no:cacheprovider 2>&1 | tail -3
step "breakdown";    timeout 120 python3 benchmarks/decode_breakdown.py --out "$R" 2>&1 | grep -v -i warn | tail -14
step "tune prefill"; for shape in 8,4096,14336,2 8,6144,16384,2 16,4096,14336,2; do
                       timeout 90 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D \
                         --budget-s 60 --no-progress --m 512,1024,2048 2>&1 | grep -E " M=|took|rror"
                     done
tables_tgz
step "bench prefill"; timeout 200 python3 benchmarks/bench_kernel.py --m 256,512,1024,2048,4096,8192 --out "$R" 2>&1 | tail -34
step "done"; echo CHAIN_DONE
