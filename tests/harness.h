/* Minimal test harness: each tests/test_*.c is one program. CHECK counts a
 * passed or failed assertion; SKIP reports a part that could not run here
 * (say, an ISA this CPU lacks) as a line "SKIP: reason"; the program prints
 * "N passed, N failed" last and exits non-zero on any failure.
 * tests/run_tests.sh runs them all, shows every SKIP line and sums. */
#ifndef ELLM_TESTS_HARNESS_H
#define ELLM_TESTS_HARNESS_H

#include <dirent.h>
#include <math.h>
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

/* tests/data/<rel> in one of 8 rotating static buffers. */
static inline const char *test_data_path(const char *rel) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", test_data_dir(), rel);
    return p;
}

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

/* test_tmp_dir()/name in one of 8 rotating static buffers. */
static inline const char *test_tmp_path(const char *name) {
    static char buf[8][640];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", test_tmp_dir(), name);
    return p;
}

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
