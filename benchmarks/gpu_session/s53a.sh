#!/bin/bash
# The fifty-third session's chain, by card. On an H200 (#3's rows): s52a.sh's H200 branch (the op's GPU tests,
# every shape's decode entries searched again on the routing draws unless SHORT, the full bench). On an H100:
# the GPU-marked tests whole (commits after 154c10d have not run on a GPU) and the five unmarked files that
# session 52's 480 s timeout cut at about 90%, now with 570 s. Both: benchmarks/backward_time.py (~1 minute).
# start.sh s53a.sh, then wait.sh 560 until CHAIN_DONE (~24 minutes warm on an H200, ~13 on an H100; SHORT=1
# ~13 on an H200, with only 8x7b M=2,4 searched again); extract configs.tgz (cmp each file against src/experts_int8/kernels/configs).
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
  else  # only the rows furthest from #3's targets: 8x7b int8 decode at M=2 and 4 (~2 minutes)
    step "tune 8x7b M=2,4"; timeout 200 bash benchmarks/gpu_session/cli.sh tune --shape 8,4096,14336,2 --m 2,4 \
      --dtypes int8,bf16 --budget-s 60 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
    tables_tgz
  fi
  step "full bench"; timeout 560 bash benchmarks/gpu_session/cli.sh bench --out "$R/full" 2>&1 \
    | grep -E "^[a-z]|Error|error" | grep -v "^experts_int8"
else
  step "GPU-marked tests"; timeout 420 python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider -rfE tests/ 2>&1 | tail -12
  step "unmarked files"; timeout 570 python3 -m pytest -q -n 12 -m "not gpu" --durations=15 \
    -p no:cacheprovider -rfE tests/test_transformers.py tests/test_layer.py tests/test_routing.py tests/test_cli.py \
    tests/test_parallel.py 2>&1 | tail -30
fi
step "training step: the reference's walk over the experts, once against per expert (item 226)"
timeout 300 python3 benchmarks/backward_time.py --out "$R" 2>&1 | grep -E "M=|Error|error"
step "done"; echo CHAIN_DONE
