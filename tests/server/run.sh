#!/bin/sh
# End-to-end server tests in Node (tests/server/server.test.mjs), run by
# tests/run_tests.sh as build/tests/test_server. `make test` installs the
# pinned npm packages first (npm ci).
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed (the server tests need Node.js and npm)"
    echo "0 passed, 0 failed"
    exit 0
fi
if [ ! -d tests/server/node_modules/openai ]; then
    echo "tests/server/node_modules is missing: run 'make test' (it runs npm ci there)"
    echo "0 passed, 1 failed"
    exit 1
fi
exec node tests/server/server.test.mjs
