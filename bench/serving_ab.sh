#!/bin/sh
# ellm serve, two builds side by side: OLD and NEW binaries take turns, each
# round running bench/run_serving.mjs at 1 and 16 streams plus its
# interference phase (a 512-token prompt arriving while 8 streams generate),
# loopback only, bounded in requests. One line per run: tokens/s at 1 and 16
# streams, TTFT loaded / alone, ITL p99 / the streams' median before the
# prompts, and / the window's median.
#
#   sh bench/serving_ab.sh OLD_ELLM NEW_ELLM [ROUNDS=3] [MODEL=/tmp/smollm2-135m-q8_0.gguf]
set -e
OLD=$1; NEW=$2; ROUNDS=${3:-3}; MODEL=${4:-/tmp/smollm2-135m-q8_0.gguf}
[ -x "$OLD" ] && [ -x "$NEW" ] || { echo "usage: sh bench/serving_ab.sh OLD_ELLM NEW_ELLM [ROUNDS] [MODEL]" >&2; exit 2; }
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  for v in old new; do
    b=$OLD; [ $v = new ] && b=$NEW
    node bench/run_serving.mjs --model "$MODEL" --servers ellm --ellm "$b" --levels 1,16 --rounds 1 --no-write > "$out/$v-$r.out" 2>&1
    t1=$(grep '| ellm serve | 1 |' "$out/$v-$r.out" | awk -F'|' '{print $4}')
    t16=$(grep '| ellm serve | 16 |' "$out/$v-$r.out" | awk -F'|' '{print $4}')
    inter=$(grep -A2 'TTFT alone ms' "$out/$v-$r.out" | tail -1 | awk -F'|' '{print "ttft_ratio", $5, "p99/before", $9, "p99/in", $10}')
    echo "$r $v 1=$t1 16=$t16 $inter"
  done
done
