#!/bin/sh
# A/B of ellm serve on this machine: OLD and NEW binaries alternated, levels 1,16 + interference
OLD=$1; NEW=$2; ROUNDS=${3:-3}
cd "$(dirname "$0")/../.."
for r in $(seq 1 $ROUNDS); do
  for v in old new; do
    b=$OLD; [ $v = new ] && b=$NEW
    node bench/run_serving.mjs --model /tmp/smollm2-135m-q8_0.gguf --servers ellm --ellm $b --levels 1,16 --rounds 1 --no-write > /tmp/sab-$v-$r.out 2>&1
    t1=$(grep '| ellm serve | 1 |' /tmp/sab-$v-$r.out | awk -F'|' '{print $4}')
    t16=$(grep '| ellm serve | 16 |' /tmp/sab-$v-$r.out | awk -F'|' '{print $4}')
    inter=$(grep -A2 'TTFT alone ms' /tmp/sab-$v-$r.out | tail -1 | awk -F'|' '{print "ttft_ratio", $5, "p99/before", $9, "p99/in", $10}')
    echo "$r $v 1=$t1 16=$t16 $inter"
  done
done
