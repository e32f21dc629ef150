#!/bin/sh
# ellm bench of two builds alternated, 2 threads, dense decode at depth 0, 16K
# and 32K with synthetic KV, F16 and Q8_0 KV; one round per call, each command
# under bench/quietly.py. OLD: main at cfd35d6 with c5f340b and cfd35d6
# reverted (the same tree without the line prefetch and the balanced ranges);
# NEW: main at cfd35d6. Run from the repository root:
#   OLD=/path/to/old/build/ellm NEW=/path/to/new/build/ellm sh bench/results/gemv-20261204/run.sh ROUND
out=bench/results/gemv-20261204
r=${1:?round}
for kv in f16 q8_0; do
  for v in old new; do
    if [ $v = old ]; then B=${OLD:?old build}; else B=${NEW:?new build}; fi
    python3 bench/quietly.py ${LOCK:-/tmp/ellm-bench.lock} $B bench -m /tmp/smollm2-135m-q8_0.gguf -t 2 --kv-type $kv \
      --depths 0,16384,32768 --synthetic-kv --prefill 0 --bw-mb 256 -n 24 --json > $out/ab-$r-$kv-$v.json 2>/dev/null
    echo "round $r $kv $v done $(date +%T) steal $(awk '/^cpu /{print $9}' /proc/stat)"
  done
done
