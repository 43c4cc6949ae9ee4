#!/bin/bash
# The next GPU session's baseline (benchmarks/NOTES.md "Next GPU session"), each step with its own
# time limit: every GPU test ~3.5 min; the floor of a short stream and the decode layers launch by
# launch ~1.5 (what a new decode kernel is compared with); the full kernel bench ~2. A new kernel's
# A/B goes in before the bench.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests";    timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -8
step "stream floor"; timeout 120 python3 benchmarks/stream_floor.py --out "$R" 2>&1 | grep -v -i warn | tail -27
step "breakdown";    timeout 120 python3 benchmarks/decode_breakdown.py --out "$R" 2>&1 | grep -v -i warn | tail -14
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
