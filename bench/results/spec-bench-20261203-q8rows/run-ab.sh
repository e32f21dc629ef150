#!/bin/sh
# Same tree (284dc3b) with the multi-row Q8_0 kernel switched off in attn_rows_kernel (off) and on (new), alternating.
OUT=bench/results/spec-bench-20261203-q8rows
M=/tmp/smollm2-135m-q8_0.gguf
uptime > $OUT/ab-uptime-start.txt
for r in 1 2; do
  for b in off new; do
    /tmp/q8rows-$b-ellm bench -m $M -t 2 --kv-type q8_0 --depths 16384,32768 --synthetic-kv --prefill 0 -n 16 --bw-mb 512 \
      --spec quant:q4_0:sparse:128 --spec-tokens-per-verify 5.35 --json > $OUT/ab$r-$b.json 2> $OUT/ab$r-$b.err
    echo "round $r $b rc=$?"
  done
done
uptime > $OUT/ab-uptime-end.txt
