#!/bin/bash
# Session 37, second chain: the fixed validation test and the tuner on both forms (GPU), then Nemotron 3 Nano's
# experts shape tuned without a gate (int8 and bf16, the tuner's default budget) and ungated_decode.py again
# on the new tables (NOTES item 193 has the prediction). start.sh s37b.sh, then wait.sh 570 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
t() { timeout "$1" python3 -m pytest -q -n 12 -p no:cacheprovider -rfE "${@:2}" 2>&1 | tail -6; }
step "tests"; t 200 tests/test_validation.py; t 200 -m gpu tests/test_bench_tune.py
step "tune 128,2688,1856,6 without a gate"; timeout 480 bash benchmarks/gpu_session/cli.sh tune \
  --shape 128,2688,1856,6 --no-gate --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|tuning|Error|error" | tail -30
tables_tgz
step "ungated decode and prefill vs bf16, tuned"; timeout 400 python3 benchmarks/ungated_decode.py --out "$R/ungated_tuned.json"
step "done"; echo CHAIN_DONE
