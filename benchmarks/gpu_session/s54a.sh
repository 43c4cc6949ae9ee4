#!/bin/bash
# The fifty-fourth session's chain. On an H100: s53a.sh as it stands (GPU-marked tests whole, the five unmarked
# files on item 225's thread share, backward_time.py). On an H200: first the tests of the commits after b23632a
# that need a GPU (the per-expert backward, second-order gradients, the one host read of the routing, the same
# bits run to run, the fp16 offload case; ~2 minutes), then s53a.sh's H200 branch (SHORT=1: the op's tests,
# 8x7b M=2,4 searched again, the full bench, backward_time.py). start.sh s54a.sh, then wait.sh 560 until CHAIN_DONE.
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash benchmarks/gpu_session/s53a.sh "$1"; fi
(
  source benchmarks/gpu_session/common.sh "$1"
  step "GPU tests of the commits after b23632a"
  timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider -p no:benchmark -rfE \
    tests/test_fused_experts.py tests/test_gpu.py tests/test_transformers.py \
    -k "backward or second_order or gradient or host_once or same_bits or offloaded" 2>&1 | tail -6
)
CHAIN_NESTED=1 bash benchmarks/gpu_session/s53a.sh "$1"  # (a nested chain drops its own CHAIN_DONE line)
sleep 2; echo CHAIN_DONE >>"$1/chain.log"  # (after the nested log filter has drained)
