"""Table of bench/q8kv_ab.sh's output directory: medians over the rounds of
each build ("new", "base"), per measurement.

    python3 bench/q8kv_ab_table.py OUT_DIR
"""
import os
import re
import statistics
import sys


def rounds(path):
    """{build: [round text, ...]} of a file of '== BUILD round N' sections."""
    out = {}
    if not os.path.exists(path):
        return out
    for sec in open(path).read().split("== ")[1:]:
        out.setdefault(sec.split()[0], []).append(sec)
    return out


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def values(secs, pattern):
    return [float(m.group(1)) for s in secs for m in [re.search(pattern, s)] if m]


def fmt(xs, nd=1):
    return " / ".join(f"{x:.{nd}f}" for x in xs)


def main(out):
    rows = []
    cr = rounds(os.path.join(out, "cache-resident.txt"))
    if cr:
        get = lambda b, nq: med(values(cr.get(b, []), rf"n_q +{nq}:.*?([\d.]+) ns per row-block"))
        old, new = [get("base", q) for q in (1, 4)], [get("new", q) for q in (1, 4)]
        rows.append((f"`bench_attention_rows -t 1 --kv q8_0`, in cache, ns a row-block, 1 / 4 query tokens "
                     f"({len(cr.get('new', []))} rounds)", fmt(old), fmt(new), fmt([o / n for o, n in zip(old, new)], 2)))
    for threads, depths in (("2", (16384, 32768)), ("1", (16384,))):
        ba = rounds(os.path.join(out, f"bench_attention-t{threads}.txt"))
        if not ba:
            continue
        step = lambda b, d: med(values(ba.get(b, []), rf"Q8_0 depth +{d}: +([\d.]+) ms/step"))
        ratio = lambda b, d: med(values(ba.get(b, []), rf"Q8_0 depth +{d}:.*?([\d.]+)x F16"))
        old, new = [step("base", d) for d in depths], [step("new", d) for d in depths]
        label = " / ".join(f"{d // 1024}K" for d in depths)
        rows.append((f"`bench_attention -t {threads}`, Q8_0 attention step at {label}, ms ({len(ba.get('new', []))} rounds)",
                     fmt(old), fmt(new), fmt([o / n for o, n in zip(old, new)], 2)))
        rows.append(("same runs, Q8_0 step ÷ F16 step of the same binary",
                     fmt([ratio("base", d) for d in depths], 2), fmt([ratio("new", d) for d in depths], 2), ""))
    kc = rounds(os.path.join(out, "ellm-bench-kv-compare.txt"))
    if kc:
        depths = (4096, 16384, 32768)
        r = lambda b, d: med(values(kc.get(b, []), rf"\n +{d} +kv-ab .*?x([\d.]+)"))
        rows.append((f"`ellm bench --kv-type q8_0 --kv-compare f16`, 2 threads, Q8_0 ÷ F16 decode at 4K / 16K / 32K "
                     f"({len(kc.get('new', []))} rounds)", fmt([r("base", d) for d in depths], 2),
                     fmt([r("new", d) for d in depths], 2), ""))
    print("| measurement | before | after | ratio |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
