/* Minimal test harness: each tests/test_*.c is one program. CHECK counts a
 * passed or failed assertion; SKIP reports a part that could not run here
 * (say, an ISA this CPU lacks) as a line "SKIP: reason"; the program prints
 * "N passed, N failed" last and exits non-zero on any failure.
 * tests/run_tests.sh runs them all, shows every SKIP line and sums. */
#ifndef ELLM_TESTS_HARNESS_H
#define ELLM_TESTS_HARNESS_H

#include "ellm.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int t_passed, t_failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            t_passed++;                                                         \
        } else {                                                                \
            t_failed++;                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* Prints "SKIP: <reason>" on its own line, for tests/run_tests.sh to count. */
#define SKIP(...)                                                               \
    do {                                                                        \
        fflush(stderr);                                                         \
        printf("SKIP: ");                                                       \
        printf(__VA_ARGS__);                                                    \
        putchar('\n');                                                          \
        fflush(stdout);                                                         \
    } while (0)

/* Where test data lives (tests/data), overridable with ELLM_TEST_DATA. */
static inline const char *test_data_dir(void) {
    const char *d = getenv("ELLM_TEST_DATA");
    return d && *d ? d : "tests/data";
}

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", t_passed, t_failed);
    return t_failed ? 1 : 0;
}

/* dir/name in one of 8 rotating static buffers, so a call can use a few of
 * these paths at once. */
static inline const char *test_path_in(const char *dir, const char *name) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

/* tests/data/<rel>, as test_path_in. */
static inline const char *test_data_path(const char *rel) { return test_path_in(test_data_dir(), rel); }

/* Removes dir and everything below it (links are removed, not followed). */
static inline void test_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue; /* not ours: too long */
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            test_rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline char *test_tmp_root(void) {
    static char root[512];
    return root;
}

static inline void test_tmp_cleanup(void) {
    if (!getenv("ELLM_KEEP_TMP")) test_rm_tree(test_tmp_root());
}

/* This test program's own folder for temporary files, $TMPDIR (or /tmp)
 * /ellm-test-XXXXXX, made on first use and removed at exit unless
 * ELLM_KEEP_TMP is set: two test runs on one machine never share a path. */
static inline const char *test_tmp_dir(void) {
    char *root = test_tmp_root();
    if (!root[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(root, 512, "%s/ellm-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(root)) {
            perror("mkdtemp");
            exit(1);
        }
        atexit(test_tmp_cleanup);
    }
    return root;
}

/* test_tmp_dir()/name, as test_path_in. */
static inline const char *test_tmp_path(const char *name) { return test_path_in(test_tmp_dir(), name); }

/* Reads a whole file into a malloc'ed buffer (NUL-terminated); NULL on error. */
static inline char *test_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (size) *size = (size_t)n;
    }
    return buf;
}

/* xorshift64 (13, 7, 17): advances *state (nonzero) and returns it. Each test
 * keeps its own state, so its data does not depend on other tests. */
static inline uint64_t test_xorshift64(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* Uniform in [-1, 1) from 24 bits of the next xorshift64 state. */
static inline float test_frand(uint64_t *state) {
    return (float)((test_xorshift64(state) >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

/* Index of the largest of x[0, n) (the first on ties). */
static inline int test_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Loads the model at path (mp NULL: default parameters); on failure counts a
 * failed check naming the path and returns NULL. */
static inline ellm_model *test_load_model(const char *path, const ellm_model_params *mp) {
    ellm_model *m = NULL;
    ellm_error err = {0};
    if (ellm_model_load(path, mp, &m, &err) != ELLM_OK) {
        CHECK(0, "load %s: %s", path, err.msg);
        return NULL;
    }
    return m;
}

/* For the tests that drive Node packages (installed by `make test` with npm
 * ci): whether dir/node_modules/probe exists; if not, says so and prints the
 * summary line of one failed test, for main to return 1. */
static inline int test_have_node_modules(const char *dir, const char *probe) {
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, "%s/node_modules/%s", dir, probe);
    if (stat(p, &sb) == 0) return 1;
    printf("%s/node_modules is missing: run 'make test' (it runs npm ci there)\n", dir);
    printf("0 passed, 1 failed\n");
    return 0;
}

/* The ellm binary under test: $ELLM_BIN, default build/ellm. */
static inline const char *test_ellm_bin(void) {
    const char *b = getenv("ELLM_BIN");
    return b && *b ? b : "build/ellm";
}

/* Runs `cmd` through the shell, capturing its stdout (and whatever the command
 * itself redirects there) into out (cap bytes, NUL-terminated). Returns the
 * exit status, -1 if the process died from a signal, -2 if it did not start. */
static inline int test_shell(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -2;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFSIGNALED(st) ? -1 : WEXITSTATUS(st);
}

/* `ellm args` with stdout and stderr into out; as test_shell. */
static inline int test_ellm(const char *args, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", test_ellm_bin(), args);
    return test_shell(cmd, out, cap);
}

#endif
