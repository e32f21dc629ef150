#!/bin/sh
# ellm bench of two builds alternated (OLD: 1030bce, NEW: edb5c14), 2 threads, dense
# decode at 16K and 32K with synthetic KV, F16 and Q8_0 KV, 3 rounds, each command
# under bench/quietly.py. Run from the repository root:
#   OLD=/path/to/1030bce/build/ellm NEW=build/ellm sh bench/results/dense-pairs-20261203/run.sh
out=bench/results/dense-pairs-20261203
for r in 1 2 3; do
  for kv in f16 q8_0; do
    for v in old new; do
      if [ $v = old ]; then B=${OLD:?build of 1030bce}; else B=${NEW:-build/ellm}; fi
      python3 bench/quietly.py ${LOCK:-/tmp/ellm-bench.lock} $B bench -m /tmp/smollm2-135m-q8_0.gguf -t 2 --kv-type $kv \
        --depths 16384,32768 --synthetic-kv --prefill 0 --bw-mb 256 -n 24 --json > $out/abf-$r-$kv-$v.json 2>/dev/null
      echo "round $r $kv $v done $(date +%T) steal $(awk '/^cpu /{print $9}' /proc/stat)"
    done
  done
done
