#!/bin/bash
# NOTES item 144: the two decode rows nearest their lines in the settled runs (8x7b M=2 at 84.0% of copy,
# deepseek M=8 at 74.9-75.0%) against the cheap variants, timed with the settle (0.5 s before each timing),
# three interleaved rounds each; folds under the 1% floor and the rounds rule, then the decode rows of
# every shape on the result if a table changed. start.sh near.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
mkdir -p "$R/near"
ab() {  # VARIANT VALUES SHAPE M
  step "A/B $1 $2 $3 M=$4"; timeout 150 python3 benchmarks/variant_ab.py $1 --values $2 --rounds 3 --out "$R/near/$3" \
    --m $4 --shapes $3 2>&1 | grep -v -i warn | tail -2
  python3 benchmarks/fold_ab.py "$R/near/$3/variant_ab_$1.json" --out-dir $D --min-gain 0.01
}
mkdir -p "$R/near/mixtral-8x7b" "$R/near/deepseek-v2-lite"
ab waves 0,1,2,3,4 mixtral-8x7b 2
ab late_epilogue 0,1,2,3 mixtral-8x7b 2
ab sum_last 0,3 mixtral-8x7b 2
ab waves 0,1,2,3,4 deepseek-v2-lite 8
ab late_epilogue 0,1,2,3 deepseek-v2-lite 8
tables_tgz
if ! diff -rq "$D" src/experts_int8/kernels/configs >/dev/null; then
  step "decode bench"; timeout 200 python3 benchmarks/bench_kernel.py --out "$R" --m 1,2,4,8,16 --no-plot 2>&1 | tail -14
fi
step "done"; echo CHAIN_DONE
