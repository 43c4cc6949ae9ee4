#!/bin/bash
# The next GPU session's measurements (benchmarks/NOTES.md "Next GPU session"), most informative first,
# each with its own time limit: every GPU test ~5 min; the register form in the dense Gluon probe ~1 and
# in the MoE gate/up probe ~1.5; the decode layers taken apart launch by launch ~1.5; a prefill re-tune
# of the five shapes' int8 entries with the tuner's GLUON candidates ~5; a decode re-tune (SUM_LAST with
# splits of I among the variants) ~4; the full kernel bench on the new tables ~2.5. Tables come back as
# configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests";    timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -8
step "gluon probe";  timeout 150 python3 benchmarks/gluon_w8a16_probe.py --kernels db,rr,rr2 --out "$R" 2>&1 | grep -v Warn | tail -22
step "moe rr probe"; timeout 150 python3 benchmarks/gluon_moe_rr_probe.py --out "$R" 2>&1 | grep -v Warn | tail -6
step "breakdown";    timeout 120 python3 benchmarks/decode_breakdown.py --out "$R" 2>&1 | grep -v -i warn | tail -14
step "tune prefill"; for shape in 8,4096,14336,2 8,6144,16384,2 16,4096,14336,2 128,2048,768,8 64,2048,1408,6; do
                       timeout 60 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D \
                         --budget-s 45 --no-progress --m 512,1024,2048,4096,8192 2>&1 | grep -E " M=|took|rror"
                     done
step "tune decode";  for shape in 128,2048,768,8 64,2048,1408,6; do
                       timeout 50 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D \
                         --budget-s 35 --no-progress --m 1,2,4,8 2>&1 | grep -E " M=|took|rror"
                     done
                     for shape in 8,4096,14336,2 8,6144,16384,2 16,4096,14336,2; do  # the 85% / 1.8x margins
                       timeout 45 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D \
                         --budget-s 30 --no-progress --m 1,2,4 2>&1 | grep -E " M=|took|rror"
                     done
                     tar czf "$R/configs.tgz" $D/*.json
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
