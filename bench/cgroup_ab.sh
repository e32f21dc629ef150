#!/bin/sh
# Two builds of ellm inside cgroups made here (not a test; needs root and a
# cgroup v1 hierarchy with the cpu and memory controllers, as on the machines
# of bench/AVX2.md), alternated round by round:
#   quota: `ellm run -n 64 --temp 0 --stats` on MODEL under a one-CPU quota
#          (cpu.cfs_quota_us = cfs_period_us): the threads it chose and decode tok/s;
#   memory: `ellm run -n 2 --stats` on MODEL in a memory cgroup of LIMIT_MB: the
#          exit status (137: killed by the cgroup's OOM killer) and the placement line.
# Writes every run's output to OUT and a table to OUT/table.md.
#
#   sh bench/cgroup_ab.sh OLD_ELLM NEW_ELLM OUT ROUNDS MODEL LIMIT_MB
# e.g. (bench/CGROUPS.md):
#   sh bench/cgroup_ab.sh /tmp/ellm-old build/ellm bench/results/cgroup-20261207 3 \
#      /tmp/smollm2-135m-q8_0.gguf 64
set -eu
[ $# -eq 6 ] || { sed -n '2,14p' "$0"; exit 2; }
OLD=$1 NEW=$2 OUT=$3 ROUNDS=$4 MODEL=$5 LIMIT=$6
CPU=/sys/fs/cgroup/cpu/ellm_bench_$$ MEM=/sys/fs/cgroup/memory/ellm_bench_$$
mkdir -p "$OUT" "$CPU" "$MEM"
trap 'rmdir "$CPU" "$MEM" 2>/dev/null || true' EXIT
cat "$CPU/cpu.cfs_period_us" > "$CPU/cpu.cfs_quota_us"
echo $((LIMIT * 1024 * 1024)) > "$MEM/memory.limit_in_bytes"
in_cg() { # cgroup folder, output file, command...
    cg=$1 out=$2
    shift 2
    rc=0
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" > "$out" 2>&1 || rc=$?
    echo "exit $rc" >> "$out"
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for which in old new; do
        if [ "$which" = old ]; then bin=$OLD; else bin=$NEW; fi
        in_cg "$CPU" "$OUT/quota-$r-$which.txt" "$bin" run -m "$MODEL" -n 64 --temp 0 -p 'def f(x):' --stats
        in_cg "$MEM" "$OUT/memory-$r-$which.txt" "$bin" run -m "$MODEL" -n 2 -p hi --stats
    done
    r=$((r + 1))
done
python3 - "$OUT" "$ROUNDS" "$MODEL" "$LIMIT" <<'EOF'
import re, statistics, sys
out, rounds, model, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def read(name):
    return open(f"{out}/{name}").read()
rows, tps = [], {"old": [], "new": []}
for r in range(1, rounds + 1):
    for w in ("old", "new"):
        q, m = read(f"quota-{r}-{w}.txt"), read(f"memory-{r}-{w}.txt")
        th = re.search(r"threads: (\d+)", q)
        dec = re.search(r"decode: \d+ tokens in [\d.]+ ms \(([\d.]+) tokens/s\)", q)
        ex = re.search(r"exit (\d+)", m).group(1)
        pl = re.search(r"placement: (.*)", m)
        note = pl.group(1).split("; ", 1)[1] if pl and "; " in pl.group(1) else (pl.group(1) if pl else "(no placement line)")
        t = float(dec.group(1)) if dec else float("nan")
        tps[w].append(t)
        rows.append(f"| {r} | {w} | {th.group(1) if th else '?'} | {t:.1f} | {ex} | {note} |")
with open(f"{out}/table.md", "w") as f:
    f.write(f"Model `{model}`; one-CPU quota; memory cgroup of {limit} MB.\n\n")
    f.write("| round | build | threads (quota) | decode tok/s (quota) | exit (memory) | placement note (memory) |\n")
    f.write("|---:|---|---:|---:|---:|---|\n" + "\n".join(rows) + "\n\n")
    f.write("Median decode tok/s under the quota: " + ", ".join(
        f"{w} {statistics.median(v):.1f}" for w, v in tps.items()) + "\n")
print(open(f"{out}/table.md").read())
EOF
