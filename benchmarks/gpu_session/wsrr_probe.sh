#!/bin/bash
# NOTES item 94: the warp-specialized register form (gluon_w8a16_probe.py --kernels wsrr) against db and
# rr2 on the probe's dense shapes (mixtral-8x7b's per-expert gate_up and down), every result checked
# against torch; configs are tokens x weight rows x K tile x stages x consumer warps.
source benchmarks/gpu_session/common.sh "$1"
step "wsrr probe"; timeout 500 python3 benchmarks/gluon_w8a16_probe.py --kernels db,rr2,wsrr --out "$R" \
    --configs 256x128x64x4x8,256x128x64x3x8,128x128x64x4x8,256x64x64x4x4,128x64x64x4x4 2>&1 | grep -v -i warn | tail -24
step "done"; echo CHAIN_DONE
