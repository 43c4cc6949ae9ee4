#!/bin/bash
# NOTES session 39's open question: at M=8192 the tuner timed GPT-OSS-20B's int8 entry 11-16% faster than the bench.
# Both take 5 replays (--quick); they differ in the weight pool (the tuner's 2 GB: 2 int8 layers of this shape; the
# bench's default more) and in what ran before. The bench at M=8192 alone with each pool, then with 20 replays,
# the GPU's SM clock and power sampled every 50 ms beside each line's time stamp.
# start.sh s39d.sh, then wait.sh 300.
source benchmarks/gpu_session/common.sh "$1"
q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$q --format=csv,noheader >/dev/null 2>&1 || q=${q/clocks_event/clocks_throttle}
nvidia-smi --query-gpu=$q --format=csv -lms 50 >"$R/clocks.csv" 2>&1 & smi=$!
G=(--shapes 32:2880:2880:4 --activation swiglu_oai --biases --m 8192 --no-plot)
stamp() { while IFS= read -r line; do echo "$(date +%H:%M:%S.%3N) $line"; done; }
for form in "--pool-gb 2 --quick" "--quick" "--pool-gb 2 --reps 20" "--reps 20"; do
  step "bench 8192 $form"; timeout 90 bash benchmarks/gpu_session/cli.sh bench "${G[@]}" $form --out "$R/b" 2>&1 \
    | stamp | grep -E "E32|layer"
done
kill $smi
step "done"; echo CHAIN_DONE
