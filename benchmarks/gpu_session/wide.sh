#!/bin/bash
# NOTES item 71: wider gate_up tiles at decode on the large-expert shapes.
source benchmarks/gpu_session/common.sh "$1"
step "wide"; timeout 200 python3 benchmarks/variant_ab.py wide --m 1,2,4 --out "$R" \
               --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -10
step "done"; echo CHAIN_DONE
