#!/bin/sh
# Runs every test program in $1/tests and sums their "N passed, N failed" lines.
BUILD=${1:-build}
total_p=0; total_f=0; bad=""
for t in "$BUILD"/tests/test_*; do
    case "$t" in *.o|*.d) continue;; esac
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$(ELLM_BIN="$BUILD/ellm" "$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(printf '%s' "$line" | sed -E 's/^([0-9]+) passed.*/\1/'); p=${p:-0}
    f=$(printf '%s' "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/'); f=${f:-0}
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ "$f" -ne 0 ] || [ $rc -ne 0 ]; then
        printf '%s\n' "$out" | grep -v '^[0-9]* passed' | tail -n 40
        bad="$bad $name"
    fi
    printf '%-28s %s\n' "$name" "${line:-exit $rc}"
    total_p=$((total_p + p)); total_f=$((total_f + f))
done
[ -n "$bad" ] && echo "failing:$bad"
echo "$total_p passed, $total_f failed"
[ "$total_f" -eq 0 ]
