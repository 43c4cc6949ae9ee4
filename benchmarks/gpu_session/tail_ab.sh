#!/bin/bash
# NOTES item 104: TAIL_ROWS (an expert's few last rows in a second pass). The GPU tests of the tail pass,
# the register-form kernels (new expert_outputs signature) and the align paths, then the A/B shipped /
# TAIL_ROWS 16 / 32 / 64 on every shape, folded where one wins by 2%, then the kernel bench. ~10 minutes.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -k "tail or wsrr or align" -p no:cacheprovider 2>&1 | tail -8
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
mkdir -p "$R/small" "$R/large"
step "A/B large experts"; timeout 300 python3 benchmarks/variant_ab.py tail --values 0,1,2,3 --out "$R/large" \
    --m 512,1024,2048,4096,8192 --shapes mixtral-8x7b jamba-1.5-mini mixtral-8x22b 2>&1 | grep -v -i warn | tail -16
step "A/B small experts"; timeout 200 python3 benchmarks/variant_ab.py tail --values 0,1,2,3 --out "$R/small" \
    --m 1024,2048,4096,8192 --shapes qwen3-30b-a3b deepseek-v2-lite 2>&1 | grep -v -i warn | tail -10
step "fold"; for g in small large; do python3 benchmarks/fold_ab.py "$R/$g/variant_ab_tail.json" --out-dir $D; done
tables_tgz
step "bench_kernel"; timeout 300 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
step "done"; echo CHAIN_DONE
