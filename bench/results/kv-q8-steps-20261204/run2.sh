#!/bin/sh
# A second run, NEW only (7b9eebb): F16 and Q8_0 KV alternated, 4 rounds, same
# command as run.sh. From the repository root:
#   NEW=build/ellm LOCK=/path/to/cpu.lock sh bench/results/kv-q8-steps-20261204/run2.sh
out=bench/results/kv-q8-steps-20261204/run2
for r in 1 2 3 4; do
  for kv in f16 q8_0; do
    python3 bench/quietly.py ${LOCK:-/tmp/ellm-bench.lock} ${NEW:-build/ellm} bench -m /tmp/smollm2-135m-q8_0.gguf -t 2 --kv-type $kv \
      --depths 16384,32768 --synthetic-kv --prefill 0 --bw-mb 256 -n 24 --json > $out/abf-$r-$kv-new.json 2>/dev/null
    echo "round $r $kv done $(date +%T) steal $(awk '/^cpu /{print $9}' /proc/stat)"
  done
done
