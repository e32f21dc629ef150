#!/bin/sh
# Two variants of ellm on one GGUF file, alternated round by round in one run
# (not a test): prefill of 128 and 512 tokens (3 timed passes each) and decode
# at depth 512, plus llama.cpp's llama-bench on the same file in each round when
# LLAMA_BENCH names it (flash attention off and on, 2 threads pinned). A
# variant is NAME=COMMAND: an ellm binary and any flags of its own.
#
#   LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench \
#     sh bench/builds_ab.sh MODEL.gguf OUT_DIR ROUNDS new=build/ellm old=/tmp/build-base/ellm
#
# Writes OUT_DIR/NAME-N.json (ellm bench --json) for both variants,
# OUT_DIR/llama-{pp,tg}-N.json and OUT_DIR/table.md (medians over the rounds,
# python3 bench/kq_r16_table.py OUT_DIR NAME_A NAME_B).
set -eu
[ $# -eq 5 ] || { sed -n '2,13p' "$0"; exit 2; }
MODEL=$1
OUT=$2
ROUNDS=$3
A=$4
B=$5
mkdir -p "$OUT"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for v in "$A" "$B"; do
        name=${v%%=*}
        # shellcheck disable=SC2086
        ${v#*=} bench -m "$MODEL" -t 2 --depths 512 --prefill 128,512 --prefill-reps 3 -n 32 --bw-mb 256 \
            --json > "$OUT/$name-$r.json"
        echo "round $r: $name"
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
python3 "$(dirname "$0")/kq_r16_table.py" "$OUT" "${A%%=*}" "${B%%=*}" > "$OUT/table.md"
cat "$OUT/table.md"
