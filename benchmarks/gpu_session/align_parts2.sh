#!/bin/bash
# NOTES item 121, after the change: the align GPU tests (the chunked path against the torch sort), the
# probe, qwen3 M=8192 launch by launch in both formats. ~2 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 120 python3 -m pytest -q -m gpu tests/test_gpu.py -k "align or tail" -p no:cacheprovider 2>&1 | tail -2
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
step "probe"; timeout 120 python3 benchmarks/align_parts_probe.py --out "$R" 2>&1 | grep -v -i warn | tail -6
for dt in int8 bf16; do
    step "breakdown $dt"; mkdir -p "$R/$dt"; timeout 100 python3 benchmarks/decode_breakdown.py --dtype $dt \
        --out "$R/$dt" --m 8192 --shapes qwen3-30b-a3b 2>&1 | grep -v -i warn | tail -1
done
step "done"; echo CHAIN_DONE
