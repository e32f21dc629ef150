#!/bin/sh
# bench/kill_resume.sh: kill `ellm run --save-state` with SIGKILL at random
# points of the run, resume it with `ellm run --resume`, and compare the whole
# output with an uninterrupted run's, byte for byte. A script, not a test
# (tests/test_state.c runs a few such trials in `make test`); this one runs
# many, and every trial counted was killed while generating.
#
# usage: sh bench/kill_resume.sh [TRIALS_PER_CONFIG (default 20)] [OUT_DIR (default bench/results/kill-resume)]
# env:   ELLM (default build/ellm), MODEL (default models/evalmodel.gguf), N (tokens, default 1500)
#
# For each configuration (greedy, seeded sampling with penalties, sparse
# attention, a Q8_0 KV cache): one uninterrupted run (saving too) gives the
# reference text and its duration D; each trial starts the same run, waits
# for its first save, then a random 5-95% of D, kills it, resumes from the
# state file, and compares. A trial whose run had already ended is retried
# with a shorter wait (it would only test a finished state). Writes
# OUT_DIR/trials.tsv (config, trial, wait ms, tokens in the state, identical) and a
# summary on stdout, with the temporary files the killed runs left beside the
# state file (none where the file system has unnamed temporary files).
set -eu
TRIALS=${1:-20}
OUT=${2:-bench/results/kill-resume}
ELLM=${ELLM:-build/ellm}
MODEL=${MODEL:-models/evalmodel.gguf}
N=${N:-1500}
mkdir -p "$OUT"
ST="$OUT/run.state"
TSV="$OUT/trials.tsv"
printf 'config\ttrial\twait_ms\tsaved_tokens\tidentical\n' > "$TSV"

now_ms() { date +%s%3N; }

run_config() { # name, flags
    name=$1
    eval "set -- $2" # the flags, quotes and all, as the run's arguments
    rm -f "$ST" "$ST.ref"
    t0=$(now_ms)
    "$ELLM" run -m "$MODEL" -n "$N" "$@" --save-state "$ST.ref" > "$OUT/$name.want" 2>/dev/null
    dur=$(($(now_ms) - t0))
    t=1
    while [ "$t" -le "$TRIALS" ]; do
        frac=$(awk -v s="$$$t$(now_ms)" 'BEGIN { srand(s % 2147483647); printf "%d", 50 + rand() * 900 }')
        wait=$((dur * frac / 1000))
        tries=0
        while :; do
            rm -f "$ST"
            "$ELLM" run -m "$MODEL" -n "$N" "$@" --save-state "$ST" > /dev/null 2>&1 &
            pid=$!
            i=0
            while [ ! -f "$ST" ] && [ $i -lt 20000 ] && kill -0 $pid 2>/dev/null; do
                sleep 0.005
                i=$((i + 1))
            done
            sleep "$(awk -v w="$wait" 'BEGIN { printf "%.3f", w / 1000 }')"
            if kill -9 $pid 2>/dev/null; then
                wait $pid 2>/dev/null || true
                break
            fi
            wait $pid 2>/dev/null || true
            tries=$((tries + 1))
            [ $tries -lt 5 ] || { echo "kill_resume: $name trial $t: the run ends before any kill" >&2; exit 1; }
            wait=$((wait / 2))
        done
        "$ELLM" run --resume "$ST" --stats > "$OUT/$name.got" 2> "$OUT/$name.err" && rc=0 || rc=$?
        # tokens in the state = N - the tokens the resumed run decoded
        saved=$(awk -v n="$N" '/^decode: / { print n - $2; exit }' "$OUT/$name.err")
        same=0
        [ $rc -eq 0 ] && cmp -s "$OUT/$name.want" "$OUT/$name.got" && same=1
        printf '%s\t%d\t%d\t%s\t%d\n' "$name" "$t" "$wait" "${saved:--}" "$same" >> "$TSV"
        [ $same -eq 1 ] || cp "$OUT/$name.got" "$OUT/$name.trial$t.differs"
        t=$((t + 1))
    done
    echo "$name: reference run $dur ms, $(awk -F'\t' -v n="$name" '$1 == n && $5 == 1' "$TSV" | wc -l) of $TRIALS trials identical"
}

run_config greedy "--temp 0 -t 2 -p 'def parse(line):' --save-every 13"
run_config sampled "--seed 11 --repeat-penalty 1.1 --presence-penalty 0.3 --frequency-penalty 0.2 -t 2 -p 'class Node:' --save-every 17"
run_config sparse "--seed 5 --sparse-topk 96 -t 2 -p 'import json' --save-every 19"
run_config q8kv "--temp 0 --kv-type q8_0 -t 2 -p 'for i in range(' --save-every 11"
left=$(find "$OUT" -maxdepth 1 -name "$(basename "$ST").tmp.*" | wc -l)
echo "temporary files left beside the state file: $left"
rm -f "$ST" "$ST.ref" "$OUT"/*.got "$OUT"/*.err "$ST".tmp.*
awk -F'\t' 'NR > 1 { n++; s += $5 } END { printf "all: %d of %d trials identical\n", s, n }' "$TSV"
