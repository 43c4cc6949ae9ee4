#!/bin/bash
# NOTES item 120: deepseek 4096's down GEMM on the register form, launch by launch: WSRR 256, WSRR 128,
# WSRR 256 with a tail pass of up to 192 rows on the 128-row entry. ~2 minutes.
source benchmarks/gpu_session/common.sh "$1"
for v in wsrr=1 wsrr=3 wsrr_tail=4; do
    step "breakdown $v"; timeout 120 python3 benchmarks/decode_breakdown.py --out "$R" --m 4096 \
        --shapes deepseek-v2-lite --variant $v 2>&1 | grep -v -i warn | tail -2
done
step "done"; echo CHAIN_DONE
