#!/bin/sh
# n choices of one prompt, two builds side by side: wall time of a request and
# the rows the server computed for it (ellm_engine_rows_total), with a new
# random 512-token prompt for every request (no slot holds it beforehand).
# Servers listen on 127.0.0.1 only; 3 rounds x 3 requests per build.
#
#   sh bench/prompt_share_ab.sh BIN_A BIN_B MODEL.gguf > out.txt
#
# Prints a line per request, then a markdown table of the medians.
set -eu
A=$1 B=$2 MODEL=$3 PORT=18090
LINES=$(mktemp)
for round in 1 2 3; do
  for bin in "$A" "$B"; do
    "$bin" serve -m "$MODEL" --port $PORT --parallel 8 -c 1024 -t 2 > /dev/null 2>&1 &
    pid=$!
    for i in $(seq 1 300); do curl -s localhost:$PORT/health 2>/dev/null | grep -q ok && break; sleep 0.1; done
    prev=0
    for n in 1 4 8; do
      seed=$((round * 100 + n))
      P=$(python3 -c "print(','.join(str(1 + ((i * 7919 + $seed * 613) % 2000)) for i in range(512)))")
      t0=$(date +%s%N)
      curl -s --max-time 120 localhost:$PORT/v1/completions -H 'content-type: application/json' \
        -d "{\"prompt\":[$P],\"max_tokens\":16,\"temperature\":0.8,\"seed\":$seed,\"n\":$n,\"ignore_eos\":true}" > /dev/null
      t1=$(date +%s%N)
      rows=$(curl -s localhost:$PORT/metrics | awk '/^ellm_engine_rows_total/ {print $2}')
      echo "round=$round bin=$bin n=$n ms=$(( (t1 - t0) / 1000000 )) rows=$((rows - prev))" | tee -a "$LINES"
      prev=$rows
    done
    kill $pid
    wait $pid 2>/dev/null || true
  done
done
echo
echo "| n | $A: ms (rows) | $B: ms (rows) |"
echo "|---:|---:|---:|"
for n in 1 4 8; do
  med() { grep "bin=$1 n=$n " "$LINES" | sed 's/.*ms=\([0-9]*\).*/\1/' | sort -n | sed -n 2p; }
  rows() { grep "bin=$1 n=$n " "$LINES" | sed 's/.*rows=\([0-9]*\).*/\1/' | head -1; }
  echo "| $n | $(med "$A") ($(rows "$A")) | $(med "$B") ($(rows "$B")) |"
done
rm -f "$LINES"
