#!/bin/bash
# NOTES item 119: both decode GEMMs in one launch (probe). ~3 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "probe"; timeout 400 python3 benchmarks/one_launch_probe.py --out "$R" 2>&1 | grep -v -i warn | tail -12
step "done"; echo CHAIN_DONE
