#!/bin/bash
# NOTES item 83: the Gluon K loop with two barriers a step instead of three: the Gluon GPU tests, then the
# shipped GLUON entries timed on the previous kernel (old_gluon_moe.py, untracked, carried for this run)
# and on this one, alternating, in one process each (value 1 is the same entry again: FUSE_GATE_UP is in it).
# As run: the new loop at c48f6f4 (reverted at 1fa39ba), the old module from
#   git show 7cf4d6b:src/experts_int8/kernels/gluon_moe.py > benchmarks/gpu_session/old_gluon_moe.py
source benchmarks/gpu_session/common.sh "$1"
[ -z "$SKIP_TESTS" ] && step "gpu tests (gluon)" && timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -k gluon -p no:cacheprovider 2>&1 | tail -4
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r src benchmarks /tmp/old/ \
  && cp benchmarks/gpu_session/old_gluon_moe.py /tmp/old/src/experts_int8/kernels/gluon_moe.py
NEW=$PWD
for pass in old1 new1 old2 new2; do
  case $pass in old*) cd /tmp/old;; *) cd "$NEW";; esac
  step "shipped entries, $pass kernel"; timeout 150 python3 benchmarks/variant_ab.py fuse --values 0,1 --m 1024,2048,4096 \
        --out "$R" --shapes mixtral-8x7b jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -12
  mv "$R/variant_ab_fuse.json" "$R/barriers_$pass.json"
done
cd "$NEW"; step "done"; echo CHAIN_DONE
