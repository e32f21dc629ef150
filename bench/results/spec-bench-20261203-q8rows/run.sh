#!/bin/sh
# Final A/B: attention alone (old = single-row Q8_0 kernel, rows = multi-row, alternating in one process),
# then ellm bench --spec, tree before the Q8_0 multi-row kernel (base, 1030bce) and with it (new, 284dc3b), alternating.
OUT=bench/results/spec-bench-20261203-q8rows
M=/tmp/smollm2-135m-q8_0.gguf
uptime > $OUT/uptime-start.txt
/tmp/q8rows-new-bar -t 2 --kv q8_0 --nq 1,2,3,4,9 --depths 16384,32768 --kernel both > $OUT/attention-rows-q8_0.txt 2>&1
echo "rows rc=$?"
for r in 1 2; do
  for b in base new; do
    /tmp/q8rows-$b-ellm bench -m $M -t 2 --kv-type q8_0 --depths 16384,32768 --synthetic-kv --prefill 0 -n 16 --bw-mb 512 \
      --spec quant:q4_0:sparse:128 --spec-tokens-per-verify 5.35 --json > $OUT/round$r-$b.json 2> $OUT/round$r-$b.err
    echo "round $r $b rc=$?"
  done
done
uptime > $OUT/uptime-end.txt
