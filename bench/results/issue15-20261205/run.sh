#!/bin/sh
# Issue 15's targets again at main 15cf584 (raw output beside this script):
# sparse vs empty context and Q8_0 / F16 KV dense (SmolLM2-135M shape, 3 rounds),
# Q8_0 against F16 KV perplexity on the evaluation model.
set -u
OUT=$(dirname "$0")
M=/tmp/smollm2-135m-q8_0.gguf
[ -f $M ] || build/ellm synth --shape smollm2-135m --type q8_0 -o $M
build/ellm probe > $OUT/probe-before.txt 2>&1
for r in 1 2 3; do
  build/ellm bench -m $M -t 2 --depths 16384,32768,131072 --synthetic-from 4096 --sparse-topk 2048 --kv-type q8_0 --kv-compare f16 --prefill 0 -n 24 --json > $OUT/kv-sparse-round$r.json 2> $OUT/kv-sparse-round$r.err
done
for kv in f16 q8_0; do
  build/ellm eval -f tests/data/heldout-sample.txt -t 2 --kv-type $kv > $OUT/eval-$kv.txt 2>&1
done
build/ellm probe > $OUT/probe-after.txt 2>&1
