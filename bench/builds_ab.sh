#!/bin/sh
# Two ellm builds on one GGUF file, alternated round by round in one run (not
# a test): prefill of 128 and 512 tokens (3 timed passes each) and decode at
# depth 512, plus llama.cpp's llama-bench on the same file in each round when
# LLAMA_BENCH names it (flash attention off and on, 2 threads pinned).
#
#   LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench \
#     sh bench/builds_ab.sh OLD_ELLM NEW_ELLM MODEL.gguf OUT_DIR [ROUNDS]
#
# Writes OUT_DIR/{new,old}-N.json (ellm bench --json), OUT_DIR/llama-{pp,tg}-N.json
# and OUT_DIR/table.md (medians over the rounds, python3 bench/kq_r16_table.py).
set -eu
[ $# -ge 4 ] || { sed -n '2,11p' "$0"; exit 2; }
OLD=$1
NEW=$2
MODEL=$3
OUT=$4
ROUNDS=${5:-3}
mkdir -p "$OUT"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for v in new old; do
        if [ "$v" = new ]; then bin=$NEW; else bin=$OLD; fi
        "$bin" bench -m "$MODEL" -t 2 --depths 512 --prefill 128,512 --prefill-reps 3 -n 32 --bw-mb 256 \
            --json > "$OUT/$v-$r.json"
        echo "round $r: $v"
    done
    if [ -n "${LLAMA_BENCH:-}" ]; then
        "$LLAMA_BENCH" -m "$MODEL" -t 2 -C 0x3 --cpu-strict 1 -fa off,on -p 128,512 -n 0 -r 3 -o json \
            > "$OUT/llama-pp-$r.json"
        "$LLAMA_BENCH" -m "$MODEL" -t 2 -C 0x3 --cpu-strict 1 -fa off,on -p 0 -n 32 -d 512 -r 3 -o json \
            > "$OUT/llama-tg-$r.json"
        echo "round $r: llama-bench"
    fi
    r=$((r + 1))
done
python3 "$(dirname "$0")/kq_r16_table.py" "$OUT" new old new old > "$OUT/table.md"
cat "$OUT/table.md"
