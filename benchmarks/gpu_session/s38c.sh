#!/bin/bash
# Session 38, third chain: experts without a gate read tables of their own (`...,no_gate.json`; NOTES item
# 196): the GPU tests of the Gluon, WSRR and ungated paths, the tuner on both forms, the nemotron_h row
# through the kernel, then ungated_decode.py (the gated rows of that shape now on the heuristic).
# start.sh s38c.sh, then wait.sh 560 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "tests"; timeout 300 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py tests/test_gluon.py \
  -k "gluon or wsrr or gate or relu2" 2>&1 | tail -4
step "tuner and nemotron_h tests"; timeout 200 python3 -m pytest -q -n 4 -p no:cacheprovider -rfE \
  tests/test_bench_tune.py tests/test_transformers.py tests/test_cli.py -k "tune_runs_on_gpu or nemotron or own" 2>&1 | tail -4
step "ungated decode and prefill vs bf16"; timeout 240 python3 benchmarks/ungated_decode.py --out "$R/ungated_no_gate_tables.json"
step "done"; echo CHAIN_DONE
