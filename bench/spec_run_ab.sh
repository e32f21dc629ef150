#!/bin/sh
# ellm run with and without --spec, for two builds, alternated round by round
# in one run (not a test): plain decoding with NEW, then --spec with OLD and
# with NEW. Prints one line per run and a table of medians; every greedy output
# must be the same text, which the script checks. Writes the raw lines to
# OUT/runs.txt and the table to OUT/table.md.
#
#   sh bench/spec_run_ab.sh OLD_ELLM NEW_ELLM OUT ROUNDS MODEL PROMPT_FILE N CTX "RUN FLAGS" "SPEC"
#
# e.g. (bench/SPEC.md, 2026-12-05):
#   sh bench/spec_run_ab.sh /tmp/ellm-old build/ellm bench/results/spec-plain-20261205/135m-16k 2 \
#      /tmp/smollm2-135m-q8_0.gguf /tmp/p16k.txt 400 16900 "--kv-type q8_0" quant:q4_0:sparse:128
set -eu
[ $# -eq 10 ] || { sed -n '2,12p' "$0"; exit 2; }
OLD=$1 NEW=$2 OUT=$3 ROUNDS=$4 MODEL=$5 PROMPT=$6 N=$7 CTX=$8 FLAGS=$9
shift 9
SPEC=$1
mkdir -p "$OUT"
: > "$OUT/runs.txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for which in plain old new; do
        case $which in
        plain) bin=$NEW spec="" ;;
        old) bin=$OLD spec="--spec $SPEC" ;;
        new) bin=$NEW spec="--spec $SPEC" ;;
        esac
        # shellcheck disable=SC2086
        "$bin" run -m "$MODEL" -f "$PROMPT" -c "$CTX" -n "$N" --temp 0 $FLAGS $spec --stats --no-display-prompt \
            > "$tmp/out-$which-$r.txt" 2> "$tmp/err.txt"
        tps=$(sed -n 's/^decode: .*(\([0-9.]*\) tokens\/s)$/\1/p' "$tmp/err.txt")
        plain=$(sed -n 's/.*; \([0-9]* of [0-9]*\) passes plain.*/\1/p' "$tmp/err.txt")
        tpv=$(sed -n 's/^tokens_per_verify: \([0-9.]*\) .*/\1/p' "$tmp/err.txt")
        line="round $r $which tok/s ${tps:-?} tokens_per_verify ${tpv:--} plain_passes ${plain:--}"
        echo "$line" | tee -a "$OUT/runs.txt"
        cmp -s "$tmp/out-plain-1.txt" "$tmp/out-$which-$r.txt" || { echo "output of $which round $r differs" >&2; exit 1; }
    done
    r=$((r + 1))
done
awk -v model="$MODEL" -v spec="$SPEC" -v flags="$FLAGS" '
    { v[$3] = v[$3] " " $5; if ($3 != "plain") { tpv[$3] = $7; pp[$3] = $9 " " $10 " " $11 } }
    function med(s,   a, n, i, j, t) {
        n = split(s, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
        printf "%s, `%s`, --spec %s\n\n", model, flags, spec
        print "| run | tok/s per round | median | × plain | tokens per verify | plain passes |"
        print "|---|---|---:|---:|---:|---|"
        p = med(v["plain"])
        split("plain old new", w, " ")
        for (i = 1; i <= 3; i++) {
            m = med(v[w[i]])
            printf "| %s |%s | %.1f | %.2f | %s | %s |\n", w[i] == "plain" ? "plain decoding" : "--spec, " w[i], v[w[i]], m,
                   m / p, w[i] == "plain" ? "-" : tpv[w[i]], w[i] == "plain" ? "-" : pp[w[i]]
        }
    }' "$OUT/runs.txt" | tee "$OUT/table.md"
