#!/bin/bash
# NOTES item 98: the WSRR kernels as persistent programs. Their GPU tests first, then the A/B of WSRR on
# and off on every shape at prefill sizes (folded into the tables where one side wins by 2%), the full
# kernel bench on the folded tables, then every GPU test.
source benchmarks/gpu_session/common.sh "$1"
step "wsrr tests"; timeout 200 python3 -m pytest -q -m gpu tests/test_gpu.py -k wsrr -p no:cacheprovider 2>&1 | tail -15
step "wsrr A/B"; timeout 240 python3 benchmarks/variant_ab.py wsrr --out "$R" --m 256,512,1024,2048,4096,8192 \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -32
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_wsrr.json" --out-dir $D && tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "gpu tests"; timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -5
step "done"; echo CHAIN_DONE
