#!/bin/bash
# NOTES item 145: PDL's second form (dependents launched after a program's K loop): the GPU tests of both
# forms, then both against off in three settled rounds on the decode rows where the launch boundaries
# weigh most. start.sh pdl2.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests"; timeout 100 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
  -k programmatic 2>&1 | tail -2
for spec in "mixtral-8x7b 1,2,4" "qwen3-30b-a3b 1,2" "deepseek-v2-lite 1,8"; do
  set -- $spec
  mkdir -p "$R/pdl2/$1"; step "A/B pdl $1"; timeout 100 python3 benchmarks/variant_ab.py pdl --values 0,1,2 --rounds 3 --out "$R/pdl2/$1" \
    --m $2 --shapes $1 2>&1 | grep -v -i warn | tail -3
done
step "done"; echo CHAIN_DONE
