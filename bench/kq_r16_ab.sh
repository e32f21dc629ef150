#!/bin/sh
# Q4_K and Q5_K matrices interleaved by 16 rows (kern_r16_pack; AVX2
# machines) against the file's layout, in one run: the same ellm binary with and without
# --keep-layout (which keeps every matrix in the file's layout), round after
# round, plus llama-bench's prefill and decode on the same file in each round
# when LLAMA_BENCH names it.
#
#   LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench \
#     sh bench/kq_r16_ab.sh build/ellm MODEL_Q4_K_M_OR_Q5_K_M.gguf OUT_DIR [ROUNDS]
#
# Writes OUT_DIR/{r16,file}-N.json (ellm bench --json: prefill of 128 and 512
# tokens, 3 timed passes each; decode at depth 512), OUT_DIR/llama-{pp,tg}-N.json
# (prefill of 128 and 512 tokens; decode at depth 512) and
# OUT_DIR/table.md (medians over the rounds, python3 bench/kq_r16_table.py).
set -eu
ELLM=$1
MODEL=$2
OUT=$3
ROUNDS=${4:-4}
mkdir -p "$OUT"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for v in r16 file; do
        extra=""
        [ "$v" = file ] && extra="--keep-layout"
        "$ELLM" bench -m "$MODEL" -t 2 --depths 512 --prefill 128,512 --prefill-reps 3 -n 32 --bw-mb 256 $extra \
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
python3 "$(dirname "$0")/kq_r16_table.py" "$OUT" > "$OUT/table.md"
cat "$OUT/table.md"
