#!/usr/bin/env python3
"""`ellm convert` speed and memory on a Llama-3.2-1B-shaped BF16 checkpoint
(random weights, written by build/bench/convert_synth_hf), against the speed
of reading the checkpoint from the page cache (warm) and from the disk
(cold, when this process may drop the page cache: root), and decode speed of
the q4_0, q4_k_m and int4-g128 files (every matrix of this shape is a
multiple of 128 and 256 columns, so each file is its type throughout).

usage: python3 bench/convert_speed.py [--build build] [--threads 2]
           [--dir /tmp/ellm-convert-speed] [--rounds 3] [--json OUT]
Prints the Markdown section of bench/CONVERT.md; --json writes every
measurement. Run it on a quiet machine, e.g. under bench/quietly.py."""
import argparse, json, os, platform, resource, statistics, subprocess, sys, time

TYPES = ["q4_0", "q4_k_m", "int4-g128"]


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def read_speed(path):
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - t0


def convert(b, hf, out, ty, threads):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", f"{b}/ellm", "convert", hf, "-o", out, "--type", ty,
                        "--threads", str(threads)], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"ellm convert --type {ty} failed:\n{p.stderr}")
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss_kb = int(p.stderr.strip().splitlines()[-1])
    return {"seconds": secs, "peak_rss_kb": rss_kb, "out_bytes": os.path.getsize(out),
            "cpu_user_s": r1.ru_utime - r0.ru_utime, "cpu_sys_s": r1.ru_stime - r0.ru_stime}


def decode(b, model, threads):
    p = subprocess.run([f"{b}/ellm", "bench", "-m", model, "-t", str(threads), "--depths", "0", "--prefill", "0",
                        "-n", "32", "--bw-mb", "256", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ellm bench failed on {model}:\n{p.stderr}")
    j = json.loads(p.stdout)
    pt = next(x for x in j["points"] if x["mode"] == "dense")
    return {"tokens_per_s": pt["tokens_per_s"], "weight_bytes_per_token": j["weight_bytes_per_token"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/ellm-convert-speed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    b, d = a.build, a.dir
    hf = f"{d}/hf"
    os.makedirs(d, exist_ok=True)
    if not os.path.exists(f"{hf}/model.safetensors"):
        subprocess.run([f"{b}/bench/convert_synth_hf", hf, "--shape", "llama3.2-1b", "--dtype", "bf16"], check=True,
                       stdout=subprocess.DEVNULL)
    src = f"{hf}/model.safetensors"
    src_bytes = os.path.getsize(src)
    res = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "loadavg_start": os.getloadavg()},
           "src_bytes": src_bytes, "threads": a.threads}

    # Read bounds: cold (disk) where the page cache can be dropped, warm (memory).
    res["read_cold_s"] = read_speed(src) if drop_caches() else None
    read_speed(src)
    res["read_warm_s"] = statistics.median(read_speed(src) for _ in range(3))

    # q4_0: cold once (when possible), then warm rounds; the other types warm once.
    out = {ty: f"{d}/{ty}.gguf" for ty in TYPES}
    res["convert_q4_0_cold"] = convert(b, hf, out["q4_0"], "q4_0", a.threads) if drop_caches() else None
    read_speed(src)
    res["convert_q4_0_warm"] = [convert(b, hf, out["q4_0"], "q4_0", a.threads) for _ in range(a.rounds)]
    res["convert_other"] = {ty: convert(b, hf, out[ty], ty, a.threads) for ty in TYPES[1:]}

    res["decode"] = []
    for r in range(a.rounds):
        for ty in (TYPES if r % 2 == 0 else TYPES[::-1]):
            pt = decode(b, out[ty], a.threads)
            res["decode"].append({"type": ty, "round": r + 1, "tokens_per_s": pt.get("tokens_per_s"),
                                  "weight_bytes_per_token": pt.get("weight_bytes_per_token")})
    res["machine"]["loadavg_end"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)

    gb = src_bytes / 1e9
    warm = res["convert_q4_0_warm"]
    cw = statistics.median(x["seconds"] for x in warm)
    print(f"Llama-3.2-1B-shaped BF16 checkpoint, {gb:.2f} GB, {a.threads} threads; load average "
          f"{res['machine']['loadavg_start'][0]:.2f} at the start, {res['machine']['loadavg_end'][0]:.2f} at the end.\n")
    print("| measurement | seconds | GB/s of source | share of the read bound |")
    print("|---|---:|---:|---:|")
    rw = res["read_warm_s"]
    print(f"| read, page cache warm (median of 3) | {rw:.2f} | {gb / rw:.2f} | |")
    if res["read_cold_s"]:
        rc = res["read_cold_s"]
        print(f"| read, page cache dropped (disk) | {rc:.2f} | {gb / rc:.2f} | |")
    print(f"| convert to q4_0, warm (median of {len(warm)}) | {cw:.2f} | {gb / cw:.2f} | "
          f"{rw / cw * 100:.0f}% of warm |")
    if res["convert_q4_0_cold"]:
        cc = res["convert_q4_0_cold"]["seconds"]
        print(f"| convert to q4_0, cold | {cc:.2f} | {gb / cc:.2f} | {res['read_cold_s'] / cc * 100:.0f}% of cold |")
    for ty, x in res["convert_other"].items():
        print(f"| convert to {ty}, warm | {x['seconds']:.2f} | {gb / x['seconds']:.2f} | {rw / x['seconds'] * 100:.0f}% of warm |")
    print()
    print("| type | file MB | peak RSS MB | CPU user + sys s | decode tokens/s (median of "
          f"{a.rounds}) | vs q4_0 |")
    print("|---|---:|---:|---:|---:|---:|")
    med = {ty: statistics.median(x["tokens_per_s"] for x in res["decode"] if x["type"] == ty) for ty in TYPES}
    for ty in TYPES:
        x = warm[0] if ty == "q4_0" else res["convert_other"][ty]
        print(f"| {ty} | {x['out_bytes'] / 1e6:.0f} | {x['peak_rss_kb'] / 1024:.0f} | "
              f"{x['cpu_user_s'] + x['cpu_sys_s']:.1f} | {med[ty]:.2f} | {med[ty] / med['q4_0']:.2f} |")


if __name__ == "__main__":
    main()
