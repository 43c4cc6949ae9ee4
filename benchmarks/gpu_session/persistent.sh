#!/bin/bash
# NOTES item 66: the PERSISTENT decode GEMMs against the shipped decode entries.
source benchmarks/gpu_session/common.sh "$1"
step "persistent small"; timeout 300 python3 benchmarks/variant_ab.py persistent --m 1,2,4,8,16 --out "$R" \
                           --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -14
mv "$R/variant_ab_persistent.json" "$R/variant_ab_persistent_small.json"
step "persistent large"; timeout 240 python3 benchmarks/variant_ab.py persistent --m 1,2,4,8 --out "$R" \
                           --shapes mixtral-8x7b mixtral-8x22b 2>&1 | grep -v -i warn | tail -10
mv "$R/variant_ab_persistent.json" "$R/variant_ab_persistent_large.json"
step "done"; echo CHAIN_DONE
