#!/bin/bash
# Nsight Compute on the decode and prefill GEMMs (benchmarks/NOTES.md item 74): per kernel, the
# speed-of-light, memory, warp-state (stall reasons), scheduler, occupancy, launch, compute and
# instruction sections, as CSV under the results folder. The second call's kernels (the first
# compiles); ncu flushes the caches before each replay, so weights come from HBM.
source benchmarks/gpu_session/common.sh "$1"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; "$NCU" --version | tail -1
prof() {  # name shape M dtype [GEMM launches a call, default 2] [config JSON file to force]
    step "ncu $1"
    local per_call=${5:-2}
    timeout 150 "$NCU" --clock-control none -k "regex:moe_(gate_up|down)" --launch-skip "$per_call" \
        --launch-count "$per_call" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        --print-details all --csv --page details \
        python3 benchmarks/ncu_layer.py --shape "$2" --m "$3" --dtype "$4" ${6:+--override "$6"} \
        >"$R/ncu_$1.csv" 2>"$R/ncu_$1.err"
    echo "rc $?; $(wc -l <"$R/ncu_$1.csv") lines"; grep -v "^\"" "$R/ncu_$1.csv" | tail -3; tail -3 "$R/ncu_$1.err"
}
# the cases, one "name shape M dtype [launches] [override]" a line: $NCU_CASES where a caller (ncu_small.sh) sets it
: "${NCU_CASES:=8x7b_m1_int8 mixtral-8x7b 1 int8
8x7b_m1_bf16 mixtral-8x7b 1 bf16
qwen3_m1_int8 qwen3-30b-a3b 1 int8
8x7b_m8_int8 mixtral-8x7b 8 int8
8x7b_m2048_int8 mixtral-8x7b 2048 int8
8x7b_m2048_bf16 mixtral-8x7b 2048 bf16}"
while read -r name shape m dtype per_call override; do
    prof "$name" "$shape" "$m" "$dtype" "$per_call" "$override"
done <<<"$NCU_CASES"
step "done"; echo CHAIN_DONE
