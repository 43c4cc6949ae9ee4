#!/bin/bash
# NOTES item 93: the Gluon kernels with their first loads issued together and the weight tiles' prologue
# before the activation rows' (this tree) against the kernels before that change (old_gluon_moe.py,
# untracked, carried for this run: git show 66a72e7:src/experts_int8/kernels/gluon_moe.py), the shipped
# entries alternating old/new in one process each (value 1 of "fuse" is the same entry again), after the
# Gluon GPU tests on the new kernels. As run: the new kernels at 0c47350 (reverted in the next commit:
# no gain, NOTES 93).
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests (gluon)"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k gluon -p no:cacheprovider 2>&1 | tail -3
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r src benchmarks /tmp/old/ \
  && cp benchmarks/gpu_session/old_gluon_moe.py /tmp/old/src/experts_int8/kernels/gluon_moe.py
NEW=$PWD
for pass in old1 new1 old2 new2; do
  case $pass in old*) cd /tmp/old;; *) cd "$NEW";; esac
  step "shipped entries, $pass kernel"; timeout 100 python3 benchmarks/variant_ab.py fuse --values 0,1 --m 2048,4096,8192 \
        --out "$R" --shapes mixtral-8x7b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -12
  mv "$R/variant_ab_fuse.json" "$R/early_loads_$pass.json"
done
cd "$NEW"; step "done"; echo CHAIN_DONE
