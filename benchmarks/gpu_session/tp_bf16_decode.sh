#!/bin/bash
# NOTES item 174: the shards' bf16 decode entries that read far under copy (TP=4 8x7b M=1 41%, M=2 63%; TP=4 8x22b
# M=1 72%): a bf16 tune of those rows, three rounds against the tables, the fold (1% floor). ~2 minutes warm.
source benchmarks/gpu_session/common.sh "$1"
export TUNE_DTYPES=bf16
retune /tmp/retuned_tpd "8,4096,3584,2 --m 1,2 --budget-s 40" "8,6144,4096,2 --m 1 --budget-s 25"
ab retuned tpd/i3584 --dtype bf16 --values 0,1 --rounds 3 --shapes 8:4096:3584:2 --m 1,2
ab retuned tpd/i4096 --dtype bf16 --values 0,1 --rounds 3 --shapes 8:6144:4096:2 --m 1
tables_tgz; tar czf "$R/tpd.tgz" -C "$R" tpd; tar czf "$R/tpd_tables.tgz" -C /tmp/retuned_tpd .
step "done"; echo CHAIN_DONE
