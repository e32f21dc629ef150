#!/bin/sh
# Builds llama.cpp's own tools natively for this CPU (GGML_NATIVE) from the source
# bundle inside the npm package node-llama-cpp@3.21.1 -- the same llama.cpp the
# package ships, but compiled for this machine (its prebuilt library is a generic
# build). bench/run_results.py compares eLLM with the llama-bench built here;
# bench/gguf_types.sh also uses its llama-quantize to make the files it times, and
# bench/run_serving.mjs its llama-server.
#   usage: sh bench/setup-llamacpp-native.sh [DIR]   (default /tmp/llama.cpp; ~15-20 min on 2 cores)
# Needs node/npm, git, cmake and a C++ compiler.
set -eu
DIR=${1:-/tmp/llama.cpp}
VERSION=3.21.1
if [ -x "$DIR/build/bin/llama-bench" ] && [ -x "$DIR/build/bin/llama-quantize" ] && [ -x "$DIR/build/bin/llama-server" ]; then
    echo "$DIR/build/bin/llama-bench, llama-quantize and llama-server already built"
    exit 0
fi
command -v cmake >/dev/null || { echo "error: cmake not found (apt-get install cmake)" >&2; exit 1; }
NLC=$(mktemp -d)
trap 'rm -rf "$NLC"' EXIT
(cd "$NLC" && npm init -y >/dev/null && npm i -E "node-llama-cpp@$VERSION" >/dev/null 2>&1)
BUNDLE="$NLC/node_modules/node-llama-cpp/llama/gitRelease.bundle"
[ -f "$BUNDLE" ] || { echo "error: $BUNDLE not found in node-llama-cpp@$VERSION" >&2; exit 1; }
[ -d "$DIR/.git" ] || git clone -q "$BUNDLE" "$DIR"
cd "$DIR"
cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON >/dev/null
cmake --build build -j"$(nproc)" --target llama-bench llama-quantize llama-server >/dev/null
echo "built $DIR/build/bin/llama-bench, llama-quantize and llama-server ($(git -C "$DIR" describe --tags --always 2>/dev/null || echo unknown))"
