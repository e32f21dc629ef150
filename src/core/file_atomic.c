/* Atomic file replacement (see file_atomic.h). */
#include "core/file_atomic.h"
#include "core/status.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILE_ATOMIC_BUF (1 << 20)

static void release(file_atomic *af) {
    free(af->path);
    free(af->dir);
    free(af->tmp);
    memset(af, 0, sizeof *af);
}

/* The folder holding `path` ("." for a bare name), malloc'ed. */
static char *dir_of(const char *path) {
    char *dir = strdup(path);
    if (!dir) return NULL;
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    return dir;
}

/* Removes "<name of path>.tmp.<pid>" files that a process of this machine
 * left beside `path` when it died mid-write (before unnamed temporary files,
 * or where the file system has none): a state file of a long run is
 * gigabytes, and each crash would otherwise leave one. Only files whose
 * process no longer exists are removed, never this process's own. */
static void sweep_stale(const char *dir, const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    const size_t nb = strlen(base);
    DIR *d = opendir(dir);
    if (!d) return;
    const struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, base, nb) || strncmp(n + nb, ".tmp.", 5)) continue;
        const char *digits = n + nb + 5;
        size_t k = 0;
        while (isdigit((unsigned char)digits[k])) k++;
        if (k == 0 || k > 9 || digits[k]) continue;
        const long pid = strtol(digits, NULL, 10);
        if (pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
        unlinkat(dirfd(d), n, 0);
    }
    closedir(d);
}

ellm_status file_atomic_open(const char *path, file_atomic *af, ellm_error *err) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path);
    af->path = strdup(path);
    af->dir = dir_of(path);
    af->tmp = malloc(n + 32);
    if (!af->path || !af->dir || !af->tmp) {
        release(af);
        return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    }
    snprintf(af->tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    sweep_stale(af->dir, path);
    int fd = -1;
#ifdef O_TMPFILE
    /* An unnamed file in the target's folder: if the process dies before
     * the commit, the file system frees it; it gets a name only at commit
     * (through /proc/self/fd, so /proc must be there). */
    if (access("/proc/self/fd", X_OK) == 0) {
        fd = open(af->dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
        af->unnamed = fd >= 0;
    }
#endif
    if (fd < 0) fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(af->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) close(fd);
        ellm_status st = ellm_fail(err, ELLM_ERR_IO, "cannot create '%s': %s", af->tmp, strerror(e));
        if (fd >= 0 && !af->unnamed) unlink(af->tmp);
        release(af);
        return st;
    }
    setvbuf(af->f, NULL, _IOFBF, FILE_ATOMIC_BUF);
    return ELLM_OK;
}

void file_atomic_write(file_atomic *af, const void *data, size_t n) {
    if (!af->failed && n && fwrite(data, 1, n, af->f) != n) af->failed = errno ? errno : EIO;
}

void file_atomic_abort(file_atomic *af) {
    if (af->f) fclose(af->f);
    if (af->tmp && !af->unnamed) unlink(af->tmp);
    release(af);
}

/* fsync of a folder, so that a rename in it is durable. */
static int sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

ellm_status file_atomic_commit(file_atomic *af, ellm_error *err) {
    int e = af->failed;
    if (!e && fflush(af->f) != 0) e = errno;
    if (!e && fsync(fileno(af->f)) != 0) e = errno;
    int named = !af->unnamed;
    if (!e && af->unnamed) {
        /* The temporary name lives only from here to the rename. A file of
         * that name can only be a leftover of an earlier process with this
         * pid (linkat does not replace). */
        char fdpath[64];
        snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fileno(af->f));
        unlink(af->tmp);
        if (linkat(AT_FDCWD, fdpath, AT_FDCWD, af->tmp, AT_SYMLINK_FOLLOW) != 0) e = errno;
        else named = 1;
    }
    if (fclose(af->f) != 0 && !e) e = errno;
    af->f = NULL;
    if (!e && rename(af->tmp, af->path) != 0) e = errno;
    if (e) {
        ellm_status st = ellm_fail(err, ELLM_ERR_IO, "cannot write '%s': %s", af->path, strerror(e));
        if (named) unlink(af->tmp);
        release(af);
        return st;
    }
    /* The data is safe under the new name; a folder that cannot be synced
     * (some file systems refuse) only weakens durability across power loss. */
    sync_dir(af->dir);
    release(af);
    return ELLM_OK;
}
