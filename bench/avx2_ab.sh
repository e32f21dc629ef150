#!/bin/sh
# Two builds on a machine without AVX-512 (or any machine, ELLM_ISA=avx2),
# alternated round by round in one run (not a test), then llama.cpp's
# llama-bench on the same files when LLAMA_BENCH names it:
#   gemm.md     bench_gemm, Llama-3.2-1B layer, Q4_K and Q6_K, 1 and 4 rows, 2 threads
#   batch.md    bench_batch on MODEL_Q8 (1, 4 and 16 sequences a step, 2 threads;
#               each build lays out the weights as it does at load)
#   attn.md     bench_attention_rows, F16 KV, 30 layers at 16K, 1, 2 and 4 query tokens
#   dense-q8/   bench/dense_depth_ab.sh on MODEL_Q8 at depths 0, 4096, 16384
#   dense-q4km/ bench/dense_depth_ab.sh on MODEL_Q4KM at depth 512
#   llama.md    llama-bench's decode (flash attention off and on, its better
#               setting) at the same depths, next to the new build's dense decode
#               in dense-q8/ and dense-q4km/ (medians over the rounds)
# ROUNDS 0 renders llama.md again from OUT.
#
#   sh bench/avx2_ab.sh OLD_BUILD NEW_BUILD OUT ROUNDS MODEL_Q8 MODEL_Q4KM
#
# OLD_BUILD and NEW_BUILD are build folders (holding ellm and bench/), e.g.
# (bench/AVX2.md, 2026-12-07):
#   build/ellm synth --shape smollm2-135m --type q8_0 -o /tmp/smollm2-135m-q8_0.gguf
#   build/ellm synth --shape llama3.2-1b --type q4_k_m -o /tmp/l1b-q4_k_m.gguf
#   LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench sh bench/avx2_ab.sh /tmp/build-base build \
#     bench/results/avx2-20261207 3 /tmp/smollm2-135m-q8_0.gguf /tmp/l1b-q4_k_m.gguf
set -eu
[ $# -eq 6 ] || { sed -n '2,22p' "$0"; exit 2; }
OLD=$1 NEW=$2 OUT=$3 ROUNDS=$4 MQ8=$5 MQ4KM=$6
HERE=$(dirname "$0")
mkdir -p "$OUT"
if [ "$ROUNDS" -gt 0 ]; then
    "$NEW/ellm" probe > "$OUT/probe.txt" 2>&1 || true
    python3 "$HERE/ab_rounds.py" gemm "$ROUNDS" "-m 1b -n 1,4 -t 2 q4_K q6_K" \
        old="$OLD/bench/bench_gemm" new="$NEW/bench/bench_gemm" --raw "$OUT/gemm-raw.txt" > "$OUT/gemm.md"
    python3 "$HERE/ab_rounds.py" batch "$ROUNDS" "-m $MQ8 -n 1,4,16 -t 2 -f 0 -s 48" \
        old="$OLD/bench/bench_batch" new="$NEW/bench/bench_batch" --raw "$OUT/batch-raw.txt" > "$OUT/batch.md"
    python3 "$HERE/ab_rounds.py" attn "$ROUNDS" "-t 2 --kv f16 --nq 1,2,4 --depths 16384 --kernel rows" \
        old="$OLD/bench/bench_attention_rows" new="$NEW/bench/bench_attention_rows" --raw "$OUT/attn-raw.txt" > "$OUT/attn.md"
    sh "$HERE/dense_depth_ab.sh" "$OLD/ellm" "$NEW/ellm" "$OUT/dense-q8" "$ROUNDS" "$MQ8" 0,4096,16384 "-t 2 -n 32" > /dev/null
    sh "$HERE/dense_depth_ab.sh" "$OLD/ellm" "$NEW/ellm" "$OUT/dense-q4km" "$ROUNDS" "$MQ4KM" 512 "-t 2 -n 32" > /dev/null
    if [ -n "${LLAMA_BENCH:-}" ]; then
        "$LLAMA_BENCH" -m "$MQ8" -t 2 -C 0x3 --cpu-strict 1 -fa off,on -p 0 -n 32 -d 0,4096,16384 -r 3 -o json \
            > "$OUT/llama-bench-q8.json"
        "$LLAMA_BENCH" -m "$MQ4KM" -t 2 -C 0x3 --cpu-strict 1 -fa off,on -p 0 -n 32 -d 512 -r 3 -o json \
            > "$OUT/llama-bench-q4km.json"
    fi
fi
python3 - "$OUT" <<'EOF'
import json, os, statistics, sys
out = sys.argv[1]
def ellm(sub):
    """depth -> median tok/s of the new build's dense decode over the rounds"""
    by = {}
    for f in sorted(os.listdir(f"{out}/{sub}")):
        if f.startswith("bench-") and f.endswith("-new.json"):
            for pt in json.load(open(f"{out}/{sub}/{f}"))["points"]:
                if pt.get("mode", "dense") == "dense":
                    by.setdefault(pt["depth"], []).append(pt["tokens_per_s"])
    return {d: statistics.median(v) for d, v in by.items()}
def llama(name):
    """depth -> (fa off, fa on) median tok/s of llama-bench's repetitions"""
    path = f"{out}/llama-bench-{name}.json"
    if not os.path.exists(path):
        return {}
    by = {}
    for r in json.load(open(path)):
        if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            fa = r["flash_attn"]
            fa = fa in ("on", "1", "true") if isinstance(fa, str) else bool(fa)
            by.setdefault(r["n_depth"], {})[fa] = statistics.median(r["samples_ts"])
    return {d: (v.get(False), v.get(True)) for d, v in by.items()}
lines = ["| file | depth | eLLM tok/s | llama-bench fa off | fa on | eLLM ÷ llama-bench's better |",
         "|---|---:|---:|---:|---:|---:|"]
for name, sub in (("q8", "dense-q8"), ("q4km", "dense-q4km")):
    e, l = ellm(sub), llama(name)
    for d in sorted(e):
        off, on = l.get(d, (None, None))
        best = max(x for x in (off, on, 0) if x is not None)
        fmt = lambda x: f"{x:.1f}" if x else "-"
        lines.append(f"| {name} | {d} | {e[d]:.1f} | {fmt(off)} | {fmt(on)} | " + (f"{e[d] / best:.2f}" if best else "-") + " |")
open(f"{out}/llama.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
