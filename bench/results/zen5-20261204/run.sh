#!/bin/sh
# Issue 15 / 10 figures on this machine (raw JSON into bench/results/zen5-20261204/)
set -u
cd /work/wt/serve4
OUT=bench/results/zen5-20261204
mkdir -p $OUT
M=/tmp/smollm2-135m-q8_0.gguf
for r in 1 2 3; do
  build/ellm bench -m $M -t 2 --depths 16384,32768,131072 --synthetic-from 4096 --sparse-topk 2048 --kv-type q8_0 --kv-compare f16 --prefill 0 -n 24 --json > $OUT/kv-sparse-round$r.json 2> $OUT/kv-sparse-round$r.err
done
for kv in q8_0 f16; do
  build/ellm bench -m $M -t 2 --depths 16384,32768 --synthetic-from 4096 --spec quant:q4_0:sparse:128 --spec-tokens-per-verify 5.35 --kv-type $kv --prefill 0 -n 16 --json > $OUT/spec-quant-$kv.json 2> $OUT/spec-quant-$kv.err
  build/ellm bench -m $M -t 2 --depths 16384,32768 --synthetic-from 4096 --spec sparse:128 --spec-tokens-per-verify 5.57 --kv-type $kv --prefill 0 -n 16 --json > $OUT/spec-sparse-$kv.json 2> $OUT/spec-sparse-$kv.err
done
cp /work/notes/measure2.sh $OUT/run.sh
