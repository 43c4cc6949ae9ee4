#!/bin/bash
# The next GPU session's measurements (benchmarks/NOTES.md "Next GPU session"), each with its own time
# limit: GPU tests ~2 min, the Gluon W8A16 probe in both forms (item 42) ~1-2, the full kernel bench ~1.
R=$1
export PYTHONPATH=$PWD/src
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
step "gpu tests";    timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -8
step "gluon probe";  timeout 240 python3 benchmarks/gluon_w8a16_probe.py --out "$R" 2>&1 | grep -v Warn | tail -16
step "bench_kernel"; timeout 420 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
