#!/bin/bash
# The next session's first chain (NOTES items 208-210): the register form's and the tail pass's GPU tests, PAD_I's
# among them (I = 1440, 720, 400, 208: not yet run on a GPU; every other register-form test for the unchanged
# kernels); s41b.sh's timing of the int8 prefill heuristic on the register form (item 208's prediction); if every
# test passed, GPT-OSS-120B's TP=2 shape tuned and benched with PAD_I on (s42b.sh's first shape, CHAIN_PAD_I);
# on an H200, FP16_DOT at decode after untimed replays (item 210's prediction; in bursts it tied, item 75).
# start.sh s42a.sh, then wait.sh 560 until CHAIN_DONE (~11 minutes warm on an H100, ~13 on an H200).
source benchmarks/gpu_session/common.sh "$1"
step "GPU tests: the register form (PAD_I among them) and the tail pass"
timeout 240 python3 -m pytest -q -n 12 -p no:cacheprovider -rfE tests/test_gpu.py -k "wsrr or tail_pass" \
  >"$R/tests.log" 2>&1; tests_rc=$?
tail -4 "$R/tests.log"; echo "tests rc=$tests_rc"
CHAIN_NESTED=1 bash benchmarks/gpu_session/s41b.sh "$R"
[ $tests_rc = 0 ] && CHAIN_NESTED=1 CHAIN_PAD_I=1 S42B_SHAPES=1440 S42B_BUDGET_S=240 \
  bash benchmarks/gpu_session/s42b.sh "$R"
# item 210 is about the H200's power cap at decode (item 206); an H100 does not reach its cap there (item 207)
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && for warm in 0.5; do
  mkdir -p "$R/fp16_dot_$warm"; step "A/B fp16_dot --warm-s $warm"
  timeout 150 python3 benchmarks/variant_ab.py fp16_dot --out "$R/fp16_dot_$warm" --shapes mixtral-8x7b mixtral-8x22b \
    --m 1,2,16 --rounds 3 --warm-s $warm 2>&1 | grep -v -i warn
done
step "done"; echo CHAIN_DONE
