#!/bin/sh
# Attention alone, Q8_0 KV: the single-row kernel (old) and the multi-row
# kernel (rows) alternating in one process, 2 threads, 30 layers at 16K.
OUT=bench/results/spec-bench-20261203-q8rows
uptime > $OUT/early-attention-uptime-start.txt
$BAR -t 2 --kv q8_0 --nq 1,2,3,4,9 --depths 16384 --kernel both > $OUT/early-attention-rows-q8_0.txt 2>&1
echo "rows rc=$?"
uptime > $OUT/early-attention-uptime-end.txt
