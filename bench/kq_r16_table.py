"""Table of bench/kq_r16_ab.sh's output directory: medians over the rounds.

    python3 bench/kq_r16_table.py OUT_DIR
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
    r16, file_ = ellm_rounds(out, "r16"), ellm_rounds(out, "file")
    lb = llama_rounds(out)
    isa = r16[0][3] if r16 else "?"
    model = os.path.basename(load(glob.glob(os.path.join(out, "r16-*.json"))[0])["model"]) if r16 else "?"
    print(f"`{model}`, {len(r16)} rounds, 2 threads, {isa} kernels; medians of the rounds (each round's figure is itself a")
    print("median of 3 prefill passes or of 32 decode steps). llama-bench: the better of flash attention off and on.\n")
    print("| what | R16 tok/s | file layout tok/s | R16 ÷ file | llama-bench tok/s | R16 ÷ llama-bench |")
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
    print("\nPer round, prefill 512 (R16 / file layout): " +
          ", ".join(f"{x[0].get(512, 0):.1f} / {y[0].get(512, 0):.1f}" for x, y in zip(r16, file_)))


main()
