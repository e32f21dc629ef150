#!/bin/sh
# eLLM and llama.cpp on the GGUF files llama-quantize writes (not a test):
# for the SmolLM2-135M and Llama-3.2-1B shapes (random weights, `ellm synth`
# F16), llama.cpp's own llama-quantize makes Q8_0, Q6_K, Q5_K_M, Q4_K_M,
# Q4_K_S, IQ4_XS, Q5_0, Q4_0, Q3_K_M and Q2_K files; each round then times every file with
# `ellm bench` (decode at an empty context, prefill) and llama-bench (the
# same, 2 threads pinned on both sides), one after the other. Writes the raw
# JSON and the machine description to bench/results/gguf-types-DATE/ and
# regenerates bench/GGUF_TYPES.md (bench/gguf_types.py; RENDER=DIR renders
# an earlier run again without measuring).
#
#   sh bench/setup-llamacpp-native.sh          # llama-bench and llama-quantize
#   make && sh bench/gguf_types.sh [ROUNDS]     # default 3 rounds
set -eu
cd "$(dirname "$0")/.."
if [ -n "${RENDER:-}" ]; then
    python3 bench/gguf_types.py "$RENDER" > bench/GGUF_TYPES.md
    exit 0
fi
ROUNDS=${1:-3}
LLAMA=${LLAMA:-/tmp/llama.cpp/build/bin}
WORK=${WORK:-/tmp/ellm-gguf-types}
TYPES="Q8_0 Q6_K Q5_K_M Q4_K_M Q4_K_S IQ4_XS Q5_0 Q4_0 Q3_K_M Q2_K"
SHAPES="smollm2-135m llama3.2-1b"
for tool in llama-bench llama-quantize; do
    [ -x "$LLAMA/$tool" ] || { echo "error: $LLAMA/$tool not found (sh bench/setup-llamacpp-native.sh)" >&2; exit 1; }
done
OUT=bench/results/gguf-types-$(date -u +%Y%m%d-%H%M)
mkdir -p "$WORK" "$OUT"
build/ellm probe --json > "$OUT/machine.json" 2>/dev/null
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null || echo unknown > "$OUT/commit.txt"
for shape in $SHAPES; do
    f16=$WORK/$shape-f16.gguf
    [ -f "$f16" ] || build/ellm synth --shape "$shape" --type f16 -o "$f16" > /dev/null
    for t in $TYPES; do
        f=$WORK/$shape-$t.gguf
        if [ ! -f "$f" ]; then
            "$LLAMA/llama-quantize" "$f16" "$f.part" "$t" 2 > "$WORK/$shape-$t.log" 2>&1 ||
                { echo "error: llama-quantize $t failed (see $WORK/$shape-$t.log)" >&2; exit 1; }
            mv "$f.part" "$f"
        fi
        # the tensor types of the file, as llama-quantize reports them
        grep -o 'converting to [A-Za-z0-9_]*' "$WORK/$shape-$t.log" | sort | uniq -c |
            awk '{printf "%s%s:%d", (NR > 1 ? " " : ""), $4, $1}' > "$OUT/$shape-$t.types"
    done
done
r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "round $r of $ROUNDS ($(date -u +%T))" >&2
    for shape in $SHAPES; do
        [ "$shape" = smollm2-135m ] && P=512 N=64 || P=256 N=32
        for t in $TYPES; do
            f=$WORK/$shape-$t.gguf
            build/ellm bench -m "$f" -t 2 --depths 0 -n "$N" --prefill "$P" --prefill-reps 2 --json \
                > "$OUT/ellm-$shape-$t-r$r.json" 2>/dev/null
            "$LLAMA/llama-bench" -m "$f" -t 2 -p "$P" -n "$N" -r 2 --cpu-mask 0x3 --cpu-strict 1 -o json \
                > "$OUT/llama-$shape-$t-r$r.json" 2>/dev/null
        done
    done
    r=$((r + 1))
done
python3 bench/gguf_types.py "$OUT" > bench/GGUF_TYPES.md
echo "wrote $OUT and bench/GGUF_TYPES.md" >&2
