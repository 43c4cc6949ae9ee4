#!/bin/bash
# The fifty-first session's two-GPU call (kind nvidia-h100-x2 or nvidia-h200-x2; ~4 minutes warm): the op's device
# switch (a model spread over two GPUs by device_map in one process; Triton launches on the current device) and
# the GPU tests of parallel.py (session 49's split-module group check over NCCL on two GPUs).
# start.sh s51b.sh, then wait.sh until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "two GPUs, one process"; timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_gpu.py \
  tests/test_transformers.py -k "another_gpu_than_the_current or spread_over_two_gpus" 2>&1 | tail -6
step "GPU tests of parallel.py"; timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_parallel.py \
  2>&1 | tail -6
step "done"; echo CHAIN_DONE
