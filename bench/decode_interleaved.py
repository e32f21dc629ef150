#!/usr/bin/env python3
"""Decode speed of several (binary, model) pairs measured side by side:
rounds of `ellm bench` over every pair in turn (depth 0, no prefill, 32
tokens), then the median tokens/s of each and its ratio to the first pair's.

usage: python3 bench/decode_interleaved.py [--rounds 5] [--threads 2]
           LABEL=[BINARY:]MODEL ...
BINARY defaults to build/ellm. Run it on a quiet machine, e.g. under
bench/quietly.py."""
import argparse, json, statistics, subprocess, sys


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("pairs", nargs="+")
    a = ap.parse_args()
    cfgs = []
    for p in a.pairs:
        label, _, spec = p.partition("=")
        binary, _, model = spec.rpartition(":")
        cfgs.append((label, binary or "build/ellm", model))
    res = {c[0]: [] for c in cfgs}
    for r in range(a.rounds):
        for label, b, m in cfgs:
            p = subprocess.run([b, "bench", "-m", m, "-t", str(a.threads), "--depths", "0", "--prefill", "0", "-n",
                                "32", "--bw-mb", "256", "--json"], capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"ellm bench failed on {m}:\n{p.stderr}")
            j = json.loads(p.stdout)
            pt = next(x for x in j["points"] if x["mode"] == "dense")
            res[label].append(pt["tokens_per_s"])
            print(f"round {r} {label}: {pt['tokens_per_s']:.2f} tok/s "
                  f"({j['weight_bytes_per_token'] / 1e6:.0f} MB/token)", flush=True)
    base = statistics.median(res[cfgs[0][0]])
    print("| file | tokens/s (median) | vs first | every round |\n|---|---:|---:|---|")
    for label, v in res.items():
        med = statistics.median(v)
        print(f"| {label} | {med:.2f} | {med / base:.2f} | {' '.join(f'{x:.2f}' for x in v)} |")
    print("load average at the end:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
