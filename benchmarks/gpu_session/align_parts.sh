#!/bin/bash
# NOTES item 121: the chunked align step's launches one at a time (probe). ~1 minute.
source benchmarks/gpu_session/common.sh "$1"
step "probe"; timeout 200 python3 benchmarks/align_parts_probe.py --out "$R" 2>&1 | grep -v -i warn | tail -6
step "done"; echo CHAIN_DONE
