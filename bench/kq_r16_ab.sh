#!/bin/sh
# Q4_K and Q5_K matrices interleaved by 16 rows (kern_r16_pack; AVX2
# machines) against the file's layout, in one run: the same ellm binary with and without
# --keep-layout (which keeps every matrix in the file's layout), round after
# round, plus llama-bench's prefill and decode on the same file in each round
# when LLAMA_BENCH names it (bench/builds_ab.sh with variants r16 and file).
#
#   LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench \
#     sh bench/kq_r16_ab.sh build/ellm MODEL_Q4_K_M_OR_Q5_K_M.gguf OUT_DIR [ROUNDS]
#
# Writes OUT_DIR/{r16,file}-N.json (ellm bench --json: prefill of 128 and 512
# tokens, 3 timed passes each; decode at depth 512), OUT_DIR/llama-{pp,tg}-N.json
# (prefill of 128 and 512 tokens; decode at depth 512) and
# OUT_DIR/table.md (medians over the rounds, python3 bench/kq_r16_table.py).
set -eu
[ $# -ge 3 ] || { sed -n '2,14p' "$0"; exit 2; }
exec sh "$(dirname "$0")/builds_ab.sh" "$2" "$3" "${4:-4}" "r16=$1" "file=$1 --keep-layout"
