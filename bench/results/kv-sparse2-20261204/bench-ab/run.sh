#!/bin/sh
# usage: ab.sh OUTDIR ROUNDS DEPTHS NTOK BIN_A BIN_B ...  (alternates binaries per round)
out=$1; rounds=$2; depths=$3; n=$4; shift 4
mkdir -p $out
for r in $(seq 1 $rounds); do
  for b in "$@"; do
    name=$(basename $(dirname $b))-$(basename $b)
    $b bench -m /tmp/smollm2-135m-q8_0.gguf -t 2 --kv-type q8_0 --sparse-topk 2048 --depths $depths --synthetic-kv --prefill 0 -n $n --bw-mb 256 --json > $out/r$r-$name.json 2> $out/r$r-$name.err
  done
done
