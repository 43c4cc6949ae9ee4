#!/bin/bash
# NOTES item 114: (a) the TP=4 8x22b shard at M=256 benched first and last in one process (items 108,
# 111: 400+ µs only as the last of four shapes); (b) where the register form's down GEMM waits, instruction
# by instruction (ncu PC sampling), at deepseek M=8192 (its shipped entry: WSRR 256 + TAIL 32). ~3 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "bench order"; timeout 150 python3 benchmarks/bench_kernel.py --dtypes int8 --no-plot --m 128,256,512 --out "$R" \
    --shapes 8:6144:4096:2 8:4096:7168:2 8:4096:3584:2 8:6144:8192:2 8:6144:4096:2 2>&1 | grep -E "^E8|^#"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
step "ncu source wsrr down"
timeout 120 "$NCU" --clock-control none -k "regex:moe_down_wsrr" --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
    python3 benchmarks/ncu_layer.py --shape deepseek-v2-lite --m 8192 --dtype int8 >"$R/ncu_source_wsrr_down.csv" \
    2>"$R/ncu_source_wsrr_down.err"
echo "rc $?; $(wc -l <"$R/ncu_source_wsrr_down.csv") lines"; tail -2 "$R/ncu_source_wsrr_down.err"
step "done"; echo CHAIN_DONE
