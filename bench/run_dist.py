#!/usr/bin/env python3
"""Decode with the KV cache sharded over MPI ranks on this machine: runs
`mpirun -np R ellm bench --mpi --json` for each build, rank count and round
(builds alternated within a round, so they see the same machine) and prints a
markdown table for bench/DIST.md.

Columns: ms/step; "in exchange", the wall time inside the per-layer
collective(s), waiting for the slowest rank included; "merge", adding up the
rank's own parts' partials and dividing; bytes per step sent + received; the
bare collectives of one layer (same sizes, no attention around them, median
of 64); and two shares of the step: end to end, layers x (in exchange +
merge) / step, and the merge's own cost, layers x (bare + merge) / step,
which leaves out the time one rank waits for the other's attention.

Take the exclusive CPU lock around it:
  flock -x /work/notes/cpu.lock python3 bench/run_dist.py --model M.gguf
"""
import argparse
import json
import os
import subprocess
import time


def run(binary, ranks, a):
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--bind-to", a.bind, "-np", str(ranks), binary,
           "bench", "--mpi", "-m", a.model, "--depths", a.depths, "-n", str(a.n), "-t", str(a.threads), "--json"]
    if a.synthetic:
        cmd.append("--synthetic-kv")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr}")
    line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--builds", default="build/ellm", help="label=path,... or path,... (alternated per round)")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--depths", default="0,32768")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=12, help="decode steps per point")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--bind", default="none", help="mpirun --bind-to")
    ap.add_argument("--no-synthetic", dest="synthetic", action="store_false", help="prefill instead of synthetic KV")
    a = ap.parse_args()
    builds = []
    for b in a.builds.split(","):
        label, _, path = b.rpartition("=")
        builds.append((label or path, path))
    ranks = [int(r) for r in a.ranks.split(",")]
    res = {}  # (label, ranks, depth) -> list of points
    load0 = os.getloadavg()[0]
    t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for _ in range(a.rounds):
        for label, path in builds:
            for r in ranks:
                j = run(path, r, a)
                for p in j["points"]:
                    p["n_layer"] = j["n_layer"]
                    res.setdefault((label, r, p["depth"]), []).append(p)
    load1 = os.getloadavg()[0]
    print(f"{t0}, model {a.model}, {a.threads} thread(s) per rank, {a.n} steps per point, "
          f"{'synthetic' if a.synthetic else 'prefilled'} KV, mpirun --bind-to {a.bind}, {a.rounds} rounds "
          f"(builds alternated), load average {load0:.2f} before, {load1:.2f} after")
    print()
    print("| build | ranks | depth | ms/step | in exchange ms/layer | merge ms/layer | KB/step | bare collectives us "
          "| share end to end | share, merge's own cost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def col(ps, key, fmt):
        return " / ".join(fmt.format(p[key]) for p in ps)

    for label, _ in builds:
        for r in ranks:
            for d in [int(x) for x in a.depths.split(",")]:
                ps = res.get((label, r, d), [])
                if not ps:
                    continue
                L = ps[0]["n_layer"]
                e2e = " / ".join(f"{100 * L * (p['exchange_ms_per_layer'] + p['merge_ms_per_layer']) / p['step_ms']:.1f}%"
                                 for p in ps)
                own = " / ".join(
                    f"{100 * L * ((p['bare_exchange_us'] / 1e3 if r > 1 else 0) + p['merge_ms_per_layer']) / p['step_ms']:.1f}%"
                    for p in ps)
                print(f"| {label} | {r} | {d} | {col(ps, 'step_ms', '{:.1f}')} | "
                      f"{col(ps, 'exchange_ms_per_layer', '{:.3f}')} | {col(ps, 'merge_ms_per_layer', '{:.3f}')} | "
                      f"{ps[0]['bytes_per_step'] / 1e3:.0f} | "
                      f"{col(ps, 'bare_exchange_us', '{:.1f}') if r > 1 else '-'} | {e2e} | {own} |")


if __name__ == "__main__":
    main()
