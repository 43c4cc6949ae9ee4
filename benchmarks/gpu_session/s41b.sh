#!/bin/bash
# NOTES item 208: the int8 prefill heuristic on the register form, on shapes no table holds (so the heuristic
# serves both formats on any card): the Triton heuristic's blocks against WSRR on the 256- and 128-row tiles,
# then the bench of both formats on the heuristic. start.sh s41b.sh, then wait.sh 200 (~3 minutes warm).
source benchmarks/gpu_session/common.sh "$1"
mkdir -p "$R/wsrr_heuristic"; step "A/B wsrr on the heuristic (2: Triton blocks, 1: WSRR 256, 3: WSRR 128)"
timeout 130 python3 benchmarks/variant_ab.py wsrr --out "$R/wsrr_heuristic" --shapes 8:4096:14400:2 64:2048:1472:6 \
  --m 1024,4096 --values 2,1,3 2>&1 | grep -v -i warn
step "bench on the heuristic (both formats; int8 on its Triton blocks while the WSRR threshold is off)"
timeout 90 bash benchmarks/gpu_session/cli.sh bench --shapes 8:4096:14400:2,64:2048:1472:6 --m 1024,4096 --no-plot \
  --out "$R/bench_heuristic" 2>&1 | grep -E "^E|Error|error"
step "done"; echo CHAIN_DONE
