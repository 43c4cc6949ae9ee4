#!/bin/bash
# The twenty-first session's last device call: the small-expert prefill rows launch by launch, int8 and
# bf16 (where deepseek 4096's 8-11% goes, NOTES item 120), then the full kernel bench on the tables as
# committed (README's table). ~5 minutes.
source benchmarks/gpu_session/common.sh "$1"
for dt in int8 bf16; do
    step "prefill breakdown $dt"; mkdir -p "$R/$dt"
    timeout 150 python3 benchmarks/decode_breakdown.py --dtype $dt --out "$R/$dt" --m 2048,4096,8192 \
        --shapes deepseek-v2-lite qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -6
done
step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
