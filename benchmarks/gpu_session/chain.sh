#!/bin/bash
# The next GPU session's measurements (benchmarks/NOTES.md "Next GPU session"), each with its own time
# limit: GPU tests ~5 min (the Gluon kernels compile for every activation, dtype and tile shape), the GLUON A/B at
# prefill sizes ~2, FUSED_DECODE A/B ~2, the Gluon W8A16 probe in both forms ~2, the full kernel bench ~1.
R=$1
export PYTHONPATH=$PWD/src
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 540 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -12
step "gluon a/b";    timeout 300 python3 benchmarks/variant_ab.py gluon --m 256,512,1024,2048,4096,8192 --out "$R" \
                       --shapes mixtral-8x7b mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite
step "fused decode"; timeout 240 python3 benchmarks/variant_ab.py fused_decode --m 1,2,4,8 --out "$R" \
                       --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b
step "gluon probe";  timeout 240 python3 benchmarks/gluon_w8a16_probe.py --out "$R" 2>&1 | grep -v Warn | tail -16
step "bench_kernel"; timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
