#!/bin/sh
# Checks that #include "folder/..." lines under src/ point down the layers of
# docs/ARCHITECTURE.md: a file may include headers of its own folder and of
# folders on a strictly lower layer, never of a sibling on the same layer or
# of a higher one. Prints each offending line; exits 1 if there is one.
# Usage: sh tools/check_layers.sh   (from the top of the tree)
set -eu
cd "$(dirname "$0")/.."
# folder layer (0 = ground); keep in step with docs/ARCHITECTURE.md
LAYERS="core 0  kernels 1 topology 1  gguf 2  tokenizer 3  attention 3
        chat 4 model 4  dist 5 convert 5  engine 6  spec 7  server 8  cli 9"
grep -rn '^#include "[a-z_]*/' src | awk -v layers="$LAYERS" '
BEGIN { n = split(layers, w, /[ \t\n]+/); for (i = 1; i < n; i += 2) if (w[i] != "") rank[w[i]] = w[i + 1] }
{
    split($0, parts, ":"); file = parts[1]
    split(file, p, "/"); from = p[2]
    match($0, /#include "[a-z_]+\//); to = substr($0, RSTART + 10, RLENGTH - 11)
    if (!(from in rank)) { printf "%s: folder src/%s/ has no layer in tools/check_layers.sh\n", file, from; bad = 1; next }
    if (!(to in rank)) { printf "%s: includes src/%s/, which has no layer\n", file, to; bad = 1; next }
    if (from != to && rank[to] >= rank[from]) {
        printf "%s: src/%s/ (layer %d) includes src/%s/ (layer %d): %s\n", file, from, rank[from], to, rank[to], $0
        bad = 1
    }
}
END { if (bad) exit 1; print "layers: every include under src/ points down" }'
