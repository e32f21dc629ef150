#!/bin/sh
# Perplexity of the evaluation model converted to every `ellm convert` type,
# with and without an importance matrix, against F32 (bench/CONVERT.md). The
# HF folder is written from models/evalmodel.gguf by the converter tests'
# writer (ELLM_KEEP_TMP keeps it); the imatrix is calibrated on Python
# standard-library source (training-like text), never on the held-out text
# that is scored.
# Usage: sh bench/convert_ppl.sh [BUILD] [WINDOWS]   (from the top of the tree)
# Prints the Markdown table, then the raw `ellm eval --json` line of every
# run (RAW type imatrix JSON).
set -eu
B=${1:-build}
W=${2:-16}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
TMPDIR=$T ELLM_KEEP_TMP=1 "$B/tests/test_convert" >/dev/null 2>&1 || true
HF=$(ls -d "$T"/ellm-test-*/evalmodel)
CAL=$T/calib.txt
cat $(ls /usr/lib/python3*/[a-m]*.py | head -40) > "$CAL"
"$B/ellm" calibrate --imatrix -m models/evalmodel.gguf -f "$CAL" -o "$T/ev.imatrix" --ctx 512 --chunks 32 \
    > "$T/calib.log" 2>&1
ppl() { # MODEL -> the dense perplexity; the JSON goes to $T/raw
    j=$("$B/ellm" eval -m "$1" -f tests/data/heldout-sample.txt --ctx 2048 --compare dense --windows "$W" --json \
        2>/dev/null)
    echo "RAW $2 $3 $j" >> "$T/raw"
    echo "$j" | grep -o '"ppl": *[0-9.]*' | head -1 | grep -o '[0-9.]*$'
}
printf '| type | bits/weight (whole file) | ppl | vs F32 | ppl with imatrix | vs F32 |\n|---|---|---|---|---|---|\n'
F32=""
for ty in f32 f16 bf16 q8_0 q6_k q4_k_m q4_0 int4-g128; do
    np=$("$B/ellm" convert "$HF" -o "$T/m.gguf" --type "$ty" 2>&1 | tail -1 | grep -o '[0-9.]*M parameters' |
         grep -o '^[0-9.]*')
    size=$(stat -c %s "$T/m.gguf")
    p=$(ppl "$T/m.gguf" "$ty" no)
    [ -z "$F32" ] && F32=$p
    "$B/ellm" convert "$HF" -o "$T/mi.gguf" --type "$ty" --imatrix "$T/ev.imatrix" >/dev/null 2>&1
    if cmp -s "$T/m.gguf" "$T/mi.gguf"; then
        pi="$p (same file)"
        ri=$(awk -v a="$p" -v b="$F32" 'BEGIN{printf "%+.2f%%", (a/b-1)*100}')
    else
        pi=$(ppl "$T/mi.gguf" "$ty" yes)
        ri=$(awk -v a="$pi" -v b="$F32" 'BEGIN{printf "%+.2f%%", (a/b-1)*100}')
    fi
    bpw=$(awk -v s="$size" -v n="$np" 'BEGIN{printf "%.2f", s*8/(n*1e6)}')
    r=$(awk -v a="$p" -v b="$F32" 'BEGIN{printf "%+.2f%%", (a/b-1)*100}')
    printf '| %s | %s | %s | %s | %s | %s |\n' "$ty" "$bpw" "$p" "$r" "$pi" "$ri"
done
echo
tail -1 "$T/calib.log"
cat "$T/raw"
