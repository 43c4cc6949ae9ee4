#!/bin/bash
# Ran at ad9712e (results/wsrr1_probe/) and needs that commit: these kernels became the library's
# kernels/gluon_wsrr.py and left the probe.
# NOTES item 96: the MoE gate/up with one accumulator (gate and up rows interleaved 8 apart; tiles with the
# suffix i, ip: h written K-permuted), on unrepacked weights with K-permuted activations, against the
# library's int8 and bf16 gate/up and item 95's two-accumulator tile; then the down GEMM at 256 pair rows.
source benchmarks/gpu_session/common.sh "$1"
step "wsrr1 moe gate_up"; timeout 330 python3 benchmarks/gluon_moe_rr_probe.py --m 512,1024,2048,4096,8192 --out "$R" \
    --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite \
    --tiles 256x64x4x8i,256x64x3x8i,128x64x4x8i,256x64x4x8ip,128x128x4x8w 2>&1 | grep -v -i warn | tail -25
step "wsrr moe down"; timeout 200 python3 benchmarks/gluon_moe_rr_probe.py --gemm down --m 512,2048,4096,8192 --out "$R" \
    --shapes mixtral-8x7b mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite --tiles 256x128x4x8w,256x128x3x8w,128x128x4x8w \
    2>&1 | grep -v -i warn | tail -16
step "done"; echo CHAIN_DONE
