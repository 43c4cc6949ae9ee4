#!/bin/bash
# The twenty-fifth session's one chain (NOTES items 140-141): the GPU tests of the kernels' variants (the
# read_table change has not run on a GPU), item 139's slow mode (slow_mode.sh, its files under
# $R/slow_mode), jamba M=128's re-tune in five interleaved rounds, folded under the 1% floor and the rounds
# rule, and the full bench only if a fold changed a table. start.sh s25.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests"; timeout 240 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
  -k "kernel_variants or sum_last or biases or fp16 or sm90 or late or table" 2>&1 | tail -4
step "slow mode"; mkdir -p "$R/slow_mode"; OUT=$R/slow_mode bash benchmarks/gpu_session/slow_mode.sh
retune /tmp/retuned_jamba "16,4096,14336,2 --m 128 --budget-s 60"
mkdir -p "$R/jamba128"
step "A/B retuned"; timeout 200 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 5 --out "$R/jamba128" \
    --m 128 --shapes jamba-1.5-mini 2>&1 | grep -v -i warn | tail -4
step "fold"; python3 benchmarks/fold_ab.py "$R/jamba128/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
tables_tgz
if ! diff -rq "$D" src/experts_int8/kernels/configs >/dev/null; then
  step "bench_kernel"; timeout 330 python3 benchmarks/bench_kernel.py --out "$R" 2>&1 | tail -75
fi
step "done"; echo CHAIN_DONE
