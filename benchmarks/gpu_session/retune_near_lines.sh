#!/bin/bash
# NOTES item 137: (a) where get_config's tables come from on the device (item 136's bench ran the three rows
# folded minutes before on their old entries), then those rows benched again on the tables as committed;
# (b) the three decode rows nearest their lines (8x7b M=2, 8x22b M=1, jamba M=1) re-tuned on the kernels
# with the epilogue's loads before the K loop, timed against the shipped entries in three interleaved
# rounds, folded under the 1% floor, then the kernel bench at M=1-4 of those shapes. start.sh, then wait.sh.
source benchmarks/gpu_session/common.sh "$1"
step "where the tables come from"
ls -la ~/.cache/experts_int8/configs 2>&1 | head -5; echo "EXPERTS_INT8_CACHE=${EXPERTS_INT8_CACHE:-unset}"
python3 - <<'PY'
import logging, torch
logging.basicConfig(level=logging.INFO, format="%(message)s")
from experts_int8.kernels import configs
for m, e, i, k in [(256, 64, 1408, 6), (512, 64, 1408, 6), (128, 8, 16384, 2)]:
    print(m, e, i, configs.get_config(m, e, i, k, torch.int8, torch.device("cuda")))
PY
step "bench the folded rows"; timeout 120 python3 benchmarks/bench_kernel.py --shapes deepseek-v2-lite mixtral-8x22b \
    --m 128,256,512 --out "$R" --no-plot 2>&1 | grep -E "^(deepseek|mixtral)"
retune /tmp/retuned_decode "8,4096,14336,2 --m 2 --budget-s 75" "8,6144,16384,2 --m 1 --budget-s 75" \
  "16,4096,14336,2 --m 1 --budget-s 75"
mkdir -p "$R/decode"
step "A/B retuned"; timeout 200 python3 benchmarks/variant_ab.py retuned --values 0,1 --rounds 3 --out "$R/decode" \
    --m 1,2 --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini 2>&1 | grep -v -i warn | tail -6
step "fold"; python3 benchmarks/fold_ab.py "$R/decode/variant_ab_retuned.json" --out-dir $D --min-gain 0.01
tables_tgz
step "bench decode"; timeout 150 python3 benchmarks/bench_kernel.py --shapes mixtral-8x7b mixtral-8x22b jamba-1.5-mini \
    --m 1,2,4 --out "$R" --no-plot 2>&1 | grep -E "^(mixtral|jamba)"
step "done"; echo CHAIN_DONE
