#!/bin/sh
# speculative speed runs: F16 and Q8_0 KV alternating, three drafters
cd /work/wt/verify
OUT=bench/results/spec-bench-20261203-verify
M=/tmp/smollm2-135m-q8_0.gguf
uptime > $OUT/round1-uptime-start.txt
for kv in f16 q8_0; do
  for d in "quant:q4_0:sparse:128 5.35" "sparse:128 5.57" "quant:q4_0 7.05"; do
    set -- $d
    name=$(echo $1 | tr ':' '-')
    build/ellm bench -m $M -t 2 --depths 16384,32768 --synthetic-kv --kv-type $kv --prefill 0 -n 16 --bw-mb 512 \
      --spec $1 --spec-tokens-per-verify $2 --json > $OUT/round1-$name-$kv.json 2> $OUT/round1-$name-$kv.err
    echo "$kv $1 rc=$?"
  done
done
uptime > $OUT/round1-uptime-end.txt
