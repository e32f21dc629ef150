#!/bin/sh
# Q8_0 against F16 KV, dense decode alternating in one process (ellm bench --kv-compare), 3 runs.
OUT=bench/results/kv-compare-20261204
M=/tmp/smollm2-135m-q8_0.gguf
uptime > $OUT/uptime-start.txt
for r in 1 2 3; do
  build/ellm bench -m $M -t 2 --depths 16384,32768 --synthetic-kv --kv-type q8_0 --kv-compare f16 --prefill 0 \
    -n 48 --bw-mb 256 --json > $OUT/run$r.json 2> $OUT/run$r.err
  echo "run $r rc=$?"
done
uptime > $OUT/uptime-end.txt
