#!/bin/bash
# usage: ab.sh ROUNDS "ARGS" binA binB ...   -> median ns per row-block per nq for each bin
R=$1; ARGS=$2; shift 2
out=/tmp/mb/ab.out; : > $out
for i in $(seq $R); do for b in "$@"; do $b $ARGS 2>&1 | grep -E "rows n_q|old n_q" | grep "ns per" | sed "s|^|$b |" >> $out; done; done
python3 - "$out" <<'PY'
import sys,re,statistics,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    m=re.match(r'(\S+)\s+(\w+) n_q\s+(\d+):.*?([\d.]+) ns per row-block',l)
    if m: d[(m.group(3),m.group(1))].append(float(m.group(4)))
for k in sorted(d, key=lambda k:(int(k[0]),k[1])): v=d[k]; print(f"nq {k[0]:>2} {k[1]:<50} median {statistics.median(v):6.2f} ns  min {min(v):6.2f} max {max(v):6.2f} n={len(v)}")
PY
