#!/bin/sh
# ellm bench --spec with Q8_0 KV: the tree before the multi-row Q8_0 kernel
# (base, main at 1030bce) and after it (new), alternating, two rounds.
OUT=bench/results/spec-bench-20261203-q8rows
M=/tmp/smollm2-135m-q8_0.gguf
uptime > $OUT/early-spec-uptime-start.txt
for r in 1 2; do
  for b in base new; do
    /tmp/q8rows-$b-ellm bench -m $M -t 2 --kv-type q8_0 --depths 16384,32768 --synthetic-kv --prefill 0 -n 16 --bw-mb 512 \
      --spec quant:q4_0:sparse:128 --spec-tokens-per-verify 5.35 --json > $OUT/early-round$r-$b.json 2> $OUT/early-round$r-$b.err
    echo "round $r $b rc=$?"
  done
done
uptime > $OUT/early-spec-uptime-end.txt
