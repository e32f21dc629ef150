/* core/file_atomic: the target holds the old bytes until the commit and the
 * new ones after it; an abort keeps the old ones; a process killed before its
 * commit leaves no temporary file behind (at once where the file system has
 * unnamed files, else from the next write of the same target on); leftovers
 * of dead processes beside the target are removed, and nothing else is. */
#include "core/file_atomic.h"

#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[1024];

static const char *in_dir(const char *name) { return test_path_in(g_dir, name); }

/* Entries of g_dir whose name starts with `prefix`. */
static int count_prefixed(const char *prefix) {
    DIR *d = opendir(g_dir);
    if (!d) return -1;
    int n = 0;
    const struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

static int file_equals(const char *path, const char *want) {
    size_t n = 0;
    char *got = test_read_file(path, &n);
    int same = got && n == strlen(want) && !memcmp(got, want, n);
    free(got);
    return same;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Replaces `path` with `text` through file_atomic. */
static int write_atomic(const char *path, const char *text) {
    file_atomic af;
    ellm_error err = {0};
    if (file_atomic_open(path, &af, &err) != ELLM_OK) return -1;
    file_atomic_write(&af, text, strlen(text));
    return file_atomic_commit(&af, &err) == ELLM_OK ? 0 : -1;
}

/* A pid that no process has: a child's, after it was reaped. */
static pid_t dead_pid(void) {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

static int have_unnamed_files(void) {
#ifdef O_TMPFILE
    int fd = open(g_dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
    return fd >= 0 && access("/proc/self/fd", X_OK) == 0;
#else
    return 0;
#endif
}

static void test_replace_and_abort(void) {
    const char *target = in_dir("state.bin");
    put(target, "old contents");
    file_atomic af;
    ellm_error err = {0};
    CHECK(file_atomic_open(target, &af, &err) == ELLM_OK, "open: %s", err.msg);
    file_atomic_write(&af, "new ", 4);
    file_atomic_write(&af, "contents", 8);
    fflush(af.f);
    CHECK(file_equals(target, "old contents"), "the target changed before the commit");
    CHECK(file_atomic_commit(&af, &err) == ELLM_OK, "commit: %s", err.msg);
    CHECK(file_equals(target, "new contents"), "the target after the commit");
    CHECK(count_prefixed("state.bin.tmp.") == 0, "a temporary file is left after a commit");

    CHECK(file_atomic_open(target, &af, &err) == ELLM_OK, "open: %s", err.msg);
    file_atomic_write(&af, "abandoned", 9);
    file_atomic_abort(&af);
    CHECK(file_equals(target, "new contents"), "an abort changed the target");
    CHECK(count_prefixed("state.bin.tmp.") == 0, "a temporary file is left after an abort");

    /* a target in the current folder (a bare name) */
    char cwd[1024];
    if (getcwd(cwd, sizeof cwd) && chdir(g_dir) == 0) {
        CHECK(write_atomic("bare.bin", "bare") == 0, "commit of a bare name");
        CHECK(chdir(cwd) == 0, "chdir back");
        CHECK(file_equals(in_dir("bare.bin"), "bare"), "the bare-named target");
    }
}

/* A child writes 2 MB to the target and is killed before its commit. */
static void test_killed_writer(void) {
    const char *target = in_dir("killed.bin");
    put(target, "before");
    int ready[2];
    CHECK(pipe(ready) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        file_atomic af;
        ellm_error err = {0};
        if (file_atomic_open(target, &af, &err) != ELLM_OK) _exit(1);
        static char block[1 << 16];
        memset(block, 'x', sizeof block);
        for (int i = 0; i < 32; i++) file_atomic_write(&af, block, sizeof block);
        fflush(af.f);
        if (write(ready[1], "k", 1) != 1) _exit(1);
        for (;;) pause(); /* killed here, mid-write */
    }
    close(ready[1]);
    char c = 0;
    CHECK(read(ready[0], &c, 1) == 1 && c == 'k', "the writer did not start");
    close(ready[0]);
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the writer was not killed");
    CHECK(file_equals(target, "before"), "a killed writer changed the target");
    const int unnamed = have_unnamed_files();
    printf("unnamed temporary files in %s: %s\n", g_dir, unnamed ? "yes" : "no");
    if (unnamed) CHECK(count_prefixed("killed.bin.tmp.") == 0, "a killed writer left a temporary file");
    /* the next write of the target removes any leftover of the dead writer */
    CHECK(write_atomic(target, "after") == 0, "commit after the killed writer");
    CHECK(file_equals(target, "after"), "the target after the next write");
    CHECK(count_prefixed("killed.bin.tmp.") == 0, "a leftover of the killed writer is still there");
}

/* Leftovers of dead processes go; a live process's file, other targets'
 * files and names that only look alike stay. */
static void test_sweep(void) {
    char name[256];
    const char *target = in_dir("sweep.bin");
    const pid_t dead = dead_pid();
    snprintf(name, sizeof name, "sweep.bin.tmp.%ld", (long)dead);
    put(in_dir(name), "leftover of a dead process");
    snprintf(name, sizeof name, "sweep.bin.tmp.%ld", (long)getppid());
    put(in_dir(name), "a live process writing");
    snprintf(name, sizeof name, "other.bin.tmp.%ld", (long)dead);
    put(in_dir(name), "another target's leftover");
    put(in_dir("sweep.bin.tmp.12x"), "not a pid");
    put(in_dir("sweep.bin.tmp."), "no pid");
    put(in_dir("sweep.bin.tmp.1234567890123"), "too long for a pid");
    put(in_dir("sweep.bin.bak"), "a backup");
    CHECK(write_atomic(target, "swept") == 0, "commit");
    CHECK(file_equals(target, "swept"), "the target");
    snprintf(name, sizeof name, "sweep.bin.tmp.%ld", (long)dead);
    CHECK(access(in_dir(name), F_OK) != 0, "the dead process's leftover %s is still there", name);
    snprintf(name, sizeof name, "sweep.bin.tmp.%ld", (long)getppid());
    CHECK(access(in_dir(name), F_OK) == 0, "the live process's file %s was removed", name);
    snprintf(name, sizeof name, "other.bin.tmp.%ld", (long)dead);
    CHECK(access(in_dir(name), F_OK) == 0, "another target's file %s was removed", name);
    CHECK(access(in_dir("sweep.bin.tmp.12x"), F_OK) == 0, "sweep.bin.tmp.12x was removed");
    CHECK(access(in_dir("sweep.bin.tmp."), F_OK) == 0, "sweep.bin.tmp. was removed");
    CHECK(access(in_dir("sweep.bin.tmp.1234567890123"), F_OK) == 0, "sweep.bin.tmp.1234567890123 was removed");
    CHECK(access(in_dir("sweep.bin.bak"), F_OK) == 0, "sweep.bin.bak was removed");
}

/* A folder that does not exist: a clear error naming the file. */
static void test_missing_folder(void) {
    file_atomic af;
    ellm_error err = {0};
    const char *target = in_dir("no-such-folder/state.bin");
    CHECK(file_atomic_open(target, &af, &err) == ELLM_ERR_IO && strstr(err.msg, "no-such-folder/state.bin"),
          "error: %s", err.msg);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s", test_tmp_path("file_atomic"));
    test_rm_tree(g_dir);
    CHECK(mkdir(g_dir, 0755) == 0, "mkdir %s", g_dir);
    test_replace_and_abort();
    test_killed_writer();
    test_sweep();
    test_missing_folder();
    test_rm_tree(g_dir);
    return test_finish();
}
