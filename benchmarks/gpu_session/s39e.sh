#!/bin/bash
# NOTES items 204-205: the bench's GPU test (it checks the untimed replays) and the Gluon and register-form tests
# (the register form's experts without a gate with biases and the review's shared bias arguments: not run in
# session 39), then the prefill rows of qwen3, deepseek and GPT-OSS-20B's shape (SiLU, no biases: the same tables)
# with 20 replays, without untimed replays before each row's timed ones (--warm-s 0, as before) and with half a
# second of them (the new default).
# start.sh s39e.sh, then wait.sh 300.
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests: the bench, the register form without a gate with biases"
timeout 60 python3 -m pytest -q -m gpu tests/test_bench_tune.py -p no:cacheprovider -k "bench_runs_on_gpu and silu" \
  2>&1 | tail -2
timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py -k "wsrr or gluon or bias" \
  2>&1 | tail -2
for warm in 0 0.5; do
  step "bench --warm-s $warm"; timeout 100 bash benchmarks/gpu_session/cli.sh bench \
    --shapes qwen3-30b-a3b,deepseek-v2-lite,32:2880:2880:4 --m 2048,4096,8192 --warm-s $warm --no-plot \
    --out "$R/warm_$warm" 2>&1 | grep -E "^(qwen|deep|E32)"
done
step "done"; echo CHAIN_DONE
