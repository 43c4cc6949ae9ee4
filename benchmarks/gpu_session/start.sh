#!/bin/bash
# Start the next GPU session's measurements detached (one device call is at most 10 minutes; this
# chain runs longer). Usage on the device, from the repository root:
#   EXPERTS_INT8_COMMIT=<sha> bash benchmarks/gpu_session/start.sh && bash benchmarks/gpu_session/wait.sh 570
# then, in each later call (within the machine's idle window): bash benchmarks/gpu_session/wait.sh 570
# An argument names another script in this folder to run instead of chain.sh (same log and $OUT).
# Results and the log land in /tmp/gpu_session; wait.sh copies them to $OUT.
R=/tmp/gpu_session
mkdir -p "$R"; rm -f "$R/chain.log"  # a warm machine keeps the last chain's log (and its CHAIN_DONE)
setsid nohup bash "benchmarks/gpu_session/${1:-chain.sh}" "$R" >/dev/null 2>&1 < /dev/null &
echo "started; log: $R/chain.log"
