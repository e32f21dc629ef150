# Medians over the rounds of bench/results/q8-list-parts-20261205/*.json
# (ellm bench, sparse points): step ms and vs_empty_context per build and depth.
import glob, json, os, statistics
here = os.path.dirname(os.path.abspath(__file__))
rows = {}
for f in sorted(glob.glob(os.path.join(here, "*-r*.json"))):
    name = os.path.basename(f)[:-5]
    shape, build, rnd = name.split("-")
    d = json.load(open(f))
    for p in d["points"]:
        if p["mode"] != "sparse":
            continue
        rows.setdefault((shape, p["depth"], build), []).append((1000.0 / p["tokens_per_s"], p["vs_empty_context"]))
print("| shape | depth | build | ms per step (rounds) | vs empty context (rounds) | median vs empty |")
print("|---|---:|---|---|---|---:|")
for (shape, depth, build), v in sorted(rows.items()):
    print("| %s | %d | %s | %s | %s | %.3f |" % (shape, depth, build, ", ".join("%.2f" % x for x, _ in v),
          ", ".join("%.3f" % y for _, y in v), statistics.median(y for _, y in v)))
