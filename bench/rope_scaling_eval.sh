#!/bin/sh
# Perplexity beyond the training context with each RoPE scaling (not a test):
# `ellm eval` of the evaluation model (trained on 2048 tokens) over held-out
# text in windows of CTX tokens, scoring positions SCORE_FROM.. (beyond the
# training context), with the file's RoPE and with linear and YaRN scaling
# asked for; and in windows of 2048 tokens (within it) with the same settings,
# to show what each costs where no extension is needed. Writes each run's
# JSON to OUT and the table to OUT/table.md.
#
#   sh bench/rope_scaling_eval.sh OUT [CTX] [WINDOWS]      (default 8192, 2)
# e.g. (bench/LONGGEN.md):
#   sh bench/rope_scaling_eval.sh bench/results/rope-scaling-eval-20261207
set -eu
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
OUT=$1 CTX=${2:-8192} WINDOWS=${3:-2}
ELLM=${ELLM:-build/ellm}
TEXT=tests/data/heldout-sample.txt
mkdir -p "$OUT"
i=0
while IFS='	' read -r label flags; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    "$ELLM" eval -f "$TEXT" --ctx "$CTX" --compare dense --score-from 2048 --windows "$WINDOWS" --json $flags \
        > "$OUT/long-$i.json" 2>/dev/null
    # shellcheck disable=SC2086
    "$ELLM" eval -f "$TEXT" --ctx 2048 --compare dense --score-from 256 --windows 8 --json $flags \
        > "$OUT/short-$i.json" 2>/dev/null
    printf '%s\t%s\n' "$label" "$flags" > "$OUT/config-$i.txt"
done <<'EOF'
file's RoPE (none)
linear x2	--rope-scaling linear --rope-scale 2
linear x4	--rope-scaling linear --rope-scale 4
YaRN x2 from 2048	--rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 2048
YaRN x4 from 2048	--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 2048
YaRN x8 from 2048	--rope-scaling yarn --rope-scale 8 --yarn-orig-ctx 2048
EOF
python3 - "$OUT" "$i" "$CTX" "$WINDOWS" <<'PY'
import json, sys
out, n, ctx, windows = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = []
for k in range(1, n + 1):
    label, flags = open(f"{out}/config-{k}.txt").read().rstrip("\n").split("\t")
    lo, sh = json.load(open(f"{out}/long-{k}.json")), json.load(open(f"{out}/short-{k}.json"))
    rows.append((label, flags, lo["modes"][0]["ppl"], lo["modes"][0]["positions"], sh["modes"][0]["ppl"],
                 sh["modes"][0]["positions"]))
base_long, base_short = rows[0][2], rows[0][4]
with open(f"{out}/table.md", "w") as f:
    f.write(f"Evaluation model (trained on 2048 tokens), `{'tests/data/heldout-sample.txt'}`: perplexity at positions "
            f"2048-{int(ctx) - 1} of {windows} windows of {ctx} tokens (beyond the training context), and at "
            f"positions 256-2047 of 8 windows of 2048 (within it).\n\n")
    f.write("| RoPE | flags | ppl beyond (positions) | vs file's | ppl within (positions) | vs file's |\n")
    f.write("|---|---|---:|---:|---:|---:|\n")
    for label, flags, pl, npl, ps, nps in rows:
        f.write(f"| {label} | `{flags or '-'}` | {pl:.2f} ({npl}) | {pl / base_long:.3f} | {ps:.2f} ({nps}) | "
                f"{ps / base_short:.3f} |\n")
print(open(f"{out}/table.md").read())
PY
