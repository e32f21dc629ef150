#!/bin/sh
# Dense decode of two ellm builds, alternated round by round in one run (not
# a test): for each case, `ellm bench --json` of each build, whose dense points
# carry the paired bandwidth share and the split of a step (the layers'
# matmuls, attention, the output matrix, each with the GB/s it reads). A case
# is MODEL:THREADS:DEPTHS; a build is NAME=BINARY.
#
#   sh bench/decode_split_ab.sh OUT_DIR ROUNDS "MODEL:2:0,4096 MODEL2:1:0" new=build/ellm old=/tmp/build-base/ellm
#
# Writes OUT_DIR/NAME-CASE-ROUND.json (CASE = the case's index from 1) and
# OUT_DIR/table.md (python3 bench/decode_split_table.py OUT_DIR NAME_A NAME_B).
set -eu
[ $# -eq 5 ] || { sed -n '2,11p' "$0"; exit 2; }
OUT=$1 ROUNDS=$2 CASES=$3 A=$4 B=$5
mkdir -p "$OUT"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    c=1
    for case in $CASES; do
        model=${case%%:*}
        rest=${case#*:}
        threads=${rest%%:*}
        depths=${rest#*:}
        for v in "$A" "$B"; do
            name=${v%%=*}
            ${v#*=} bench -m "$model" -t "$threads" --depths "$depths" --synthetic-kv --prefill 0 -n 21 --json \
                > "$OUT/$name-$c-$r.json"
        done
        echo "round $r case $c ($case) done"
        c=$((c + 1))
    done
    r=$((r + 1))
done
python3 "$(dirname "$0")/decode_split_table.py" "$OUT" "${A%%=*}" "${B%%=*}" > "$OUT/table.md"
cat "$OUT/table.md"
