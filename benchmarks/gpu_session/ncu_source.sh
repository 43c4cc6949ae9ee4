#!/bin/bash
# Where the 8x7b M=1 gate_up's warps wait, instruction by instruction (ncu's PC sampling), int8 and
# bf16: the SASS of each with its stall samples, as CSV (benchmarks/NOTES.md item 78).
source benchmarks/gpu_session/common.sh "$1"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for dt in int8 bf16; do
    step "ncu source $dt"
    timeout 90 "$NCU" --clock-control none -k "regex:moe_gate_up" --launch-skip 1 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        python3 benchmarks/ncu_layer.py --shape mixtral-8x7b --m 1 --dtype $dt >"$R/ncu_source_$dt.csv" 2>"$R/ncu_source_$dt.err"
    echo "rc $?; $(wc -l <"$R/ncu_source_$dt.csv") lines"; tail -2 "$R/ncu_source_$dt.err"; head -c 600 "$R/ncu_source_$dt.csv"; echo
done
step "done"; echo CHAIN_DONE
