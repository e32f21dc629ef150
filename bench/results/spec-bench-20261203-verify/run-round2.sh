#!/bin/sh
cd /work/wt/verify
OUT=bench/results/spec-bench-20261203-verify
M=/tmp/smollm2-135m-q8_0.gguf
uptime > $OUT/round2-uptime-start.txt
for kv in f16 q8_0; do
  for d in "quant:q4_0:sparse:128 5.35" "sparse:128 5.57"; do
    set -- $d
    name=$(echo $1 | tr ':' '-')
    build/ellm bench -m $M -t 2 --depths 16384,32768 --synthetic-kv --kv-type $kv --prefill 0 -n 16 --bw-mb 512 \
      --spec $1 --spec-tokens-per-verify $2 --json > $OUT/round2-$name-$kv.json 2> $OUT/round2-$name-$kv.err
    echo "$kv $1 rc=$?"
  done
done
build/ellm bench -m /tmp/llama3.2-1b-q4_0.gguf -t 2 --depths 16384 --synthetic-kv --kv-type f16 --prefill 0 -n 8 --bw-mb 512 \
  --spec sparse:128 --spec-tokens-per-verify 5.57 --json > $OUT/llama1b-sparse-128-f16.json 2> $OUT/llama1b-sparse-128-f16.err
echo "1b rc=$?"
build/bench/bench_attention_rows -t 2 --nq 1,2,3,4,9 --depths 16384 > $OUT/attention-rows-f16.txt 2>&1
echo "rows rc=$?"
uptime > $OUT/round2-uptime-end.txt
