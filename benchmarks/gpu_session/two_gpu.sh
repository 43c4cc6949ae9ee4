#!/bin/bash
# NOTES item 177 (next session's step 0), on kind nvidia-h200-x2: the experts split over two GPUs. The GPU tests of
# parallel.py (NCCL: logits as one GPU's, both modes, three architectures), generate --parallel on the demo's int8
# checkpoint, then bench-e2e's int8 column on one GPU and split over two (tp, ep), 8 full-size Mixtral-8x7B layers,
# the CUDA-graphed decode loop. ~10 minutes warm; start.sh two_gpu.sh, then wait.sh until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
RUN2="python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m experts_int8.cli"
step "GPU tests of parallel.py"; timeout 300 python3 -m pytest -q -m gpu tests/test_parallel.py 2>&1 | tail -4
step "demo checkpoint"; timeout 300 python3 -m experts_int8.cli demo --keep /tmp/demo2 --new-tokens 4 --no-progress | tail -3
for mode in tp ep; do
  step "generate --parallel $mode"
  timeout 300 $RUN2 generate /tmp/demo2/int8 --prompt "The assert" --max-new-tokens 16 --no-progress --parallel $mode 2>&1 \
      | grep -v "^W\|\*\*\*\*"
done
E2E="bench-e2e --config mixtral-8x7b --random-weights --columns ours-int8 --layers 8 --decode loop --batch 1,8 --prompt-len 256 --new-tokens 64"
step "bench-e2e, one GPU"; timeout 400 python3 -m experts_int8.cli $E2E --out "$R/e2e" 2>&1 | tail -4
for mode in tp ep; do
  step "bench-e2e, two GPUs ($mode)"; timeout 400 $RUN2 $E2E --parallel $mode --out "$R/e2e" 2>&1 | grep -v "^W\|\*\*\*\*" | tail -4
done
step "done"; echo CHAIN_DONE
