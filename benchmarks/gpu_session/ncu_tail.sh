#!/bin/bash
# NOTES item 106's open question: ncu.sh's sections on deepseek M=4096's shipped Gluon entry (two GEMM
# launches a call) against WSRR 256 + a tail pass of up to 192 rows on the entry for 128 rows an expert
# (ncu_tail.json: four launches a call, the main pair then the tail pair).
NCU_CASES="deepseek_m4096_shipped deepseek-v2-lite 4096 int8 2
deepseek_m4096_wsrr_tail deepseek-v2-lite 4096 int8 4 benchmarks/gpu_session/ncu_tail.json" \
    source benchmarks/gpu_session/ncu.sh "$1"
