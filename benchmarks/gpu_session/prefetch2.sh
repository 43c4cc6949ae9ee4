#!/bin/bash
# NOTES item 117: where PREFETCH_DOWN's time goes (item 116 lost everywhere). Its GPU tests with the
# evict-last priority, the decode layers launch by launch shipped / whole share / whole share at
# evict-last, then the A/B shipped / whole / whole and half at evict-last, two rounds. ~5 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -k prefetch -p no:cacheprovider 2>&1 | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
for v in "" prefetch_down=1 prefetch_down=4; do
    step "breakdown ${v:-shipped}"; timeout 200 python3 benchmarks/decode_breakdown.py --out "$R" --m 1,2,8 \
        --shapes qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b ${v:+--variant $v} 2>&1 | grep -v -i warn | tail -9
done
step "A/B"; timeout 300 python3 benchmarks/variant_ab.py prefetch_down --values 0,1,4,5 --rounds 2 --out "$R" \
    --m 1,2,4,8,16 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -10
step "done"; echo CHAIN_DONE
