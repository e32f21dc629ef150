#!/bin/sh
# Runs the test program of every tests/test_*.c from $1/tests (default build)
# and sums their "N passed, N failed" lines. A listed program that was not
# built, or that ends without that line, fails. Lines "SKIP: reason" that a
# program prints are shown and counted. The last line is
# "N passed, N failed, N skipped"; the exit status is non-zero on any failure.
BUILD=${1:-build}
SRC=$(dirname "$0")
# Node.js 20 from tools/node where the system's is older (tools/node/ensure.sh).
NODE20=$(sh "$SRC/../tools/node/ensure.sh" --bin)
if [ -n "$NODE20" ]; then
    PATH="$NODE20:$PATH"
    export PATH
    echo "Node.js for the tests: $(node --version) from tools/node"
fi
total_p=0; total_f=0; total_s=0; bad=""
for src in "$SRC"/test_*.c; do
    name=$(basename "$src" .c)
    t="$BUILD/tests/$name"
    if [ ! -x "$t" ]; then
        printf '%-28s MISSING: %s was not built from %s\n' "$name" "$t" "$src"
        bad="$bad $name"; total_f=$((total_f + 1))
        continue
    fi
    out=$(ELLM_BIN="$BUILD/ellm" "$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(printf '%s' "$line" | sed -E 's/^([0-9]+) passed.*/\1/'); p=${p:-0}
    f=$(printf '%s' "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/'); f=${f:-0}
    s=$(printf '%s\n' "$out" | grep -c '^SKIP: ')
    if [ -z "$line" ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ "$f" -ne 0 ] || [ $rc -ne 0 ]; then
        printf '%s\n' "$out" | grep -v '^[0-9]* passed' | grep -v '^SKIP: ' | tail -n 40
        bad="$bad $name"
    fi
    printf '%-28s %s%s\n' "$name" "${line:-exit $rc, no summary line}" \
        "$([ "$s" -gt 0 ] && printf ', %d skipped' "$s")"
    printf '%s\n' "$out" | grep '^SKIP: ' | sed "s/^/    $name: /"
    total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
done
[ -n "$bad" ] && echo "failing:$bad"
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
