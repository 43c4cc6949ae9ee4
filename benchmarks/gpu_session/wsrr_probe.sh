#!/bin/bash
# Ran at 0d6c280 (results/wsrr_probe/). Its MoE steps need that commit: the probe's MoE wsrr kernels became
# the library's kernels/gluon_wsrr.py and left the probe.
# NOTES items 94-95: the warp-specialized register form, dense (gluon_w8a16_probe.py --kernels wsrr, against
# db and rr2 on mixtral-8x7b's per-expert gate_up and down; configs tokens x weight rows x K tile x stages x
# consumer warps) and as the MoE gate/up (gluon_moe_rr_probe.py, tiles with the suffix w, against the
# library's int8 and bf16 gate/up launches at the shipped configs), then the down GEMM so (--gemm down).
# Every result checked.
source benchmarks/gpu_session/common.sh "$1"
mkdir -p "$R/decode"
step "wsrr dense"; timeout 280 python3 benchmarks/gluon_w8a16_probe.py --kernels db,rr2,wsrr --out "$R" \
    --configs 256x128x64x4x8,256x128x64x3x8,128x128x64x4x8,256x64x64x4x4,128x64x64x4x4 2>&1 | grep -v -i warn | tail -24
step "wsrr moe gate_up"; timeout 240 python3 benchmarks/gluon_moe_rr_probe.py --m 512,2048,4096 --out "$R" \
    --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite --tiles 128x128x4x8w,128x128x3x8w,64x128x4x8w,128x64x4x4w \
    2>&1 | grep -v -i warn | tail -12
step "wsrr moe down"; timeout 200 python3 benchmarks/gluon_moe_rr_probe.py --gemm down --m 512,2048,4096 --out "$R" \
    --shapes mixtral-8x7b qwen3-30b-a3b deepseek-v2-lite --tiles 128x128x4x8w,128x128x3x8w,128x64x4x4w \
    2>&1 | grep -v -i warn | tail -12
step "wsrr moe gate_up at decode"; timeout 150 python3 benchmarks/gluon_moe_rr_probe.py --m 1,2,4 --out "$R/decode" \
    --shapes mixtral-8x7b qwen3-30b-a3b --tiles 16x64x8x4w,16x128x6x8w 2>&1 | grep -v -i warn | tail -8
step "done"; echo CHAIN_DONE
