#!/bin/bash
# NOTES item 131: the Triton GEMMs with their epilogue loads (row scales, biases, routing weights, FP16_DOT's
# row scales) issued before the K loop (this tree) against the kernels before that change (untracked,
# carried for this run: git show 9d23607:src/experts_int8/kernels/fused_moe.py
# > benchmarks/gpu_session/old_fused_moe.py), the shipped entries alternating old/new in three rounds
# (value 1 of "fuse" is the same entry again below BLOCK_M 64), after the GPU tests of the Triton kernels.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests (triton kernels)"; timeout 240 python3 -m pytest -q -m gpu tests/ -k "not gluon and not wsrr and not tail and not chunked_align" -p no:cacheprovider 2>&1 | tail -3
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r src benchmarks /tmp/old/ \
  && cp benchmarks/gpu_session/old_fused_moe.py /tmp/old/src/experts_int8/kernels/fused_moe.py
NEW=$PWD
for pass in old1 new1 old2 new2 old3 new3; do
  case $pass in old*) cd /tmp/old; export PYTHONPATH=/tmp/old/src;; *) cd "$NEW"; export PYTHONPATH=$NEW/src;; esac
  step "shipped entries, $pass kernels"; timeout 100 python3 benchmarks/variant_ab.py fuse --values 0,1 --m 1,2,4,8,16,64,256 \
        --out "$R" --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -36
  mv "$R/variant_ab_fuse.json" "$R/hoist_$pass.json"
done
cd "$NEW"; step "done"; echo CHAIN_DONE
