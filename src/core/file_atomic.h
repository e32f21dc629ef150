/* Files replaced atomically: written to a temporary file in the same folder,
 * flushed to disk (fsync), renamed over the target and the folder synced, so
 * that a crash or SIGKILL at any moment leaves either the old complete file or
 * the new complete file, never a mix or a torn one.
 *
 * The temporary file is unnamed (O_TMPFILE) where the file system allows, so
 * a process killed mid-write leaves nothing behind; it is named
 * "<path>.tmp.<pid>" only from just before the rename, or for the whole write
 * where unnamed files are not available. Opening removes such files beside
 * the same target whose process no longer exists. */
#ifndef ELLM_CORE_FILE_ATOMIC_H
#define ELLM_CORE_FILE_ATOMIC_H

#include "ellm.h"

#include <stdio.h>

typedef struct {
    FILE *f;        /* write the contents here (fully buffered) */
    char *path;     /* the target */
    char *dir;      /* the folder holding it ("." for a bare name) */
    char *tmp;      /* "<path>.tmp.<pid>" */
    int unnamed;    /* f is an O_TMPFILE file, named tmp only at commit */
    int failed;     /* a write failed (set by file_atomic_write) */
} file_atomic;

/* Creates the temporary file. Returns ELLM_ERR_IO naming the path on failure. */
ellm_status file_atomic_open(const char *path, file_atomic *af, ellm_error *err);
/* fwrite that remembers a failure (checked once at commit). */
void file_atomic_write(file_atomic *af, const void *data, size_t n);
/* Flushes, fsyncs, renames over the target and fsyncs the folder; on any
 * failure removes the temporary file and returns ELLM_ERR_IO (the old target
 * is untouched). Frees af's resources either way. */
ellm_status file_atomic_commit(file_atomic *af, ellm_error *err);
/* Abandons the write: closes and removes the temporary file. */
void file_atomic_abort(file_atomic *af);

#endif
