"""Renders bench/GGUF_TYPES.md from a bench/gguf_types.sh run folder (not a test).

usage: python3 bench/gguf_types.py bench/results/gguf-types-DATE > bench/GGUF_TYPES.md
"""
import glob
import json
import os
import re
import statistics
import sys

TYPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_S", "IQ4_XS", "Q5_0", "Q4_0", "Q3_K_M", "Q2_K"]
SHAPES = [("smollm2-135m", "SmolLM2-135M"), ("llama3.2-1b", "Llama-3.2-1B")]


def load(path):
    """The JSON of one run, or None (with a note) if it is empty or cut short."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print("skipping %s: %s" % (path, e), file=sys.stderr)
        return None


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(out):
    machine = json.load(open(os.path.join(out, "machine.json")))
    rows = []
    for shape, label in SHAPES:
        for t in TYPES:
            e_dec, e_pre, l_dec, l_pre = [], [], [], []
            for f in sorted(glob.glob(os.path.join(out, f"ellm-{shape}-{t}-r*.json"))):
                d = load(f)
                if not d:
                    continue
                p = d["points"][0]
                # llama-bench's statistic: tokens over the time of all of them
                e_dec.append(1000.0 * len(p["step_ms"]) / sum(p["step_ms"]))
                e_pre.append(statistics.mean(d["prefill"][0]["samples_tps"]))
            for f in sorted(glob.glob(os.path.join(out, f"llama-{shape}-{t}-r*.json"))):
                for test in load(f) or []:
                    (l_pre if test["n_prompt"] > 0 else l_dec).append(test["avg_ts"])
            if not e_dec:
                continue
            types = open(os.path.join(out, f"{shape}-{t}.types")).read().strip()
            rows.append((label, t, types, med(e_dec), med(l_dec), med(e_pre), med(l_pre), len(e_dec)))
    print("# eLLM on the GGUF files llama-quantize writes\n")
    print("`sh bench/gguf_types.sh` (one run; raw JSON in `%s/`): llama.cpp's own `llama-quantize`" % out)
    print("(native build, `bench/setup-llamacpp-native.sh`) makes each file from an F16 file of the shape (`ellm synth`,")
    print("random weights), then every round times each file with `ellm bench` and `llama-bench`, one after the other,")
    print("2 threads pinned on both sides. Both sides give the same statistic: decode tokens/s is the tokens timed over")
    print("the time of all of them (llama-bench's tg; for eLLM from every timed step in its JSON), prefill tokens/s the")
    print("mean over 2 passes; the table gives the median over the rounds.\n")
    gbps = sum(n.get("read_gbps", 0) for n in machine.get("numa_nodes", []))
    commit_file = os.path.join(out, "commit.txt")
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else "unknown"
    print("- eLLM at `%s`. Machine: %s cores, %s kernels, read bandwidth %.1f GB/s (`ellm probe` at the start of the run)."
          % (commit, machine.get("physical_cores", "?"), machine.get("isa", "?"), gbps))
    print("- Decode: single-token steps at an empty context (SmolLM2-135M: 64 steps, Llama-3.2-1B: 32); prefill: a")
    print("  512-token (SmolLM2-135M) or 256-token (Llama-3.2-1B) prompt.")
    print("- Tensor types: what llama-quantize wrote (matrices only); a K-quant or IQ4_XS type falls back to Q5_0, Q5_1,")
    print("  IQ4_NL or Q8_0 where a row is not a multiple of 256 (SmolLM2's 576 columns).\n")
    print("| shape | file | tensor types | eLLM decode tok/s | llama.cpp decode tok/s | × | eLLM prefill tok/s | llama.cpp prefill tok/s | × | rounds |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, t, types, ed, ld, ep, lp, n in rows:
        print("| %s | %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %d |"
              % (label, t, types, ed, ld, ed / ld, ep, lp, ep / lp, n))
    slower = ["%s %s %s (%.2f×)" % (label, t, what, r) for label, t, _, ed, ld, ep, lp, _ in rows
              for what, r in (("decode", ed / ld), ("prefill", ep / lp)) if r < 1]
    print("")
    print("Where llama.cpp is faster: %s." % ("; ".join(slower) if slower else "nowhere in this run"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1].rstrip("/"))
