#!/usr/bin/env python3
"""Summarizes run.sh's ab-ROUND-KV-VERSION.json: per KV type and depth, ms per
step (median), share of the same run's bandwidth, and new/old tok/s per round."""
import glob, json, os, re, sys
d = os.path.dirname(os.path.abspath(__file__))
runs = {}
for f in glob.glob(os.path.join(d, "ab-*.json")):
    r, kv, v = re.match(r"ab-(\d+)-(\w+?)-(old|new)\.json", os.path.basename(f)).groups()
    try:
        runs[(int(r), kv, v)] = json.load(open(f))
    except ValueError:
        pass
rounds = sorted({k[0] for k in runs})
for kv in ("f16", "q8_0"):
    for depth in (0, 16384, 32768):
        cells = {"old": [], "new": []}
        ratio = []
        for r in rounds:
            pt = {}
            for v in ("old", "new"):
                j = runs.get((r, kv, v))
                p = [p for p in (j or {}).get("points", []) if p["depth"] == depth and p["mode"] == "dense"]
                if p:
                    pt[v] = p[0]
                    cells[v].append("%.2f ms %.0f%% (%.1f GB/s)" % (p[0]["ms_per_token"], 100 * p[0]["bw_fraction"], j["bandwidth_gbps"]))
            if len(pt) == 2:
                ratio.append("%.3f" % (pt["new"]["tokens_per_s"] / pt["old"]["tokens_per_s"]))
        print("| %s | %d | %s | %s | %s |" % (kv, depth, " / ".join(cells["old"]), " / ".join(cells["new"]), " / ".join(ratio)))
# Q8_0 KV over F16 KV, same build and round
for v in ("old", "new"):
    for depth in (16384, 32768):
        rs = []
        for r in rounds:
            a, b = runs.get((r, "f16", v)), runs.get((r, "q8_0", v))
            if a and b:
                pa = [p for p in a["points"] if p["depth"] == depth][0]
                pb = [p for p in b["points"] if p["depth"] == depth][0]
                rs.append("%.2f" % (pb["tokens_per_s"] / pa["tokens_per_s"]))
        print("Q8_0/F16 %s %d: %s" % (v, depth, " / ".join(rs)))
