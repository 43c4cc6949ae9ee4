#!/bin/bash
# NOTES item 121, after the change, in the session's last device seconds: the chunked align's GPU test
# (equal to the torch sort at 2048-65536 pairs) and the probe. ~1 minute.
source benchmarks/gpu_session/common.sh "$1"
step "gpu tests"; timeout 60 python3 -m pytest -q -m gpu tests/test_gpu.py -k "chunked_align" -p no:cacheprovider 2>&1 | tail -2
[ "${PIPESTATUS[0]}" = 0 ] || { step "gpu tests failed: stop"; echo CHAIN_DONE; exit 1; }
step "probe"; timeout 60 python3 benchmarks/align_parts_probe.py --out "$R" 2>&1 | grep -v -i warn | tail -6
step "done"; echo CHAIN_DONE
