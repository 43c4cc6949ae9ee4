#!/bin/bash
# NOTES item 103: the GPU tests of the routed-by-counts refactor (-k around), then the tail probe
# (full layer / without the tail pairs / the tail pairs alone on small entries). ~8 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests -k around"; timeout 240 python3 -m pytest -q -m gpu tests/test_gpu.py -k around -p no:cacheprovider 2>&1 | tail -8
step "tail probe"; timeout 900 python3 benchmarks/tail_probe.py --out "$R" \
    --shapes jamba-1.5-mini qwen3-30b-a3b deepseek-v2-lite mixtral-8x7b 2>&1 | grep -v -i warn | tail -30
step "done"; echo CHAIN_DONE
