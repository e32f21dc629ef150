#!/bin/sh
# Installs llama.cpp for side-by-side runs: the npm package node-llama-cpp@3.21.1,
# which carries prebuilt llama.cpp CPU libraries for linux-x64 (newer versions may
# not install here). Goes into bench/node_modules, next to llamacpp_tokenize.mjs, so
# `node bench/llamacpp_tokenize.mjs ...` resolves it from any working directory.
# Speed comparisons use llama-bench built natively instead (setup-llamacpp-native.sh).
# Idempotent: does nothing when that exact version is already installed.
set -eu
VERSION=3.21.1
DIR=$(cd "$(dirname "$0")" && pwd)
PKG="$DIR/node_modules/node-llama-cpp/package.json"

if [ -f "$PKG" ] && node -e '
    const v = require(process.argv[1]).version;
    process.exit(v === process.argv[2] ? 0 : 1);' "$PKG" "$VERSION" 2>/dev/null; then
    echo "node-llama-cpp@$VERSION already installed in $DIR/node_modules"
    exit 0
fi

command -v node >/dev/null 2>&1 || { echo "setup-llamacpp: node not found" >&2; exit 1; }
command -v npm >/dev/null 2>&1 || { echo "setup-llamacpp: npm not found" >&2; exit 1; }

# --no-save/--no-package-lock: the pinned version lives here, not in a package.json.
# --prefix keeps npm from walking up to some other package root.
npm i -E --no-save --no-package-lock --no-audit --no-fund --prefix "$DIR" "node-llama-cpp@$VERSION"
node -e 'require.resolve(process.argv[1])' "$PKG" >/dev/null
echo "node-llama-cpp@$VERSION installed in $DIR/node_modules"
