#!/bin/sh
# Perplexity and KL divergence from F32 of the evaluation model converted to
# every `ellm convert` type, with and without an importance matrix, and for
# q4_0 and int4-g128 with an importance matrix that holds input covariances
# (error-feedback rounding; bench/CONVERT.md). The HF folder is written from models/evalmodel.gguf by
# the converter tests' writer (ELLM_KEEP_TMP keeps it); the imatrix is
# calibrated on Python standard-library source (training-like text), never
# on the held-out text that is scored.
# Usage: sh bench/convert_ppl.sh [BUILD] [WINDOWS]   (from the top of the tree;
# needs BUILD/bench/quant_kl: make BUILD/bench/quant_kl)
# Prints the Markdown table, then the raw `ellm eval --json` line of every
# run (RAW type imatrix JSON) and quant_kl's JSON lines (KL ...).
set -eu
B=${1:-build}
W=${2:-16}
[ -x "$B/bench/quant_kl" ] || { echo "error: $B/bench/quant_kl is missing (make $B/bench/quant_kl)" >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
TMPDIR=$T ELLM_KEEP_TMP=1 "$B/tests/test_convert" >/dev/null 2>&1 || true
HF=$(ls -d "$T"/ellm-test-*/evalmodel)
CAL=$T/calib.txt
cat $(ls /usr/lib/python3*/[a-m]*.py | head -40) > "$CAL"
"$B/ellm" calibrate --imatrix -m models/evalmodel.gguf -f "$CAL" -o "$T/ev.imatrix" --ctx 512 --chunks 32 \
    > "$T/calib.log" 2>&1
"$B/ellm" calibrate --imatrix --covariance -m models/evalmodel.gguf -f "$CAL" -o "$T/cov.imatrix" --ctx 512 \
    --chunks 32 > "$T/calib-cov.log" 2>&1
ppl() { # MODEL TYPE IMATRIX -> the dense perplexity; the JSON goes to $T/raw
    j=$("$B/ellm" eval -m "$1" -f tests/data/heldout-sample.txt --ctx 2048 --compare dense --windows "$W" --json \
        2>/dev/null)
    echo "RAW $2 $3 $j" >> "$T/raw"
    echo "$j" | grep -o '"ppl": *[0-9.]*' | head -1 | grep -o '[0-9.]*$'
}
TYPES="f32 f16 bf16 q8_0 q6_k q4_k_m q4_0 int4-g128"
KLFILES=""
for ty in $TYPES; do
    np=$("$B/ellm" convert "$HF" -o "$T/$ty.gguf" --type "$ty" 2>&1 | tail -1 | grep -o '[0-9.]*M parameters' |
         grep -o '^[0-9.]*')
    echo "$np" > "$T/$ty.np"
    ppl "$T/$ty.gguf" "$ty" no > "$T/$ty.ppl"
    "$B/ellm" convert "$HF" -o "$T/$ty-im.gguf" --type "$ty" --imatrix "$T/ev.imatrix" >/dev/null 2>&1
    if cmp -s "$T/$ty.gguf" "$T/$ty-im.gguf"; then
        rm "$T/$ty-im.gguf"
    else
        ppl "$T/$ty-im.gguf" "$ty" yes > "$T/$ty-im.ppl"
        KLFILES="$KLFILES $T/$ty-im.gguf"
    fi
    [ "$ty" = f32 ] || KLFILES="$KLFILES $T/$ty.gguf"
    if [ "$ty" = q4_0 ] || [ "$ty" = int4-g128 ]; then
        "$B/ellm" convert "$HF" -o "$T/$ty-cov.gguf" --type "$ty" --imatrix "$T/cov.imatrix" >/dev/null 2>&1
        ppl "$T/$ty-cov.gguf" "$ty" covariance > "$T/$ty-cov.ppl"
        KLFILES="$KLFILES $T/$ty-cov.gguf"
    fi
done
# KL(F32 || type) over the same windows, one run against the F32 file
"$B/bench/quant_kl" "$T/f32.gguf" tests/data/heldout-sample.txt "$W" $KLFILES > "$T/kl"
kl() { grep "\"model\": \"$1\"" "$T/kl" | grep -o '"kl": *[0-9.]*' | grep -o '[0-9.]*$'; }
F32=$(cat "$T/f32.ppl")
printf '| type | bits/weight (whole file) | ppl | vs F32 | KL from F32 | ppl with imatrix | vs F32 | KL from F32 | ppl with covariance | vs F32 | KL from F32 |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|\n'
for ty in $TYPES; do
    p=$(cat "$T/$ty.ppl")
    size=$(stat -c %s "$T/$ty.gguf")
    bpw=$(awk -v s="$size" -v n="$(cat "$T/$ty.np")" 'BEGIN{printf "%.2f", s*8/(n*1e6)}')
    r=$(awk -v a="$p" -v b="$F32" 'BEGIN{printf "%+.2f%%", (a/b-1)*100}')
    k=$([ "$ty" = f32 ] && echo 0 || kl "$T/$ty.gguf")
    if [ -f "$T/$ty-im.ppl" ]; then
        pi=$(cat "$T/$ty-im.ppl")
        ki=$(kl "$T/$ty-im.gguf")
    else
        pi="$p (same file)"
        ki=$k
    fi
    ri=$(awk -v a="${pi%% *}" -v b="$F32" 'BEGIN{printf "%+.2f%%", (a/b-1)*100}')
    if [ -f "$T/$ty-cov.ppl" ]; then
        pc=$(cat "$T/$ty-cov.ppl")
        rc=$(awk -v a="$pc" -v b="$F32" 'BEGIN{printf "%+.2f%%", (a/b-1)*100}')
        kc=$(kl "$T/$ty-cov.gguf")
    else
        pc=-; rc=-; kc=-
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$ty" "$bpw" "$p" "$r" "$k" "$pi" "$ri" "$ki" \
        "$pc" "$rc" "$kc"
done
echo
tail -1 "$T/calib.log"
cat "$T/raw"
sed 's/^/KL /' "$T/kl"
