#!/bin/sh
# Renders the tables of an A/B run of a weight type computed as blocks of 32
# (bench/KQUANT.md's IQ4_XS and Q5_K sections) from its raw output: lines
#   round R main|new model selftest_gbps G decode_tok_s D prefill_tok_s P
#   round R main|new gemm TYPE 1b avx512 nb=N t=2 MS ms/layer ...   (bench_gemm)
# Medians over the rounds, each round in brackets.
#
#   sh bench/blocks32_table.sh TYPE RAW [SMALL_ROWS_RAW] > table.md
set -eu
[ $# -ge 2 ] || { sed -n '2,9p' "$0"; exit 2; }
type=$1 raw=$2 small=${3:-}
med() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
col() { awk -v b="$1" -v f="$2" '$3 == b && $4 == "model" {print $f}' "$raw"; }
echo "ellm bench, 2 threads: decode at depth 512 and prefill of 256 tokens, medians (rounds)"
echo
echo "| build | decode tok/s | prefill tok/s |"
echo "|---|---:|---:|"
for b in main new; do
    echo "| $b | $(col $b 8 | med) ($(col $b 8 | tr '\n' ' ' | sed 's/ $//')) | $(col $b 10 | med) ($(col $b 10 | tr '\n' ' ' | sed 's/ $//')) |"
done
echo
echo "bench_gemm, one Llama-3.2-1B layer of $type, 2 threads, weights from DRAM: ms per layer, medians"
echo
echo "| activation rows | main | new | main ÷ new |"
echo "|---:|---:|---:|---:|"
for nb in 1 2 4 8 16 128; do
    src=$raw
    [ -n "$small" ] && { [ "$nb" = 4 ] || [ "$nb" = 8 ]; } && src=$small
    m=$(awk -v t="$type" -v n="nb=$nb" '$3 == "main" && $5 == t && $8 == n {print $10}' "$src" | med)
    x=$(awk -v t="$type" -v n="nb=$nb" '$3 == "new" && $5 == t && $8 == n {print $10}' "$src" | med)
    echo "| $nb | $m | $x | $(echo "$m $x" | awk '{printf "%.2f", $1 / $2}') |"
done
