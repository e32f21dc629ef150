#!/bin/sh
# ellm bench of two builds alternated, 2 threads, dense decode at 16K and 32K
# with synthetic KV, F16 and Q8_0 KV, 3 rounds, each command under
# bench/quietly.py. OLD: main at 7b9eebb with src/attention as of 1dc0880
# (before the Q8_0 multi-block steps); NEW: 7b9eebb. From the repository root:
#   OLD=/path/to/old/ellm NEW=build/ellm LOCK=/path/to/cpu.lock sh bench/results/kv-q8-steps-20261204/run.sh
out=bench/results/kv-q8-steps-20261204
for r in 1 2 3; do
  for kv in f16 q8_0; do
    for v in old new; do
      if [ $v = old ]; then B=${OLD:?old build}; else B=${NEW:-build/ellm}; fi
      python3 bench/quietly.py ${LOCK:-/tmp/ellm-bench.lock} $B bench -m /tmp/smollm2-135m-q8_0.gguf -t 2 --kv-type $kv \
        --depths 16384,32768 --synthetic-kv --prefill 0 --bw-mb 256 -n 24 --json > $out/abf-$r-$kv-$v.json 2>/dev/null
      echo "round $r $kv $v done $(date +%T) steal $(awk '/^cpu /{print $9}' /proc/stat)"
    done
  done
done
