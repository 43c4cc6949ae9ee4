#!/bin/bash
# The fifty-second session's chain, by card. On an H200 (#3's rows): the op's GPU tests, every shape's decode
# entries (M=2..64, both formats) searched again on the routing draws (item 221: the H200 tables were tuned on
# one draw a row; session 51 did this on the H100, where only qwen3 int8 M=2 and M=4 moved), then the full bench
# for #3's table. On an H100 (its decode tables already re-tuned on the draws): the GPU-marked tests whole and
# the unmarked files changed since their last GPU run, then the two bf16 searches session 51's timeout cut.
# start.sh s52a.sh, then wait.sh 560 until CHAIN_DONE (~24 minutes warm on an H200, ~12 on an H100); extract
# configs.tgz (cmp each file against src/experts_int8/kernels/configs; copy only the changed ones).
# SHORT=1 (device time under ~25 minutes): the H200 branch skips the searches (~11 minutes warm).
source benchmarks/gpu_session/common.sh "$1"
tune() {  # tune SPEC DTYPES: M=2..64 into the chain's tables, 60 s a format (~190 s a shape with both)
  step "tune $1 M=2..64 ($2)"; timeout 300 bash benchmarks/gpu_session/cli.sh tune --shape $1 --m 2,4,8,16,32,64 \
    --dtypes $2 --budget-s 60 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
  tables_tgz
}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  step "GPU tests through the op"; timeout 150 python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider -rfE \
    tests/test_gpu.py -k "test_bf16 or cuda_graph or inductor or programmatic" 2>&1 | tail -3
  if [ -z "$SHORT" ]; then
    for spec in 8,4096,14336,2 8,6144,16384,2 16,4096,14336,2 128,2048,768,8 64,2048,1408,6; do tune $spec int8,bf16; done
  fi
  step "full bench"; timeout 560 bash benchmarks/gpu_session/cli.sh bench --out "$R/full" 2>&1 \
    | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
else
  step "GPU-marked tests"; timeout 420 python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider -rfE tests/ 2>&1 | tail -12
  step "unmarked files changed since their last GPU run"; timeout 480 python3 -m pytest -q -n 12 -m "not gpu" \
    -p no:cacheprovider -rfE tests/test_transformers.py tests/test_layer.py tests/test_routing.py tests/test_cli.py \
    tests/test_parallel.py 2>&1 | tail -12
  tune 8,6144,16384,2 bf16; tune 128,2048,768,8 bf16
fi
step "done"; echo CHAIN_DONE
