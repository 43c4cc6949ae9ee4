#!/bin/bash
# Wait up to $1 seconds for the chain to finish, then copy what it has to $OUT and show the log's end.
R=/tmp/gpu_session
end=$((SECONDS + ${1:-560}))
while [ $SECONDS -lt $end ] && ! grep -q CHAIN_DONE "$R/chain.log" 2>/dev/null; do sleep 5; done
cp -r "$R"/. "$OUT"/ 2>/dev/null; rm -rf "$OUT/configs" "$OUT/cache"  # tables travel as configs.tgz
tail -c 8000 "$R/chain.log"
