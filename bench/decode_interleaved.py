#!/usr/bin/env python3
"""Decode speed of several (binary, model) pairs measured side by side:
rounds of `ellm bench` over every pair in turn (no prefill, -n tokens per
depth), then per depth the median tokens/s of each pair, its ratio to the
first pair's, and the share of the read bandwidth each `ellm bench` run
measured itself (its self-test, just before its steps), of the bandwidth read
between its rounds of steps (paired: the same machine state; builds that
report it) and of `ellm probe`'s.

usage: python3 bench/decode_interleaved.py [--rounds 5] [--threads 2]
           [--depths 0] [--synthetic-from N] [--kv-type TYPE] [-n 32]
           [--json-out FILE] LABEL=[BINARY:]MODEL ...
       python3 bench/decode_interleaved.py --from FILE   (re-render, no runs)
BINARY defaults to build/ellm. --json-out keeps every run's `ellm bench
--json` output (with the commands and load averages) to re-render from.
Run it on a quiet machine, e.g. under bench/quietly.py."""
import argparse, json, statistics, subprocess, sys, time


def render(doc):
    labels = doc["labels"]
    runs = doc["runs"]
    depths = sorted({p["depth"] for r in runs for p in r["bench"]["points"] if p["mode"] == "dense"})
    print("| depth | file | tokens/s (median) | vs first | of the run's own bandwidth (median) "
          "| of the reads between its rounds (paired, median) | of `ellm probe` (median) | every round |")
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    for d in depths:
        med = {}
        for label in labels:
            tps, own, paired, probe = [], [], [], []
            for r in runs:
                if r["label"] != label:
                    continue
                pt = next(p for p in r["bench"]["points"] if p["mode"] == "dense" and p["depth"] == d)
                tps.append(pt["tokens_per_s"])
                own.append(pt["bw_fraction"])
                if "bw_paired_fraction" in pt:
                    paired.append(pt["bw_paired_fraction"])
                if pt.get("probe_fraction"):
                    probe.append(pt["probe_fraction"])
            med[label] = statistics.median(tps)
            pr = f"{100 * statistics.median(probe):.0f}%" if probe else "-"
            pa = f"{100 * statistics.median(paired):.0f}%" if paired else "-"
            print(f"| {d} | {label} | {med[label]:.2f} | {med[label] / med[labels[0]]:.3f} | "
                  f"{100 * statistics.median(own):.0f}% | {pa} | {pr} | {' '.join(f'{x:.1f}' for x in tps)} |")
    print(f"\nload average at the start {doc['load_start']}, at the end {doc['load_end']}")


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depths", default="0")
    ap.add_argument("--synthetic-from", type=int, default=None)
    ap.add_argument("--kv-type", default=None)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--from", dest="from_file", default=None)
    ap.add_argument("pairs", nargs="*")
    a = ap.parse_args()
    if a.from_file:
        render(json.load(open(a.from_file)))
        return
    if not a.pairs:
        sys.exit(__doc__)
    cfgs = []
    for p in a.pairs:
        label, _, spec = p.partition("=")
        binary, _, model = spec.rpartition(":")
        cfgs.append((label, binary or "build/ellm", model))
    load = lambda: open("/proc/loadavg").read().split()[:3]
    doc = {"labels": [c[0] for c in cfgs], "pairs": {c[0]: {"binary": c[1], "model": c[2]} for c in cfgs},
           "load_start": load(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "runs": []}
    for r in range(a.rounds):
        for label, b, m in cfgs:
            cmd = [b, "bench", "-m", m, "-t", str(a.threads), "--depths", a.depths, "--prefill", "0", "-n", str(a.n),
                   "--bw-mb", "256", "--json"]
            if a.synthetic_from is not None:
                cmd += ["--synthetic-from", str(a.synthetic_from)]
            if a.kv_type:
                cmd += ["--kv-type", a.kv_type]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"ellm bench failed on {m}:\n{p.stderr}")
            j = json.loads(p.stdout)
            doc["runs"].append({"round": r, "label": label, "cmd": cmd, "bench": j})
            dense = [x for x in j["points"] if x["mode"] == "dense"]
            print(f"round {r} {label}: " + ", ".join(f"{x['depth']}: {x['tokens_per_s']:.2f} tok/s" for x in dense) +
                  f" (self-test {j['bandwidth_gbps']:.1f} GB/s)", file=sys.stderr, flush=True)
    doc["load_end"] = load()
    doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(doc, f, indent=1)
    render(doc)


if __name__ == "__main__":
    main()
