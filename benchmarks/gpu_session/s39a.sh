#!/bin/bash
# Next session's first chain (written in session 38, not yet run): the GPU tests of NOTES items 199-201 (the
# bench's other expert forms, the register form's zero store past I, the Gluon kernels with expert biases),
# then GPT-OSS-20B's experts shape (E=32, H=I=2880, k=4; clamped SwiGLU with biases) timed on the heuristic,
# tuned in that form (each candidate checked against the reference with the biases), and timed again (item
# 201's prediction).
# start.sh s39a.sh, then wait.sh 570 until CHAIN_DONE.
source benchmarks/gpu_session/common.sh "$1"
step "tests"; timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py -k "wsrr or gluon or bias" \
  2>&1 | tail -4
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -m gpu tests/test_bench_tune.py -k "runs_on_gpu" 2>&1 | tail -2
GPT_OSS=(--shapes 32:2880:2880:4 --activation swiglu_oai --biases --m 1,16,256,1024,2048,4096,8192 --quick --no-plot)
step "GPT-OSS-20B shape, heuristic blocks"; timeout 150 bash benchmarks/gpu_session/cli.sh bench "${GPT_OSS[@]}" \
  --out "$R/gpt_oss_heuristic" 2>&1 | tail -10
step "tune 32,2880,2880,4"; timeout 260 bash benchmarks/gpu_session/cli.sh tune --shape 32,2880,2880,4 \
  --activation swiglu_oai --biases --m 1,16,256,1024,2048,4096,8192 --budget-s 200 --out-dir "$D" --no-progress 2>&1 | grep -E "M=|took|Error|error"
tables_tgz
step "GPT-OSS-20B shape, tuned"; timeout 150 bash benchmarks/gpu_session/cli.sh bench "${GPT_OSS[@]}" \
  --out "$R/gpt_oss_tuned" 2>&1 | tail -10
step "done"; echo CHAIN_DONE
