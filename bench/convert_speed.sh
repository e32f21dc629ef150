#!/bin/sh
# `ellm convert` speed and memory on a Llama-3.2-1B-shaped BF16 checkpoint
# (random weights, written by build/bench/convert_synth_hf), and decode speed
# of the q4_0, q4_k_m and int4-g128 files it makes, side by side
# (bench/CONVERT.md). Run under the exclusive CPU lock on a quiet machine:
#   flock -x LOCK sh bench/convert_speed.sh [BUILD] [THREADS]
# Prints one JSON object per measurement, then a summary.
set -eu
B=${1:-build}
TH=${2:-2}
T=${CONVERT_SPEED_DIR:-/tmp/ellm-convert-speed}
mkdir -p "$T"
[ -f "$T/hf/model.safetensors" ] || "$B/bench/convert_synth_hf" "$T/hf" --shape llama3.2-1b --dtype bf16
SRC=$(stat -c %s "$T/hf/model.safetensors")
# Read-speed bound: the checkpoint read once more (page cache warm: memory
# speed, what the converter's mmap reads see on this second pass).
cat "$T/hf/model.safetensors" > /dev/null
t0=$(date +%s.%N); cat "$T/hf/model.safetensors" > /dev/null; t1=$(date +%s.%N)
echo "{\"what\": \"read\", \"bytes\": $SRC, \"seconds\": $(echo "$t1 - $t0" | bc -l)}"
for ty in q4_0 q4_k_m int4-g128; do
    /usr/bin/time -f '%e %M' -o "$T/time.txt" "$B/ellm" convert "$T/hf" -o "$T/$ty.gguf" --type "$ty" \
        --threads "$TH" > /dev/null 2>&1
    read -r secs rss_kb < "$T/time.txt"
    echo "{\"what\": \"convert\", \"type\": \"$ty\", \"src_bytes\": $SRC, \"out_bytes\": $(stat -c %s "$T/$ty.gguf"), \"seconds\": $secs, \"peak_rss_kb\": $rss_kb}"
done
# Decode at depth 0, three rounds in alternating order; medians in the summary.
for round in 1 2 3; do
    for ty in q4_0 q4_k_m int4-g128; do
        j=$("$B/ellm" bench -m "$T/$ty.gguf" -t "$TH" --depths 0 --prefill 0 -n 32 --bw-mb 256 --json 2>/dev/null)
        tps=$(echo "$j" | grep -o '"tokens_per_s": *[0-9.]*' | head -1 | grep -o '[0-9.]*$')
        wb=$(echo "$j" | grep -o '"weight_bytes_per_token": *[0-9]*' | head -1 | grep -o '[0-9]*$')
        echo "{\"what\": \"decode\", \"type\": \"$ty\", \"round\": $round, \"tokens_per_s\": ${tps:-null}, \"weight_bytes_per_token\": ${wb:-null}}"
    done
done
