/* Atomic file replacement (see file_atomic.h). */
#include "core/file_atomic.h"
#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILE_ATOMIC_BUF (1 << 20)

static void release(file_atomic *af) {
    free(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
}

ellm_status file_atomic_open(const char *path, file_atomic *af, ellm_error *err) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path);
    af->path = strdup(path);
    af->tmp = malloc(n + 32);
    if (!af->path || !af->tmp) {
        release(af);
        return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory");
    }
    snprintf(af->tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(af->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || !(af->f = fdopen(fd, "wb"))) {
        int e = errno;
        if (fd >= 0) close(fd);
        ellm_status st = ellm_fail(err, ELLM_ERR_IO, "cannot create '%s': %s", af->tmp, strerror(e));
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
    if (af->tmp) unlink(af->tmp);
    release(af);
}

/* fsync of the folder holding `path`, so that the rename itself is durable. */
static int sync_dir(const char *path) {
    char *dir = strdup(path);
    if (!dir) return -1;
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

ellm_status file_atomic_commit(file_atomic *af, ellm_error *err) {
    int e = af->failed;
    if (!e && fflush(af->f) != 0) e = errno;
    if (!e && fsync(fileno(af->f)) != 0) e = errno;
    if (fclose(af->f) != 0 && !e) e = errno;
    af->f = NULL;
    if (!e && rename(af->tmp, af->path) != 0) e = errno;
    if (e) {
        ellm_status st = ellm_fail(err, ELLM_ERR_IO, "cannot write '%s': %s", af->path, strerror(e));
        unlink(af->tmp);
        release(af);
        return st;
    }
    /* The data is safe under the new name; a folder that cannot be synced
     * (some file systems refuse) only weakens durability across power loss. */
    sync_dir(af->path);
    release(af);
    return ELLM_OK;
}
