#!/bin/sh
# Dense decode at depth against the probed bandwidth, two builds alternated
# round by round in one run (not a test): `ellm probe` before and after, then
# ROUNDS rounds of `ellm bench --depths DEPTHS --synthetic-kv --json` with OLD
# and with NEW. Writes the probes and every bench's JSON to OUT, and a table of
# tok/s and GB/s read per round, each as a share of the probe taken before the
# run, to OUT/table.md.
#
#   sh bench/dense_depth_ab.sh OLD_ELLM NEW_ELLM OUT ROUNDS MODEL DEPTHS "BENCH FLAGS"
#
# e.g. (bench/KV.md, 2026-12-05):
#   sh bench/dense_depth_ab.sh /tmp/ellm-old build/ellm bench/results/dense-depth-20261205 4 \
#      /tmp/smollm2-135m-q8_0.gguf 16384,32768 "-t 2 -n 32"
set -eu
[ $# -eq 7 ] || { sed -n '2,13p' "$0"; exit 2; }
OLD=$1 NEW=$2 OUT=$3 ROUNDS=$4 MODEL=$5 DEPTHS=$6 FLAGS=$7
mkdir -p "$OUT"
"$NEW" probe --json > "$OUT/probe-before.json"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for which in old new; do
        if [ "$which" = old ]; then bin=$OLD; else bin=$NEW; fi
        # shellcheck disable=SC2086
        "$bin" bench -m "$MODEL" --depths "$DEPTHS" --synthetic-kv --prefill 0 $FLAGS --json > "$OUT/bench-$r-$which.json"
    done
    r=$((r + 1))
done
"$NEW" probe --json > "$OUT/probe-after.json"
python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def probe(name):
    return sum(n["read_gbps"] for n in json.load(open(f"{out}/{name}"))["numa_nodes"])
before, after = probe("probe-before.json"), probe("probe-after.json")
rows, by = [], {}
for r in range(1, rounds + 1):
    for which in ("old", "new"):
        b = json.load(open(f"{out}/bench-{r}-{which}.json"))
        for pt in b["points"]:
            if pt.get("mode", "dense") != "dense":
                continue
            gbps = pt["gbps"]
            rows.append((r, which, pt["depth"], pt["tokens_per_s"], gbps, gbps / before, b.get("bandwidth_gbps")))
            by.setdefault((which, pt["depth"]), []).append(gbps / before)
with open(f"{out}/table.md", "w") as f:
    f.write(f"`ellm probe` {before:.1f} GB/s before the run, {after:.1f} after.\n\n")
    f.write("| round | build | depth | tok/s | GB/s read | share of the probe before | bench self-test GB/s |\n|---|---|---:|---:|---:|---:|---:|\n")
    for r, w, d, t, g, s, bw in rows:
        f.write(f"| {r} | {w} | {d} | {t:.1f} | {g:.1f} | {100 * s:.0f}% | {bw:.1f} |\n")
    f.write("\nMedian share of the probe before: " + "; ".join(
        f"{w} {d}: {100 * statistics.median(v):.0f}%" for (w, d), v in sorted(by.items())) + "\n")
print(open(f"{out}/table.md").read())
EOF
