#!/bin/bash
# NOTES item 173: after the shards' bf16 tables took TMA (item 167), int8 reads over 1.05x bf16's time at
# TP=4 8x7b (I=3584) M=512 and 2048: an int8 tune of those rows (and 4096-8192, 8x22b TP=2 M=512), three rounds
# against the tables, the fold (1% floor). ~5 minutes warm; extract the int8 shard tables from configs.tgz.
source benchmarks/gpu_session/common.sh "$1"
retune /tmp/retuned_tp "8,4096,3584,2 --m 512,2048,4096,8192 --budget-s 120" "8,6144,8192,2 --m 512 --budget-s 40"
ab retuned tp_int8/i3584 --values 0,1 --rounds 3 --shapes 8:4096:3584:2 --m 512,2048,4096,8192
ab retuned tp_int8/i8192 --values 0,1 --rounds 3 --shapes 8:6144:8192:2 --m 512
tables_tgz; tar czf "$R/tp_int8/tables.tgz" -C /tmp/retuned_tp .
step "done"; echo CHAIN_DONE
