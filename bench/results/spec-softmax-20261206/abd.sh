#!/bin/bash
# DRAM ms a step: ab.sh-like for the 'DRAM' lines
R=$1; ARGS=$2; shift 2
out=/tmp/mb/abd.out; : > $out
for i in $(seq $R); do for b in "$@"; do $b $ARGS 2>&1 | sed -n '/^DRAM/,$p' | grep "n_q" | sed "s|^|$b |" >> $out; done; done
python3 - "$out" <<'PY'
import sys,re,statistics,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    m=re.match(r'(\S+)\s+(\w+) n_q\s+(\d+):\s+([\d.]+) ms a step',l)
    if m: d[(m.group(3),m.group(1))].append(float(m.group(4)))
for k in sorted(d, key=lambda k:(int(k[0]),k[1])): v=d[k]; print(f"nq {k[0]:>2} {k[1]:<30} median {statistics.median(v):7.2f} ms  min {min(v):7.2f} max {max(v):7.2f} n={len(v)}")
PY
