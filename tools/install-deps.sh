#!/bin/sh
# Installs the Debian packages eLLM needs to build and test, when run as root;
# otherwise prints the apt-get line to run.
#   build:   gcc make, PCRE2 (pre-tokenizer regexes), cJSON, utf8proc,
#            libmicrohttpd (HTTP server), hwloc + libnuma (topology, placement)
#   tests:   Open MPI (sharded KV across ranks), Debian's chromium (the chat
#            page in a real headless browser), clang (libFuzzer harnesses),
#            Node.js and npm when absent (the server tests, llama.cpp)
#   bench:   gnuplot (plots in bench/RESULTS.md)
PKGS="gcc make libpcre2-dev libcjson-dev libutf8proc-dev libmicrohttpd-dev libhwloc-dev
      libnuma-dev hwloc-nox openmpi-bin libopenmpi-dev chromium gnuplot-nox clang"
missing=""
for p in $PKGS; do
    # Installed, not merely known (a removed package keeps a dpkg record).
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
        missing="$missing $p"
done
# Node.js and npm run the server tests and llama.cpp (node-llama-cpp); any
# install will do (Debian's, or NodeSource's, which includes npm): only a
# missing one is installed from Debian. tools/node/ensure.sh adds Node.js 20
# for the tests where this one is older.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "installing:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
else
    echo "missing packages; run: sudo apt-get install -y$missing" >&2
    exit 1
fi
