#!/bin/bash
# Session 59, one GPU (H100 or H200), in one call: the GPU-marked tests (the clamped SwiGLU in the Triton, Gluon and
# register-form kernels), then int8 rows timed with the source before the clamp options (ab_old/src, a copy of
# 5cc5d07's) and after, alternating twice. Prediction: alike within noise (2%): the unclamped kernels' constexprs
# changed from GPT-OSS's limit and slope to None, which compiles the same code.
export PYTHONPATH=$PWD/src
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
timeout 330 python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider -p no:benchmark tests/ 2>&1 | tail -8
for round in 1 2; do
  for side in old new; do
    src=$PWD/src; [ $side = old ] && src=$PWD/ab_old/src
    echo "== $side (round $round)"
    PYTHONPATH=$src timeout 120 python3 -c "import sys; from experts_int8.cli import main; sys.argv[0] = 'experts-int8'; main()" \
      bench --shapes qwen3-30b-a3b,mixtral-8x7b --m 1,8,2048 --dtypes int8 --quick --settle-s 0.3 --out /tmp/ab_$side 2>&1 \
      | grep -v "^experts_int8" | tail -9
  done
done
