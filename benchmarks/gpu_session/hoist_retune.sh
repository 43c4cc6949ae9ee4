#!/bin/bash
# NOTES item 132: after item 131's A/B, the two rows it slowed re-tuned on the new kernels (qwen3 M=4, whose
# gate_up lost a resident program a SM to six more registers; jamba M=256), merged into the shipped tables,
# then old kernels + old tables against new kernels + new tables, alternating, three rounds (the old
# kernel file is carried untracked as in hoist.sh).
source benchmarks/gpu_session/common.sh "$1"
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r src benchmarks /tmp/old/ \
  && cp benchmarks/gpu_session/old_fused_moe.py /tmp/old/src/experts_int8/kernels/fused_moe.py
for spec in "128,2048,768,8 --m 4" "16,4096,14336,2 --m 256"; do
  step "tune $spec"; timeout 150 bash benchmarks/gpu_session/cli.sh tune --shape $spec --dtypes int8 --out-dir $D \
    --budget-s 60 --no-progress 2>&1 | grep -E "int8 M=|took|Error|error"
done
tables_tgz
NEW=$PWD
for pass in old1 new1 old2 new2 old3 new3; do
  case $pass in old*) cd /tmp/old; export PYTHONPATH=/tmp/old/src;; *) cd "$NEW"; export PYTHONPATH=$NEW/src;; esac
  step "shipped entries, $pass kernels and tables"; timeout 100 python3 benchmarks/variant_ab.py fuse --values 0,1 \
        --m 1,2,4,8,16,64,256 --out "$R" --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini qwen3-30b-a3b \
        deepseek-v2-lite 2>&1 | grep -v -i warn | grep -E "M=4 |M=256" 
  mv "$R/variant_ab_fuse.json" "$R/hoist_retune_$pass.json"
done
cd "$NEW"; step "done"; echo CHAIN_DONE
