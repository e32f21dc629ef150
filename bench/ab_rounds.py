#!/usr/bin/env python3
"""Alternates builds of bench_gemm, bench_batch or bench_attention_rows round by
round and prints each point's median over the rounds (and, for bench_batch,
every round).

  python3 bench/ab_rounds.py gemm  ROUNDS "ARGS" NAME=BINARY ... [--raw FILE]
  python3 bench/ab_rounds.py gops  ROUNDS "ARGS" NAME=BINARY ... [--raw FILE]
  python3 bench/ab_rounds.py batch ROUNDS "ARGS" NAME=BINARY ... [--raw FILE]
  python3 bench/ab_rounds.py attn  ROUNDS "ARGS" NAME=BINARY ... [--raw FILE]
  python3 bench/ab_rounds.py gemm|gops|batch|attn --from FILE   (re-renders a saved run)

Round r runs the binaries in the given order when r is even and in reverse
when it is odd (ABBA), so a machine that speeds up or slows down during the run
favours neither. ARGS are the benchmark's own arguments, e.g. for gemm
"-m 135m -n 4,16 -t 1 -r 9 -H q8_0" and for batch
"-m MODEL.gguf -n 1,16 -t 2 -f 0 -s 48", for attn "-t 2 --kv f16 --nq 1,4
--small 64 --depths 16384 --kernel rows". --raw appends every run's output to
FILE under a '### round R NAME BINARY ARGS' line; --from reads such a file.

Columns: gemm prints ms per layer (bench_gemm's median pass) per type, shape
(with -s, the model shape and the matrix shape), rows and threads; gops the
same points' GOP/s (bench_gemm's, from its median pass: finer than the ms of
a small matrix); batch prints the median step ms per number of sequences;
attn prints, per regime (cache-resident: ns per row-block per thread; DRAM at
each depth: ms a step), kernel and query tokens, bench_attention_rows' figure.
The last column is the first build's median divided by each other's (gops:
each other's divided by the first's; > 1: the other build is faster)."""
import collections
import re
import statistics
import subprocess
import sys

# bench_gemm lines: type, model shape, ISA, then (with -s) the matrix shape, rows, threads, ms
GEMM = re.compile(r'(\S+)\s+(\S+)\s+(\S+)(?:\s+(\d+x\d+))?\s+nb=(\d+)\s+t=(\d+)\s+([0-9.]+) ms')
GOPS = re.compile(r'.*?\s([0-9.]+) GOP/s \(best')
# bench_attention_rows: a regime's heading, then its lines per kernel and n_q
ATTN_CACHE = re.compile(r'cache-resident')
ATTN_DRAM = re.compile(r'DRAM, \d+ layers, depth (\d+)')
ATTN = re.compile(r'\s+(\w+)\s+n_q\s+(\d+):\s+([0-9.]+) ms a step(?:,\s+([0-9.]+) ns per row-block)?')
BATCH = re.compile(r'\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)')


def parse(kind, out, name, res):
    regime = None
    for line in out.splitlines():
        if kind in ('gemm', 'gops'):
            m = GEMM.match(line)
            g = GOPS.match(line)
            if m and (kind == 'gemm' or g):
                shape = m.group(2) + (' ' + m.group(4) if m.group(4) else '')
                v = float(m.group(7)) if kind == 'gemm' else float(g.group(1))
                res[(m.group(1), shape, int(m.group(5)), int(m.group(6)), name)].append(v)
        elif kind == 'attn':
            if ATTN_CACHE.match(line):
                regime = 'cache ns'
            elif ATTN_DRAM.match(line):
                regime = 'DRAM ' + ATTN_DRAM.match(line).group(1) + ' ms'
            else:
                m = ATTN.match(line)
                if m:
                    v = m.group(4) if regime == 'cache ns' else m.group(3)
                    res[(regime, m.group(1), int(m.group(2)), name)].append(float(v))
        else:
            m = BATCH.match(line)
            if m:
                res[(int(m.group(1)), name)].append(float(m.group(3)))


def render(kind, names, res):
    keys = sorted({k[:-1] for k in res})
    if not keys:
        sys.exit('no benchmark lines found in the output')
    if kind in ('gemm', 'gops'):
        unit = 'ms' if kind == 'gemm' else 'GOP/s'
        print('| type | shape | rows | threads | ' + ' | '.join(f'{n} {unit}' for n in names) + ' | ' +
              ' | '.join(f'{names[0]} ÷ {n}' if kind == 'gemm' else f'{n} ÷ {names[0]}' for n in names[1:]) + ' |')
    elif kind == 'attn':
        print('| regime | kernel | query tokens | ' + ' | '.join(names) + ' | ' +
              ' | '.join(f'{names[0]} ÷ {n}' for n in names[1:]) + ' |')
    else:
        print('| sequences | ' + ' | '.join(f'{n} ms (rounds)' for n in names) + ' | ' +
              ' | '.join(f'{names[0]} ÷ {n}' for n in names[1:]) + ' |')
    print('|' + '---|' * (len(keys[0]) + 2 * len(names) - 1))
    for k in keys:
        med = [statistics.median(res[k + (n,)]) for n in names]
        if kind in ('gemm', 'attn'):
            cells = [f'{m:.4f}' for m in med]
        elif kind == 'gops':
            cells = [f'{m:.1f}' for m in med]
        else:
            cells = [f'{m:.2f} ({" ".join(f"{x:.2f}" for x in res[k + (n,)])})' for n, m in zip(names, med)]
        ratios = [m / med[0] if kind == 'gops' else med[0] / m for m in med[1:]]
        print('| ' + ' | '.join(str(x) for x in k) + ' | ' + ' | '.join(cells) + ' | ' +
              ' | '.join(f'{r:.3f}' for r in ratios) + ' |')


def main(argv):
    if len(argv) < 3 or argv[0] not in ('gemm', 'gops', 'batch', 'attn'):
        sys.exit(__doc__)
    kind = argv[0]
    res = collections.defaultdict(list)
    names = []
    if argv[1] == '--from':
        name = None
        text = open(argv[2]).read()
        for part in re.split(r'^### ', text, flags=re.M)[1:]:
            head, _, body = part.partition('\n')
            name = head.split()[2]
            if name not in names:
                names.append(name)
            parse(kind, body, name, res)
        render(kind, names, res)
        return
    raw = None
    if '--raw' in argv:
        i = argv.index('--raw')
        raw = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    rounds, args = int(argv[1]), argv[2].split()
    builds = [a.split('=', 1) for a in argv[3:]]
    names = [n for n, _ in builds]
    for r in range(rounds):
        for name, binary in (builds if r % 2 == 0 else builds[::-1]):
            out = subprocess.run([binary] + args, capture_output=True, text=True).stdout
            if raw:
                with open(raw, 'a') as f:
                    f.write(f"### round {r} {name} {binary} {' '.join(args)}\n{out}")
            parse(kind, out, name, res)
    render(kind, names, res)


if __name__ == '__main__':
    main(sys.argv[1:])
