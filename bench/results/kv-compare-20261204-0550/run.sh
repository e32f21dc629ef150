#!/bin/sh
# Rounds of: F16-KV dense decode at 16K/32K, then Q8_0 KV against an F16 cache
# in one process (--kv-compare f16). Run as
#   python3 bench/quietly.py LOCK sh bench/results/kv-compare-20261204-0550/run.sh ELLM MODEL OUTDIR
# (rounds 1-3 at 05:50, rounds 4-7 at 05:52-05:53 UTC, tree 0fd7191).
E=$1; M=$2; O=$3
for r in 1 2 3; do
  "$E" bench -m "$M" -t 2 --depths 16384,32768 --synthetic-kv --kv-type f16 --prefill 0 -n 24 --bw-mb 256 --json > "$O/r$r-f16.json"
  "$E" bench -m "$M" -t 2 --depths 16384,32768 --synthetic-kv --kv-type q8_0 --kv-compare f16 --prefill 0 -n 24 --bw-mb 256 --json > "$O/r$r-cmp.json"
done
