#!/bin/bash
# The next session's first chain (NOTES "Next GPU session (after the forty-second)", steps 0-1): the GPU-marked
# tests whole with the int8 heuristic on the register form from 192 rows an expert (item 208), the 128-row tile
# against the Triton heuristic below that threshold (item 211's prediction), then the Mixtrals' decode rows with
# the FP16_DOT entries (item 210's fold), three rounds. start.sh s43a.sh, then wait.sh 560 until CHAIN_DONE
# (~8-10 minutes warm). On an H100 (no tables) s41b.sh's A/B and bench replace the decode rounds.
source benchmarks/gpu_session/common.sh "$1"
step "gpu-marked tests"
timeout 420 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE -m gpu tests/ 2>&1 | tail -8
# rows an expert: M * k / E = 64, 96, 128, 160 on both untabled shapes
mkdir -p "$R/wsrr128"; step "A/B wsrr under the threshold (2: Triton blocks, 3: WSRR 128)"
timeout 150 python3 benchmarks/variant_ab.py wsrr --out "$R/wsrr128" --shapes 8:4096:14400:2 --m 256,384,512,640 \
  --values 2,3 2>&1 | grep -v -i warn
mkdir -p "$R/wsrr128_e64"
timeout 150 python3 benchmarks/variant_ab.py wsrr --out "$R/wsrr128_e64" --shapes 64:2048:1472:6 \
  --m 683,1024,1365,1707 --values 2,3 2>&1 | grep -v -i warn
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for r in 1 2 3; do
    step "bench decode, round $r"; timeout 120 bash benchmarks/gpu_session/cli.sh bench \
      --shapes mixtral-8x7b,mixtral-8x22b --m 1,2,4,8,16 --no-plot --out "$R/decode$r" 2>&1 | grep -E "^E|Error|error"
  done
else  # an H100 has no tables: every shape runs the heuristic, whose item 208 A/B has only run on an H200
  CHAIN_NESTED=1 bash benchmarks/gpu_session/s41b.sh "$R"
fi
step "done"; echo CHAIN_DONE
