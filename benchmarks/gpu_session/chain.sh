#!/bin/bash
# The next GPU session's measurements (benchmarks/NOTES.md "Next GPU session"), each with its own time
# limit: GPU tests ~5 min (the Gluon kernels compile for every activation, dtype and tile shape), the
# GLUON A/B at prefill sizes ~2, the FUSED_DECODE A/B ~2, a small-expert decode re-tune ~2, the Gluon
# W8A16 probe in both forms ~2, the full kernel bench ~1.
R=$1
export PYTHONPATH=$PWD/src
D=src/experts_int8/kernels/configs
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 300 python3 -m pytest -q -m gpu tests/ -k "not gluon" -p no:cacheprovider 2>&1 | tail -8
step "gluon tests";  # apart: kernels never run on a GPU before; a hang here must not cost the rest
                     timeout 360 python3 -m pytest -q -m gpu tests/ -k gluon -p no:cacheprovider >"$R/gluon_tests.log" 2>&1
                     gluon_ok=$?; tail -12 "$R/gluon_tests.log"
step "gluon a/b";    if [ $gluon_ok = 0 ]; then
                       timeout 300 python3 benchmarks/variant_ab.py gluon --m 256,512,1024,2048,4096,8192 --out "$R" \
                         --shapes mixtral-8x7b mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite
                     else echo "skipped: the Gluon GPU tests did not pass"; fi
step "fused decode"; timeout 240 python3 benchmarks/variant_ab.py fused_decode --m 1,2,4,8 --out "$R" \
                       --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b
step "tune small"; # small-expert decode again, FUSED_DECODE now among the variants (tables come back as configs.tgz)
                     for shape in 128,2048,768,8 64,2048,1408,6; do
                       timeout 120 bash benchmarks/gpu_session/cli.sh tune --shape $shape --dtypes int8 --out-dir $D \
                         --budget-s 40 --no-progress --m 1,2,4,8 2>&1 | grep -E " M=|took|rror"
                     done
                     tar czf "$R/configs.tgz" $D/*.json
step "gluon probe";  timeout 240 python3 benchmarks/gluon_w8a16_probe.py --out "$R" 2>&1 | grep -v Warn | tail -16
step "bench_kernel"; timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
