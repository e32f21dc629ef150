#!/bin/sh
# Renders table.md from raw.txt (the alternated rounds of bench/KQUANT.md's IQ4_XS section).
med() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
raw=$(dirname "$0")/raw.txt
{
echo "ellm bench, Llama-3.2-1B IQ4_XS (llama-quantize), 2 threads: medians (rounds)"
echo
echo "| build | decode tok/s, depth 512 | prefill 256 tok/s |"
echo "|---|---:|---:|"
for b in main new; do
  d=$(awk -v b=$b '$3 == b && $4 == "model" {print $8}' "$raw" | med); dr=$(awk -v b=$b '$3 == b && $4 == "model" {printf "%s ", $8}' "$raw")
  p=$(awk -v b=$b '$3 == b && $4 == "model" {print $10}' "$raw" | med); pr=$(awk -v b=$b '$3 == b && $4 == "model" {printf "%s ", $10}' "$raw")
  echo "| $b | $d ($dr) | $p ($pr) |"
done
echo
echo "bench_gemm, one Llama-3.2-1B layer of IQ4_XS, 2 threads, weights from DRAM: ms per layer, medians (rounds)"
echo
echo "| activation rows | main | new | main ÷ new |"
echo "|---:|---:|---:|---:|"
for nb in 1 2 4 8 16 128; do
  m=$(awk -v n="nb=$nb" '$3 == "main" && $4 == "gemm" && $8 == n {print $10}' "$raw" | med)
  x=$(awk -v n="nb=$nb" '$3 == "new" && $4 == "gemm" && $8 == n {print $10}' "$raw" | med)
  echo "| $nb | $m | $x | $(echo "$m $x" | awk '{printf "%.2f", $1 / $2}') |"
done
} > "$(dirname "$0")/table.md"
