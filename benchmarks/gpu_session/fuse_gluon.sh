#!/bin/bash
# NOTES item 82: gate and up as one Gluon wgmma (FUSE_GATE_UP on GLUON entries): the Gluon GPU tests,
# then the A/B at prefill sizes, its winners folded into the int8 tables (back as configs.tgz).
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests (gluon)"; timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -k gluon -p no:cacheprovider 2>&1 | tail -4
step "fuse prefill"; timeout 330 python3 benchmarks/variant_ab.py fuse --m 512,1024,2048,4096,8192 --out "$R" \
    --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -26
step "fold"; python3 benchmarks/fold_ab.py "$R/variant_ab_fuse.json" --out-dir $D && tables_tgz
step "done"; echo CHAIN_DONE
