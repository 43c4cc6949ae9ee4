#!/bin/bash
# NOTES item 139's lead: 8x22b M=1 read 152-155 µs in some full benches and 171-175 in others (its new
# entry; alone it reads 152.8-152.9 every time). Six processes, each the bench in its full order for the
# first two shapes (8x7b, then 8x22b) at M=1-2, alternating the shipped 8x22b table with one whose M=1
# entry is 8fa6454's (through EXPERTS_INT8_CACHE), the GPU's clocks and power read before each. One
# device call (~3 min):  EXPERTS_INT8_COMMIT=<sha> bash benchmarks/gpu_session/slow_mode.sh
export PYTHONPATH=$PWD/src
OLD=$(mktemp -d)
python3 - "$OLD/configs" <<'PY'
import json, pathlib, sys
from experts_int8.kernels import configs
name = configs.table_name(8, 16384, "NVIDIA_H200", "int8_w8a16")
table = json.loads((configs.PACKAGE_DIR / name).read_text())
table["1"] = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=256, GROUP_SIZE_M=1, num_warps=4, num_stages=3,
                  PAIRS=1, down=dict(SPLIT_K=2))  # the entry before item 137's re-tune
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True)
(out / name).write_text(json.dumps(table, indent=4) + "\n")
PY
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader; }
for i in 1 2 3; do
  for v in new old; do
    if [ $v = old ]; then export EXPERTS_INT8_CACHE=$OLD; else unset EXPERTS_INT8_CACHE; fi
    echo "=== $v $i  clocks: $(clocks)"
    timeout 90 python3 benchmarks/bench_kernel.py --out "$OUT/$v$i" --no-plot --shapes mixtral-8x7b mixtral-8x22b \
      --m 1,2 2>&1 | grep -E "^mixtral"
  done
done
echo "=== after  clocks: $(clocks)"
