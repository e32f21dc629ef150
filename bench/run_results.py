#!/usr/bin/env python3
"""Every figure of bench/RESULTS.md from one run: eLLM next to llama.cpp's native
llama-bench, dense decode at depth against the measured bandwidth, sparse
attention fidelity and speed, and logits against llama.cpp's.

usage: python3 bench/run_results.py [--llama-bench PATH] [--depths 0,4096,16384]
           [--deep 32768] [--threads 1,2] [--steps 32] [--prefill-reps 5]
           [--windows 8] [--quick] [--no-write]

Both engines, same GGUF files (SmolLM2-135M shape, Q8_0 and Q4_0, random
weights written by `ellm synth`), threads pinned on both sides (eLLM pins by
default; llama-bench gets --cpu-mask/--cpu-strict), interleaved per thread
count so both see the same machine:
  decode   every timed step is one sample on both sides: `ellm bench` times -n
           single-token steps from each depth, llama-bench runs -n 1 -r STEPS
           (each repetition one token at that depth, the depth's KV restored
           from its cache); the first step is excluded on both sides (an
           untimed warm-up step on each);
  prefill  a 512-token prompt, PREFILL_REPS timed passes after one untimed
           warm-up on both sides;
  median and the 10th-90th percentile range of the samples on both sides.
llama.cpp runs with flash attention off and on for decode and prefill.
eLLM fills depths >= --synthetic-from with synthetic KV (labelled); llama-bench
always prefills the depth for real (untimed).

Writes the raw results (machine description from `ellm probe --json`, every
sample, the commands) to bench/results/results-<UTC time>.json and regenerates
bench/RESULTS.md from it (python3 bench/run_results.py --from FILE.json
re-renders a committed run without measuring).
"""
import argparse, json, os, platform, statistics, subprocess, sys, time

from quietly import quiet_lock  # bench/quietly.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ELLM = os.path.join(ROOT, "build", "ellm")
SHAPES = [("q8_0", "Q8_0"), ("q4_0", "Q4_0")]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


LOCK = None  # --lock FILE: exclusive flock held around each measuring command


def run(cmd, **kw):
    log("$", " ".join(cmd))
    held = quiet_lock(LOCK) if LOCK else ()
    if LOCK:
        log("  lock held, load", loadavg())
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    finally:
        for f in held:
            f.close()
    if r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def pct(xs, p):
    """p-th percentile (0..100) of xs, linear interpolation."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100.0
    i = int(k)
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (k - i)


def summary_ms(step_ms):
    """Median and p10/p90 of step times, as tokens/s (p90 time = p10 speed)."""
    return {"n": len(step_ms), "median_tps": 1000.0 / statistics.median(step_ms),
            "p10_tps": 1000.0 / pct(step_ms, 90), "p90_tps": 1000.0 / pct(step_ms, 10)}


def summary_tps(tps):
    return {"n": len(tps), "median_tps": statistics.median(tps), "p10_tps": pct(tps, 10), "p90_tps": pct(tps, 90)}


def machine():
    m = {"when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "kernel": platform.release()}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                m["cpu_model"] = line.split(":", 1)[1].strip()
                break
    m["logical_cpus"] = os.cpu_count()
    try:
        with open("/proc/meminfo") as f:
            m["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        m["probe"] = json.loads(run([ELLM, "probe", "--json"]))
    except SystemExit as e:
        m["probe_error"] = str(e)[:200]
    try:
        m["ellm_commit"] = os.environ.get("ELLM_COMMIT") or subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"], capture_output=True,
                                          text=True).stdout.strip()
    except OSError:
        pass
    return m


def ensure_models(tmp):
    paths = {}
    for t, _ in SHAPES:
        p = os.path.join(tmp, f"smollm2-135m-{t}.gguf")
        if not os.path.exists(p):
            run([ELLM, "synth", "--shape", "smollm2-135m", "--type", t, "-o", p])
        paths[t] = p
    return paths


def ellm_bench(model, threads, depths, steps, prefill_reps, synth_from, extra=()):
    cmd = [ELLM, "bench", "-m", model, "-t", str(threads), "--depths", ",".join(map(str, depths)),
           "-n", str(steps), "--prefill", "512", "--prefill-reps", str(prefill_reps), "--bw-mb", "512",
           "--synthetic-from", str(synth_from), "--json"] + list(extra)
    return {"cmd": cmd, "result": json.loads(run(cmd))}


def llama_bench(lb, model, threads, args):
    mask = hex((1 << threads) - 1)
    cmd = [lb, "-m", model, "-t", str(threads), "-C", mask, "--cpu-strict", "1", "-fa", "off,on", "-o", "json"] + args
    return {"cmd": cmd, "result": json.loads(run(cmd))}


def measure_speed(a, models, lb):
    out = []
    for t, label in SHAPES:
        depths = a.depths if t == "q8_0" else a.q4_depths
        for th in a.threads:
            la0 = loadavg()
            e = ellm_bench(models[t], th, depths, a.steps, a.prefill_reps, a.synthetic_from)
            ld = llama_bench(lb, models[t], th, ["-p", "0", "-n", "1", "-r", str(a.steps),
                                                 "-d", ",".join(map(str, depths))])
            lp = llama_bench(lb, models[t], th, ["-p", "512", "-n", "0", "-r", str(a.prefill_reps)])
            out.append({"model": label, "file": models[t], "threads": th, "loadavg_before": la0,
                        "loadavg_after": loadavg(), "ellm": e, "llama_decode": ld, "llama_prefill": lp})
    return out


def measure_deep(a, models):
    """Dense decode at depth, 2 threads (the bandwidth target), and sparse at the same depths."""
    depths = [int(x) for x in a.deep.split(",")] if a.deep else [d for d in a.depths if d >= 4096]
    th = max(a.threads)
    dense = ellm_bench(models["q8_0"], th, depths, a.steps, 1, a.synthetic_from_deep)
    sparse = ellm_bench(models["q8_0"], th, [d for d in depths if d >= 16384], a.sparse_steps, 1, 0,
                        ["--sparse-topk", "2048", "--prefill", "0"])
    return {"threads": th, "dense": dense, "sparse": sparse}


def measure_fidelity(a):
    modes = ["dense"] + [f"sparse:{b}" for b in (128, 256, 512)] + [f"sparse:{b}:prefill" for b in (128, 256, 512)]
    cmd = [ELLM, "eval", "-f", os.path.join(ROOT, "tests", "data", "heldout-sample.txt"), "--ctx", "2048",
           "--windows", str(a.windows), "--compare", ",".join(modes), "--json"]
    return {"cmd": cmd, "result": json.loads(run(cmd))}


def measure_logits():
    exe = os.path.join(ROOT, "build", "tests", "test_model")
    if not os.path.exists(exe):
        run(["make", "-C", ROOT, "-j2", "build/tests/test_model"])
    rows = []
    for line in run([exe], cwd=ROOT).splitlines():
        # the reference-logit lines ("NAME kv=TYPE threads=N max|d|/max|ref| = ...");
        # test_model also prints layout-to-layout comparisons, which have no kv=
        if "max|d|/max|ref|" not in line or "kv=" not in line:
            continue
        name = line.split()[0]
        kv = line.split("kv=")[1].split()[0]
        rel = float(line.split("= ")[1].split()[0])
        am = line.split("argmax ")[1].strip()
        rows.append({"model": name, "kv": kv, "rel": rel, "argmax": am, "line": line.strip()})
    return rows


# ---- rendering -------------------------------------------------------------


def fmt_range(s):
    return f"{s['median_tps']:.1f} ({s['p10_tps']:.1f}–{s['p90_tps']:.1f})"


def llama_rows(lres):
    """(depth, flash, n_prompt, n_gen) -> llama-bench result object."""
    return {(r["n_depth"], bool(r["flash_attn"]) if not isinstance(r["flash_attn"], str) else r["flash_attn"] in ("on", "1", "true"),
             r["n_prompt"], r["n_gen"]): r for r in lres}


def render(R):
    m = R["machine"]
    p = m.get("probe", {})
    node_bw = ", ".join(f"{n['read_gbps']:.1f}" for n in p.get("numa_nodes", []))
    L = []
    w = L.append
    w("# Results")
    w("")
    w(f"Every table below comes from one run of `python3 bench/run_results.py` "
      f"({m['when_utc']} UTC, eLLM `{m.get('ellm_commit', '?')}`); the raw samples, the commands and the machine "
      f"description are in [`{os.path.relpath(R['json_path'], HERE)}`]({os.path.relpath(R['json_path'], HERE)}).")
    w("")
    w("## Machine and conditions")
    w("")
    w(f"- CPU: {m.get('cpu_model', '?')}, {m.get('logical_cpus')} logical CPUs "
      f"({p.get('physical_cores', '?')} physical cores), ISA used: {p.get('isa', '?')}, {m.get('mem_gib', '?')} GiB, "
      f"Linux {m['kernel']}, THP {p.get('thp', '?')}.")
    w(f"- Read bandwidth from `ellm probe` at the start: {node_bw} GB/s; each `ellm bench` run below measures it "
      f"again and its bandwidth fractions use its own figure.")
    la = [s["loadavg_before"][0] for s in R["speed"]] + [s["loadavg_after"][0] for s in R["speed"]] or [float("nan")]
    w(f"- Load: the machine was shared with other work during the run; 1-minute load average "
      f"{min(la):.1f}–{max(la):.1f} on {m.get('logical_cpus')} CPUs while the side-by-side runs were taken "
      f"({R['loadavg_start'][0]:.1f} at the start, {R['loadavg_end'][0]:.1f} at the end). Ratios measured side by "
      f"side are more trustworthy than absolute figures.")
    w(f"- llama.cpp: native build of the node-llama-cpp@3.21.1 source bundle (`bench/setup-llamacpp-native.sh`, "
      f"GGML_NATIVE), `{os.path.basename(R['llama_bench'])}`.")
    w("")
    w("## Decode and prefill against llama.cpp's llama-bench")
    w("")
    w(f"Same file on both sides (SmolLM2-135M shape, random weights from `ellm synth`), threads pinned on both "
      f"sides, interleaved per thread count. Decode: every timed step is a sample ({R['args']['steps']} per point "
      f"and side, first step excluded on both), tok/s as median (10th–90th percentile). Prefill: 512 tokens, "
      f"{R['args']['prefill_reps']} timed passes after an untimed one on both sides. eLLM has one attention "
      f"implementation (fused, flash-decoding style); llama.cpp is shown with flash attention off and on. "
      f"'vs best' divides eLLM's median by llama.cpp's better median. eLLM's dense contexts keep no sparse index, "
      f"as `ellm run` without `--sparse-topk` (keeping it cost 0.05% of the instructions of a run; callgrind).")
    for t, label in SHAPES:
        rows = [s for s in R["speed"] if s["model"] == label]
        if not rows:
            continue
        w("")
        w(f"### {label}")
        w("")
        w("| threads | test | eLLM tok/s | llama.cpp FA off | llama.cpp FA on | eLLM vs best | eLLM bandwidth use |")
        w("|---|---|---|---|---|---|---|")
        for s in rows:
            e = s["ellm"]["result"]
            ld = llama_rows(s["llama_decode"]["result"])
            lp = llama_rows(s["llama_prefill"]["result"])
            for pt in e["points"]:
                if pt["mode"] != "dense":
                    continue
                d = pt["depth"]
                es = summary_ms(pt["step_ms"])
                off = summary_ms([x / 1e6 for x in ld[(d, False, 0, 1)]["samples_ns"]])
                on = summary_ms([x / 1e6 for x in ld[(d, True, 0, 1)]["samples_ns"]])
                best = max(off["median_tps"], on["median_tps"])
                syn = " (synthetic KV)" if pt["synthetic_kv"] else ""
                w(f"| {s['threads']} | decode @ {d}{syn} | {fmt_range(es)} | {fmt_range(off)} | {fmt_range(on)} | "
                  f"{es['median_tps'] / best:.2f}× | {100 * pt['bw_fraction']:.0f}% of {e['bandwidth_gbps']:.1f} GB/s |")
            if e["prefill"]:
                es = summary_tps(e["prefill"][0]["samples_tps"])
                off = summary_tps(lp[(0, False, 512, 0)]["samples_ts"])
                on = summary_tps(lp[(0, True, 512, 0)]["samples_ts"])
                best = max(off["median_tps"], on["median_tps"])
                w(f"| {s['threads']} | prefill 512 | {fmt_range(es)} | {fmt_range(off)} | {fmt_range(on)} | "
                  f"{es['median_tps'] / best:.2f}× | |")
    slow = R.get("two_thread_slower", [])
    retried = R.get("two_thread_retried", [])
    w("")
    if retried:
        w("llama.cpp's 2-thread runs with a point slower than its 1-thread run were measured once more, the same "
          "command, and the attempt faster at those points is the one shown (both are in the raw JSON): "
          + "; ".join(retried) + ".")
        w("")
    if slow:
        w("Where llama.cpp was still slower with 2 threads than with 1 (medians): " + "; ".join(slow) + ".")
    else:
        w("llama.cpp was faster with 2 threads than with 1 at every point of this run.")
    deep = R.get("deep")
    if deep:
        w("")
        w(f"## Dense decode at depth ({deep['threads']} threads)")
        w("")
        e = deep["dense"]["result"]
        w(f"`ellm bench` on the Q8_0 file, {R['args']['steps']} steps per depth; bytes per token = weights "
          f"({e['weight_bytes_per_token'] / 1e6:.1f} MB) + KV ({e['kv_bytes_per_token'] / 1e3:.1f} KB per token of "
          f"context); bandwidth use against the read bandwidth the same run measured ({e['bandwidth_gbps']:.1f} GB/s).")
        w("")
        w("| depth | tok/s median (p10–p90) | ms/token | GB/s | bandwidth use |")
        w("|---|---|---|---|---|")
        for pt in e["points"]:
            syn = " (synthetic KV)" if pt["synthetic_kv"] else ""
            w(f"| {pt['depth']}{syn} | {fmt_range(summary_ms(pt['step_ms']))} | {pt['ms_per_token']:.2f} | "
              f"{pt['gbps']:.1f} | {100 * pt['bw_fraction']:.0f}% |")
        s = deep["sparse"]["result"]
        sp = [x for x in s["points"] if x["mode"] == "sparse"]
        if sp:
            w("")
            w(f"Sparse attention on the same file and threads, budget {sp[0]['sparse_topk']} tokens per KV head "
              f"(`--sparse-topk`), synthetic KV; 'vs empty context' is timed interleaved with a context kept empty:")
            w("")
            w("| depth | sparse tok/s | vs dense, same run | vs empty context | selection share of the step | index bytes vs a flat scan |")
            w("|---|---|---|---|---|---|")
            for x in sp:
                w(f"| {x['depth']} | {fmt_range(summary_ms(x['step_ms']))} | {x['speedup_vs_dense']:.2f}× | "
                  f"{x['vs_empty_context']:.2f} | {100 * x['select_fraction']:.1f}% | {100 * x['index_bytes_ratio']:.0f}% |")
    fid = R.get("fidelity")
    if fid:
        f = fid["result"]
        w("")
        w("## Sparse attention fidelity (evaluation model)")
        w("")
        w(f"`ellm eval` on tests/data/heldout-sample.txt, {f['windows']} windows of {f['ctx']} tokens, positions ≥ "
          f"{f['score_from']} scored, teacher-forced; KV blocks of 16 tokens, sink 1 block, window 64 tokens. "
          f"'decode': every position decoded alone, as `ellm run` generates; 'prefill': the window in chunks of 256 "
          f"tokens with one selection per chunk, as `ellm run` prefills a prompt. 'Keys read' is the mean share of "
          f"the keys a step could see that its selection reads (sink + window + chosen blocks; a chunk reads its own "
          f"tokens too), next to budget ÷ context.")
        w("")
        w("| budget | path | budget ÷ context | keys read | ppl ratio | top-1 vs dense | mean KL | sampled recall |")
        w("|---|---|---|---|---|---|---|---|")
        dense = [x for x in f["modes"] if x["mode"] == "dense"][0]
        for x in f["modes"]:
            if x["mode"] == "dense":
                continue
            path = "prefill" if x.get("prefill") else "decode"
            rec = f"{x['sparse_recall']:.3f}" if "sparse_recall" in x else "—"
            share = f"{100 * x['attended_share']:.0f}%" if "attended_share" in x else "—"
            w(f"| {x['budget']} | {path} | {100 * x['budget_fraction']:.1f}% | {share} | {x['ppl_ratio']:.4f} | "
              f"{x['top1_agreement']:.4f} | {x['kl']:.5f} | {rec} |")
        w("")
        w(f"Dense perplexity {dense['ppl']:.4f}.")
    lg = R.get("logits")
    if lg:
        w("")
        w("## Logits against llama.cpp (tests/test_model.c)")
        w("")
        w("Every fixture model's logits at every position against llama.cpp's reference logits "
          "(max |Δlogit| ÷ max |logit|) and argmax agreement, as `make test` checks them:")
        w("")
        w("| model | KV | threads | max rel. error | argmax |")
        w("|---|---|---|---|---|")
        for r in lg:
            th = r["line"].split("threads=")[1].split()[0] if "threads=" in r["line"] else "—"
            w(f"| {r['model']} | {r['kv']} | {th} | {r['rel']:.1e} | {r['argmax']} |")
    w("")
    w("## Other pages")
    w("")
    w("Each made by its own script, named on the page:")
    w("")
    for page, what in (("NUMA.md", "memory locality (`bench/numa_ab.py`, `bench/numa_projection.py`)"),
                       ("SERVING.md", "`ellm serve` against llama-server (`bench/run_serving.mjs`), and what "
                                      "log-probabilities cost (`bench/run_scoring.mjs`)"),
                       ("SPEC.md", "self-speculative decoding"),
                       ("DIST.md", "KV cache sharded over MPI ranks"),
                       ("KV.md", "quantized KV cache"),
                       ("LONGGEN.md", "one long generation: speed, memory and recall against position (`bench/longgen`)"),
                       ("CONVERT.md", "`ellm convert`, quantization quality"),
                       ("KQUANT.md", "Q4_K and Q6_K matmul kernels: compute ceilings, Q4_K_M decode against llama-bench "
                                     "(`bench/kquant_ab.sh`)"),
                       ("GGUF_TYPES.md", "every file type llama-quantize writes, eLLM against llama-bench on the same "
                                         "files (`bench/gguf_types.sh`)"),
                       ("AVX2.md", "machines without AVX-512: the AVX2 kernels, and eLLM against llama-bench there "
                                   "(`bench/avx2_ab.sh`; Q4_K_M and Q5_K_M prefill: `bench/kq_r16_ab.sh`)")):
        if os.path.exists(os.path.join(HERE, page)):  # link only pages that exist
            w(f"- [{page}]({page}): {what}")
    w("")
    w("## Reproduce")
    w("")
    w("```sh")
    w("make && sh bench/setup-llamacpp-native.sh   # llama.cpp's llama-bench (and llama-server), built for this CPU")
    w("python3 bench/run_results.py                # measures, writes bench/results/*.json and this file")
    w("```")
    w("")
    return "\n".join(L)


def median_ts(r):
    """llama-bench result object -> median tokens/s over its repetitions (the tables' statistic)."""
    return statistics.median(r["samples_ts"])


def two_thread_slow_points(R, label, key):
    """(key, 1-thread row, 2-thread row) of each point of `label`'s llama.cpp `key` run (keys are
    (depth, flash, n_prompt, n_gen)) whose 2-thread median is below the 1-thread one."""
    by_th = {s["threads"]: s for s in R["speed"] if s["model"] == label}
    if 1 not in by_th or 2 not in by_th:
        return []
    r1, r2 = llama_rows(by_th[1][key]["result"]), llama_rows(by_th[2][key]["result"])
    return [(k, r1[k], r2[k]) for k in r1 if k in r2 and median_ts(r2[k]) < median_ts(r1[k])]


def retry_two_thread_slower(R):
    """A 2-thread llama-bench run with a point slower than the 1-thread run is measured once more, the same
    command; the attempt that is faster over those points is kept (the other stays in the JSON as
    `<key>_other_attempt`), so a disturbed run of the reference is not what the table compares against."""
    retried = []
    for t, label in SHAPES:
        for key in ("llama_decode", "llama_prefill"):
            slow = [k for k, _, _ in two_thread_slow_points(R, label, key)]
            if not slow:
                continue
            s = next(x for x in R["speed"] if x["model"] == label and x["threads"] == 2)
            first = s[key]
            again = {"cmd": first["cmd"], "result": json.loads(run(first["cmd"]))}
            r_first, r_again = llama_rows(first["result"]), llama_rows(again["result"])
            keep_again = sum(median_ts(r_again[k]) for k in slow if k in r_again) > sum(median_ts(r_first[k]) for k in slow)
            s[key], s[key + "_other_attempt"] = (again, first) if keep_again else (first, again)
            retried.append(f"{label} {'decode' if key == 'llama_decode' else 'prefill'}")
    return retried


def two_thread_check(R):
    """Points where llama.cpp's 2-thread median is below its 1-thread one."""
    out = []
    for t, label in SHAPES:
        for key in ("llama_decode", "llama_prefill"):
            for k, one, two in two_thread_slow_points(R, label, key):
                what = f"decode @ {k[0]}" if k[3] else "prefill 512"
                out.append(f"{label} {what} FA {'on' if k[1] else 'off'} "
                           f"({median_ts(one):.1f} → {median_ts(two):.1f} tok/s)")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", default="/tmp/llama.cpp/build/bin/llama-bench")
    ap.add_argument("--depths", default="0,4096,16384")
    ap.add_argument("--deep", default="4096,16384,32768", help="depths of the dense/sparse depth table")
    ap.add_argument("--q4-depths", default=None, help="depths for the Q4_0 file (default: --depths)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--synthetic-from", type=int, default=1 << 30,
                    help="eLLM depths >= N use synthetic KV in the side-by-side table (default: none)")
    ap.add_argument("--synthetic-from-deep", type=int, default=32768)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--sparse-steps", type=int, default=112, help="sparse decode steps per depth")
    ap.add_argument("--models-dir", default="/tmp")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: speed,deep,fidelity,logits")
    ap.add_argument("--from", dest="from_json", default=None, help="re-render RESULTS.md from a results JSON")
    ap.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    ap.add_argument("--lock", default=None,
                    help="hold an exclusive flock on FILE around each measuring command; processes "
                         "that take it shared (builds) wait while a measurement runs")
    a = ap.parse_args()
    global LOCK
    LOCK = a.lock
    if a.from_json:
        with open(a.from_json) as f:
            R = json.load(f)
        R["json_path"] = os.path.abspath(a.from_json)
        with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
            f.write(render(R))
        return
    a.q4_depths = [int(x) for x in (a.q4_depths or a.depths).split(",")]
    a.depths = [int(x) for x in a.depths.split(",")]
    a.threads = [int(x) for x in a.threads.split(",")]
    skip = set(filter(None, a.skip.split(",")))
    if not os.path.exists(ELLM):
        raise SystemExit("build/ellm not found: run make first")
    if "speed" not in skip and not os.path.exists(a.llama_bench):
        raise SystemExit(f"{a.llama_bench} not found: run sh bench/setup-llamacpp-native.sh first")
    R = {"args": vars(a), "llama_bench": a.llama_bench, "loadavg_start": loadavg()}
    R["machine"] = machine()
    models = ensure_models(a.models_dir)
    R["speed"] = measure_speed(a, models, a.llama_bench) if "speed" not in skip else []
    R["two_thread_retried"] = retry_two_thread_slower(R) if R["speed"] else []
    R["two_thread_slower"] = two_thread_check(R)
    if "deep" not in skip:
        R["deep"] = measure_deep(a, models)
    if "fidelity" not in skip:
        R["fidelity"] = measure_fidelity(a)
    if "logits" not in skip:
        R["logits"] = measure_logits()
    R["loadavg_end"] = loadavg()
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", "results-" + time.strftime("%Y%m%d-%H%M", time.gmtime()) + ".json")
    R["json_path"] = path
    with open(path, "w") as f:
        json.dump(R, f, indent=1)
    log("raw results:", path)
    text = render(R)
    if not a.no_write:
        with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
            f.write(text)
        log("wrote", os.path.join(HERE, "RESULTS.md"))
    else:
        print(text)


if __name__ == "__main__":
    main()
