"""Table of bench/builds_ab.sh's (or bench/kq_r16_ab.sh's) output directory:
medians over the rounds.

    python3 bench/kq_r16_table.py OUT_DIR [A B]

A and B are the two variants' names, the prefixes of their JSON files
(default r16 and file, labelled R16 and file layout; other names label
themselves).
"""
import glob
import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def ellm_rounds(out, variant):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, f"{variant}-*.json"))):
        j = load(path)
        pre = {p["tokens"]: p["tokens_per_s"] for p in j["prefill"]}
        dec = {p["depth"]: p["tokens_per_s"] for p in j["points"] if p["mode"] == "dense"}
        rows.append((pre, dec, j.get("probe_read_gbps"), j.get("isa")))
    return rows


def llama_rounds(out):
    """(n_prompt, n_gen, flash_attn) -> list of per-round median tok/s"""
    res = {}
    for path in sorted(glob.glob(os.path.join(out, "llama-*.json"))):
        for t in load(path):
            key = (t["n_prompt"], t["n_gen"], bool(t.get("flash_attn")))
            res.setdefault(key, []).append(statistics.median(t["samples_ts"]))
    return res


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    out = sys.argv[1]
    if len(sys.argv) >= 4 and sys.argv[2:4] != ["r16", "file"]:
        va, vb = la, lb_ = sys.argv[2:4]
    else:
        va, vb, la, lb_ = "r16", "file", "R16", "file layout"
    r16, file_ = ellm_rounds(out, va), ellm_rounds(out, vb)
    lb = llama_rounds(out)
    isa = r16[0][3] if r16 else "?"
    model = os.path.basename(load(glob.glob(os.path.join(out, f"{va}-*.json"))[0])["model"]) if r16 else "?"
    print(f"`{model}`, {len(r16)} rounds, 2 threads, {isa} kernels; medians of the rounds (each round's figure is itself a")
    print("median of 3 prefill passes or of 32 decode steps). llama-bench: the better of flash attention off and on.\n")
    short = la.split()[0]
    print(f"| what | {la} tok/s | {lb_} tok/s | {short} ÷ {lb_.split()[0]} | llama-bench tok/s | {short} ÷ llama-bench |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in (128, 512):
        a = med([r[0][n] for r in r16 if n in r[0]])
        b = med([r[0][n] for r in file_ if n in r[0]])
        ls = [med(lb.get((n, 0, fa), [])) for fa in (False, True)]
        ls = [x for x in ls if x == x]
        lbest = max(ls) if ls else float("nan")
        print(f"| prefill {n} | {a:.1f} | {b:.1f} | {a / b:.2f} | {lbest:.1f} | {a / lbest:.2f} |")
    a = med([r[1][512] for r in r16 if 512 in r[1]])
    b = med([r[1][512] for r in file_ if 512 in r[1]])
    ls = [med(lb.get((0, 32, fa), [])) for fa in (False, True)]
    ls = [x for x in ls if x == x]
    lbest = max(ls) if ls else float("nan")
    print(f"| decode at depth 512 | {a:.1f} | {b:.1f} | {a / b:.2f} | {lbest:.1f} | {a / lbest:.2f} |")
    print(f"\nPer round, prefill 512 ({la} / {lb_}): " +
          ", ".join(f"{x[0].get(512, 0):.1f} / {y[0].get(512, 0):.1f}" for x, y in zip(r16, file_)))


main()
