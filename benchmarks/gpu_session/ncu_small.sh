#!/bin/bash
# NOTES item 91: ncu.sh's sections on the small-expert prefill GEMMs, int8 (Gluon) against bf16.
NCU_CASES="qwen3_m4096_int8 qwen3-30b-a3b 4096 int8
qwen3_m4096_bf16 qwen3-30b-a3b 4096 bf16" source benchmarks/gpu_session/ncu.sh "$1"
