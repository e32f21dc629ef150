#!/usr/bin/env python3
"""Decode speed with and without NUMA placement, timed in one run.

Alternates `ellm bench` runs without and with the placement flags (default
--numa-aware), so both see the same machine load, and prints the median
tokens/s of each at every depth and their ratio. On a one-node machine the
flags place nothing, so the ratio should be 1 within noise.

    python3 bench/numa_ab.py /tmp/smol.gguf --rounds 6 --depths 0,4096
"""
import argparse
import json
import statistics
import subprocess
import sys


def bench(ellm, model, depths, steps, flags):
    cmd = [ellm, "bench", "-m", model, "--depths", depths, "-n", str(steps), "--prefill", "0",
           "--bw-mb", "64", "--synthetic-kv", "--json"] + flags
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {p["depth"]: p["tokens_per_s"] for p in json.loads(out)["points"] if p["mode"] == "dense"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--ellm", default="build/ellm")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--depths", default="0,4096")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per depth and run")
    ap.add_argument("--flags", default="--numa-aware", help="placement flags of the second arm")
    a = ap.parse_args()
    arms = {"default": [], a.flags: a.flags.split()}
    runs = {name: [] for name in arms}
    for r in range(a.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(list(arms)))  # ABBA: no arm always first
        for name in order:
            runs[name].append(bench(a.ellm, a.model, a.depths, a.steps, arms[name]))
            print(f"round {r + 1}/{a.rounds} {name}: " +
                  ", ".join(f"{d}: {t:.2f}" for d, t in runs[name][-1].items()), file=sys.stderr)
    depths = sorted(runs["default"][0])
    # Each round runs both arms back to back: the per-round ratio cancels the
    # machine's drift, so its median is the figure to read.
    print(f"| depth | default tok/s (median of {a.rounds}) | {a.flags} tok/s | per-round ratio, median (min-max) |")
    print("|---:|---:|---:|---:|")
    for d in depths:
        x = [run[d] for run in runs["default"]]
        y = [run[d] for run in runs[a.flags]]
        ratios = [yy / xx for xx, yy in zip(x, y)]
        print(f"| {d} | {statistics.median(x):.2f} | {statistics.median(y):.2f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")


if __name__ == "__main__":
    main()
