#!/usr/bin/env python3
"""Table of bench/decode_split_ab.sh's output: per case and depth, the medians
over the rounds of each build's decode tok/s, their ratio, the paired
bandwidth share, and the GB/s the layers' matmuls, attention and the output
matrix read (the `split` of ellm bench's dense points).

    python3 bench/decode_split_table.py OUT_DIR NAME_A NAME_B
"""
import glob
import json
import os
import re
import statistics
import sys


def load(out, name):
    """{(case, depth): [point, ...]} over the rounds, and each case's model and threads."""
    points, cases = {}, {}
    for path in sorted(glob.glob(os.path.join(out, f"{name}-*-*.json"))):
        m = re.fullmatch(re.escape(name) + r"-(\d+)-(\d+)\.json", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            j = json.load(f)
        case = int(m.group(1))
        cases[case] = (os.path.basename(j["model"]), j["threads"])
        for p in j["points"]:
            if p["mode"] == "dense":
                points.setdefault((case, p["depth"]), []).append(p)
    return points, cases


def med(points, f):
    return statistics.median(f(p) for p in points)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    out, a, b = sys.argv[1:]
    pa, cases = load(out, a)
    pb, _ = load(out, b)
    print(f"| model | threads | depth | rounds | {a} tok/s | {b} tok/s | {a} ÷ {b} | paired share {a} / {b} "
          f"| matmuls GB/s {a} / {b} | attention GB/s {a} / {b} | output GB/s {a} / {b} |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    for key in sorted(pa):
        if key not in pb:
            continue
        case, depth = key
        model, threads = cases[case]
        xa, xb = pa[key], pb[key]
        ta, tb = med(xa, lambda p: p["tokens_per_s"]), med(xb, lambda p: p["tokens_per_s"])

        def pair(f, fmt="%.1f"):
            return f"{fmt % med(xa, f)} / {fmt % med(xb, f)}"

        att = pair(lambda p: p["split"]["attention_gbps"]) if depth > 0 else "—"
        print(f"| {model} | {threads} | {depth} | {min(len(xa), len(xb))} | {ta:.2f} | {tb:.2f} | {ta / tb:.2f} "
              f"| {pair(lambda p: p['bw_paired_fraction'], '%.2f')} | {pair(lambda p: p['split']['matmul_gbps'])} "
              f"| {att} | {pair(lambda p: p['split']['output_gbps'])} |")


if __name__ == "__main__":
    main()
