/* Runs the end-to-end server tests (tests/server/server.test.mjs: the
 * official openai npm client against `ellm serve`) so that the test runner
 * counts their "N passed, N failed" line like any other test program.
 * `make test` installs the pinned npm packages first (npm ci). */
#include "harness.h"

#include <stdio.h>
#include <unistd.h>

int main(void) {
    if (!test_have_node_modules("tests/server", "openai")) return 1;
    fflush(stdout);
    execlp("node", "node", "tests/server/server.test.mjs", (char *)NULL);
    printf("SKIP: node is not installed (the server tests need Node.js)\n");
    printf("0 passed, 0 failed\n");
    return 0;
}
