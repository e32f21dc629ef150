#!/bin/sh
# Q8_0 KV cache against F16, two builds alternated round by round (the
# figures of bench/AVX2.md's "Q8_0 KV caches, whole blocks in integers"):
#   sh bench/q8kv_ab.sh OUT_DIR ROUNDS MODEL new=BUILD_DIR base=BUILD_DIR
# BUILD_DIR holds ellm and bench/ (make BUILD=... all bench). Writes
# cache-resident.txt, bench_attention-t2.txt, bench_attention-t1.txt and
# ellm-bench-kv-compare.txt; python3 bench/q8kv_ab_table.py OUT_DIR makes the
# table. Every run stays on this machine; each round runs both builds.
set -e
[ $# -eq 5 ] || { echo "usage: $0 OUT_DIR ROUNDS MODEL new=BUILD base=BUILD" >&2; exit 2; }
out=$1 rounds=$2 model=$3
new=${4#new=} base=${5#base=}
mkdir -p "$out"
: > "$out/cache-resident.txt"; : > "$out/bench_attention-t2.txt"
: > "$out/bench_attention-t1.txt"; : > "$out/ellm-bench-kv-compare.txt"
r=1
while [ $r -le "$rounds" ]; do
    for b in new base; do
        if [ $b = new ]; then d=$new; else d=$base; fi
        echo "== $b round $r" >> "$out/cache-resident.txt"
        taskset -c 1 "$d/bench/bench_attention_rows" -t 1 --kv q8_0 --nq 1,4 --depths 4096 2>&1 |
            grep "old  n_q" >> "$out/cache-resident.txt"
        echo "== $b round $r" >> "$out/bench_attention-t2.txt"
        "$d/bench/bench_attention" -t 2 --depths 16384,32768 2>&1 | grep -E "threads|F16|Q8_0" >> "$out/bench_attention-t2.txt"
        echo "== $b round $r" >> "$out/bench_attention-t1.txt"
        "$d/bench/bench_attention" -t 1 --depths 16384 2>&1 | grep -E "threads|F16|Q8_0" >> "$out/bench_attention-t1.txt"
        echo "== $b round $r" >> "$out/ellm-bench-kv-compare.txt"
        "$d/ellm" bench -m "$model" -t 2 --depths 4096,16384,32768 --synthetic-kv --prefill 0 -n 14 \
            --kv-type q8_0 --kv-compare f16 2>&1 | grep -E "bandwidth|dense |kv-ab" >> "$out/ellm-bench-kv-compare.txt"
    done
    r=$((r + 1))
done
