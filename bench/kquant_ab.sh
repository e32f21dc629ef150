#!/bin/sh
# K-quant (Q4_K, Q6_K) matmul speed of two builds, alternated round by round
# in one run (not a test): bench_kernels' hot matrices (one thread, weights
# from L2: the kernel's compute ceiling) and `ellm bench` decode and prefill
# of a Llama-3.2-1B-shaped Q4_K_M file (2 threads), then llama.cpp's
# llama-bench on the same file when LLAMA_BENCH names it. With DEEP_MODEL set
# (a Llama-3.2-1B-shaped Q4_0 file, whose output matrix is Q6_K), each round
# also times dense and sparse decode (2048-token budget, Q8_0 KV) at depth
# 32768 with synthetic KV, the setting of bench/longgen. With GEMM=1 each round
# also times bench_gemm's Llama-3.2-1B layer of Q4_K (GEMM_TYPE=q6_K: of Q6_K) at
# 1-128 activation rows (2 threads, weights from DRAM: batched decode,
# verification, prefill). Writes the raw output
# to OUT/raw.txt and the tables to OUT/table.md; with ROUNDS 0 it only renders
# the tables again from OUT/raw.txt.
#
#   sh bench/kquant_ab.sh OLD_BUILD NEW_BUILD OUT ROUNDS MODEL
#
# OLD_BUILD and NEW_BUILD are build folders (holding ellm and bench/bench_kernels),
# e.g. (bench/KQUANT.md, 2026-12-05):
#   build/ellm synth --shape llama3.2-1b --type q4_k_m -o /tmp/llama3.2-1b-q4_k_m.gguf
#   LLAMA_BENCH=/tmp/llama.cpp/build/bin/llama-bench DEEP_MODEL=/tmp/llama3.2-1b-q4_0.gguf \
#     sh bench/kquant_ab.sh /tmp/build-old build bench/results/kquant-20261205 3 /tmp/llama3.2-1b-q4_k_m.gguf
set -eu
[ $# -eq 5 ] || { sed -n '2,22p' "$0"; exit 2; }
OLD=$1 NEW=$2 OUT=$3 ROUNDS=$4 MODEL=$5
GEMM_TYPE=${GEMM_TYPE:-q4_K}
mkdir -p "$OUT"
raw=$OUT/raw.txt
[ "$ROUNDS" -eq 0 ] || : > "$raw"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for which in old new; do
        [ "$which" = old ] && dir=$OLD || dir=$NEW
        "$dir/bench/bench_kernels" -s hot -n 1 q4_K q6_K 2>&1 | grep -E ' (avx512|avx2) ' | grep -v '^read' |
            sed "s/^/round $r $which kernel /" | tee -a "$raw"
        "$dir/ellm" bench -m "$MODEL" -t 2 --depths 512 -n 32 --prefill 256 --prefill-reps 2 > "$OUT/bench.txt" 2>&1
        bw=$(sed -n 's/.*, \([0-9.]*\) GB\/s (2 threads).*/\1/p' "$OUT/bench.txt")
        dec=$(awk '$1 == 512 && $2 == "dense" {print $3, $6}' "$OUT/bench.txt")
        pre=$(sed -n 's/^prefill 256 tokens: \([0-9.]*\) tokens\/s/\1/p' "$OUT/bench.txt")
        echo "round $r $which model selftest_gbps $bw decode_tok_s_gbps $dec prefill_tok_s $pre" | tee -a "$raw"
        if [ -n "${GEMM:-}" ]; then
            "$dir/bench/bench_gemm" -m 1b -n 1,2,4,8,16,128 -t 2 -r 3 "$GEMM_TYPE" 2>&1 | grep "^$GEMM_TYPE" |
                sed "s/^/round $r $which gemm /" | tee -a "$raw"
        fi
        if [ -n "${DEEP_MODEL:-}" ]; then
            "$dir/ellm" bench -m "$DEEP_MODEL" -t 2 --depths 32768 --synthetic-from 4096 --kv-type q8_0 \
                --sparse-topk 2048 -n 24 > "$OUT/bench.txt" 2>&1
            bw=$(sed -n 's/.*, \([0-9.]*\) GB\/s (2 threads).*/\1/p' "$OUT/bench.txt")
            dd=$(awk '$1 == 32768 && $2 == "dense" {print $3, $6}' "$OUT/bench.txt")
            sp=$(awk '$1 == 32768 && $2 == "sparse" {print $3, $6}' "$OUT/bench.txt")
            echo "round $r $which deep selftest_gbps $bw dense_tok_s_gbps $dd sparse_tok_s_gbps $sp" | tee -a "$raw"
        fi
    done
    r=$((r + 1))
done
rm -f "$OUT/bench.txt"
if [ "$ROUNDS" -gt 0 ] && [ -n "${LLAMA_BENCH:-}" ]; then
    "$LLAMA_BENCH" -m "$MODEL" -t 2 -p 256 -n 64 -d 512 -fa 0,1 -r 3 2>&1 | grep '^|' | sed 's/^/llama-bench /' |
        tee -a "$raw"
fi
awk '
    function med(s,   a, n, i, j, t) {
        n = split(s, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    $4 == "kernel" { key = $5 " " $8; k[key, $3] = k[key, $3] " " $13; keys[key] = 1 }
    $4 == "model" { bw[$3] = bw[$3] " " $6; dec[$3] = dec[$3] " " $8; gb[$3] = gb[$3] " " $9; pre[$3] = pre[$3] " " $11 }
    $4 == "gemm" { nbk = $8; sub(/^nb=/, "", nbk); g[nbk, $3] = g[nbk, $3] " " $10; gk[nbk] = 1; gtype = $5 }
    $4 == "deep" { dbw[$3] = dbw[$3] " " $6; dde[$3] = dde[$3] " " $8; ddg[$3] = ddg[$3] " " $9
                   dsp[$3] = dsp[$3] " " $11; dsg[$3] = dsg[$3] " " $12; deep = 1 }
    $1 == "llama-bench" && $0 ~ /tg64|pp256/ { n = split($0, f, "|"); lb = lb sprintf("| llama-bench, fa %s | %s | %s |\n", f[7], f[8], f[9]) }
    END {
        print "bench_kernels hot, one thread, GB/s of weights (median of the rounds; each round in brackets)\n"
        print "| type | shape | before | after | after ÷ before |"
        print "|---|---|---:|---:|---:|"
        n = 0
        for (key in keys) sorted[++n] = key
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (sorted[j] < sorted[i]) { t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t }
        for (i = 1; i <= n; i++) {
            key = sorted[i]
            split(key, kk, " ")
            printf "| %s | %s | %.1f (%s) | %.1f (%s) | %.2f |\n", kk[1], kk[2], med(k[key, "old"]), substr(k[key, "old"], 2),
                   med(k[key, "new"]), substr(k[key, "new"], 2), med(k[key, "new"]) / med(k[key, "old"])
        }
        print "\nellm bench, 2 threads, decode at depth 512 and prefill of 256 tokens (medians; each round in brackets)\n"
        print "| build | self-test GB/s | decode tok/s | decode GB/s | prefill tok/s |"
        print "|---|---|---:|---:|---:|"
        printf "| before | %s | %.2f (%s) | %.1f | %.1f (%s) |\n", substr(bw["old"], 2), med(dec["old"]), substr(dec["old"], 2),
               med(gb["old"]), med(pre["old"]), substr(pre["old"], 2)
        printf "| after | %s | %.2f (%s) | %.1f | %.1f (%s) |\n", substr(bw["new"], 2), med(dec["new"]), substr(dec["new"], 2),
               med(gb["new"]), med(pre["new"]), substr(pre["new"], 2)
        n = 0
        for (key in gk) gs[++n] = key + 0
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (gs[j] < gs[i]) { t = gs[i]; gs[i] = gs[j]; gs[j] = t }
        if (n) {
            print "\nbench_gemm, one Llama-3.2-1B layer of " toupper(substr(gtype, 1, 2)) substr(gtype, 3) ", 2 threads, weights from DRAM: ms per layer (medians; each round in brackets)\n"
            print "| activation rows | before | after | before ÷ after |"
            print "|---:|---:|---:|---:|"
            for (i = 1; i <= n; i++)
                printf "| %d | %.3f (%s) | %.3f (%s) | %.2f |\n", gs[i], med(g[gs[i], "old"]), substr(g[gs[i], "old"], 2),
                       med(g[gs[i], "new"]), substr(g[gs[i], "new"], 2), med(g[gs[i], "old"]) / med(g[gs[i], "new"])
        }
        if (deep) {
            print "\nDEEP_MODEL (Q4_0, Q6_K output matrix), 2 threads, depth 32768 (synthetic KV), Q8_0 KV; sparse: 2048-token budget (medians; each round in brackets)\n"
            print "| build | self-test GB/s | dense tok/s | dense GB/s | sparse tok/s | sparse GB/s |"
            print "|---|---|---:|---:|---:|---:|"
            split("old new", w, " ")
            for (i = 1; i <= 2; i++)
                printf "| %s | %s | %.2f (%s) | %.1f | %.2f (%s) | %.1f |\n", w[i] == "old" ? "before" : "after", substr(dbw[w[i]], 2),
                       med(dde[w[i]]), substr(dde[w[i]], 2), med(ddg[w[i]]), med(dsp[w[i]]), substr(dsp[w[i]], 2), med(dsg[w[i]])
        }
        if (lb != "") { print "\nllama.cpp on the same file, after the rounds\n"; print "| run | test | t/s |"; print "|---|---|---:|"; printf "%s", lb }
    }' "$raw" | tee "$OUT/table.md"
