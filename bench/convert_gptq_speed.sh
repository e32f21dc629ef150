#!/bin/sh
# Time and peak RSS of `ellm calibrate --imatrix` with and without
# --covariance and of `ellm convert` to q4_0 and int4-g128 with either file,
# on a Llama-3.2-1B-shaped BF16 checkpoint (bench/CONVERT.md).
# Usage: sh bench/convert_gptq_speed.sh [BUILD] [CALIB_MODEL] [TEXT]
#   BUILD        build folder (default build; needs BUILD/bench/convert_synth_hf)
#   CALIB_MODEL  a 1B-shaped GGUF to collect the imatrix with (default: made by
#                `ellm synth --shape llama3.2-1b --type q4_0`)
#   TEXT         sample text (default: 40 Python standard-library files)
# Prints one line per step: seconds, CPU seconds, peak RSS, file size.
set -eu
B=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
M=${2:-}
if [ -z "$M" ]; then
    M=$T/1b.gguf
    "$B/ellm" synth --shape llama3.2-1b --type q4_0 -o "$M" >/dev/null 2>&1
fi
TXT=${3:-$T/calib.txt}
[ -n "${3:-}" ] || cat $(ls /usr/lib/python3*/[a-m]*.py | head -40) > "$TXT"
"$B/bench/convert_synth_hf" "$T/hf" --shape llama3.2-1b --dtype bf16 >/dev/null
echo "load: $(cat /proc/loadavg)"
for n in plain cov; do
    f=; [ $n = cov ] && f=--covariance
    /usr/bin/time -f "calibrate imatrix-$n (1024 tokens): %e s, user+sys %U+%S s, peak RSS %M KB" \
        "$B/ellm" calibrate --imatrix $f -m "$M" -f "$TXT" -o "$T/$n.imatrix" --ctx 512 --chunks 2 2>&1 |
        grep '^calibrate imatrix-'
    echo "  file bytes $(stat -c %s "$T/$n.imatrix")"
done
for ty in q4_0 int4-g128; do
    for n in plain cov; do
        /usr/bin/time -f "convert $ty imatrix-$n: %e s, user+sys %U+%S s, peak RSS %M KB" \
            "$B/ellm" convert "$T/hf" -o "$T/out.gguf" --type "$ty" --threads 2 --imatrix "$T/$n.imatrix" 2>&1 |
            grep "^convert $ty imatrix-"
    done
done
echo "load: $(cat /proc/loadavg)"
