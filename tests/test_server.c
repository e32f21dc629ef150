/* Runs the end-to-end server tests (tests/server/server.test.mjs: the
 * official openai npm client against `ellm serve`) so that the test runner
 * counts their "N passed, N failed" line like any other test program.
 * `make test` installs the pinned npm packages first (npm ci). */
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int main(void) {
    struct stat st;
    if (stat("tests/server/node_modules/openai", &st) != 0) {
        printf("tests/server/node_modules is missing: run 'make test' (it runs npm ci there)\n");
        printf("0 passed, 1 failed\n");
        return 1;
    }
    fflush(stdout);
    execlp("node", "node", "tests/server/server.test.mjs", (char *)NULL);
    printf("SKIP: node is not installed (the server tests need Node.js)\n");
    printf("0 passed, 0 failed\n");
    return 0;
}
