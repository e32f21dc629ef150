#!/usr/bin/env python3
"""Side-by-side decode/prefill speed of eLLM and llama.cpp on the same GGUF file.

usage: python3 bench/compare.py MODEL.gguf [--threads 1,2] [--depths 0,4096,16384]
                                [--n 32] [--prefill 512] [--synthetic-from N] [--reps 3]

For every thread count it runs, interleaved so both engines see the same machine
state: `ellm bench --json` (decode at each depth, prefill, bandwidth self-test)
and bench/llamacpp_decode.mjs with flash attention off and on. Each measurement
is repeated --reps times and the median is reported, with eLLM/llama.cpp ratios
against llama.cpp's better setting. Prints a Markdown table (for RESULTS.md) and
writes the raw runs to bench/out/compare-*.json.
"""
import argparse, json, os, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def ellm(model, threads, depths, n, prefill, synth_from):
    cmd = [os.path.join(ROOT, "build", "ellm"), "bench", "-m", model, "-t", str(threads),
           "--depths", ",".join(map(str, depths)), "-n", str(n), "--prefill", str(prefill),
           "--gen", "1000", "--bw-mb", "512", "--json"]
    if synth_from is not None:
        cmd += ["--synthetic-from", str(synth_from)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def llamacpp(model, depth, n, threads, flash, prefill=0):
    cmd = ["node", os.path.join(HERE, "llamacpp_decode.mjs"), model, str(depth), str(n), str(threads),
           "1" if flash else "0", str(prefill)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--depths", default="0,4096,16384")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--synthetic-from", type=int, default=None)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    threads = [int(x) for x in a.threads.split(",")]
    depths = [int(x) for x in a.depths.split(",")]
    raw = {"model": a.model, "when": time.strftime("%Y-%m-%d %H:%M"), "runs": []}
    rows = []
    for t in threads:
        res = {"ellm": {d: [] for d in depths}, "off": {d: [] for d in depths}, "on": {d: [] for d in depths},
               "ellm_pre": [], "llama_pre": [], "bw": []}
        for rep in range(a.reps):
            e = ellm(a.model, t, depths, a.n, a.prefill, a.synthetic_from)
            raw["runs"].append({"engine": "ellm", "threads": t, "rep": rep, "result": e})
            res["bw"].append(e["bandwidth_gbps"])
            for p in e["points"]:
                res["ellm"][p["depth"]].append(p)
            if e["prefill"]:
                res["ellm_pre"].append(e["prefill"][0]["tokens_per_s"])
            for flash in (False, True):
                for d in depths:
                    print(f"llama.cpp threads={t} depth={d} flash={flash} rep={rep}", file=sys.stderr)
                    pre = a.prefill if (d == depths[0] and not flash) else 0
                    r = llamacpp(a.model, d, a.n, t, flash, pre)
                    raw["runs"].append({"engine": "llama.cpp", "threads": t, "rep": rep, "flash": flash,
                                        "depth": d, "result": r})
                    res["on" if flash else "off"][d].append(r["decode_tokens_per_s"])
                    if pre:
                        res["llama_pre"].append(r["prefill_tokens_per_s"])
        bw = statistics.median(res["bw"])
        for d in depths:
            et = statistics.median(p["tokens_per_s"] for p in res["ellm"][d])
            frac = statistics.median(p["bw_fraction"] for p in res["ellm"][d])
            synth = any(p.get("synthetic_kv") for p in res["ellm"][d])
            off = statistics.median(res["off"][d])
            on = statistics.median(res["on"][d])
            best = max(off, on)
            rows.append((t, f"decode @ {d}" + (" (synthetic KV)" if synth else ""), et, off, on, et / best,
                         f"{100 * frac:.0f}% of {bw:.1f} GB/s"))
        if res["ellm_pre"] and res["llama_pre"]:
            ep, lp = statistics.median(res["ellm_pre"]), statistics.median(res["llama_pre"])
            rows.append((t, f"prefill {a.prefill}", ep, lp, None, ep / lp, ""))
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    path = os.path.join(HERE, "out", f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(raw, f, indent=1)
    print(f"\nmodel: {a.model}; medians of {a.reps} interleaved runs; raw: {path}\n")
    print("| threads | measurement | eLLM tok/s | llama.cpp FA off | llama.cpp FA on | eLLM / best llama.cpp | eLLM bandwidth use |")
    print("|---|---|---|---|---|---|---|")
    for t, what, e, off, on, ratio, bwtxt in rows:
        on_s = f"{on:.1f}" if on is not None else "—"
        print(f"| {t} | {what} | {e:.1f} | {off:.1f} | {on_s} | {ratio:.2f}× | {bwtxt} |")


if __name__ == "__main__":
    main()
