#!/bin/bash
# The next session's first chain (NOTES items 208-209): the register form's and the tail pass's GPU tests, PAD_I's
# among them (I = 1440, 720, 400, 208: not yet run on a GPU; every other register-form test for the unchanged
# kernels), then s41b.sh's timing of the int8 prefill heuristic on the register form (item 208's prediction).
# start.sh s42a.sh, then wait.sh 560 (~6 minutes warm).
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests: the register form (PAD_I among them) and the tail pass"
timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py -k "wsrr or tail_pass" \
  2>&1 | tail -4
CHAIN_NESTED=1 bash benchmarks/gpu_session/s41b.sh "$R"
step "done"; echo CHAIN_DONE
