/* A FILE written from a background thread through two large buffers, so a
 * producer (say, `ellm convert` quantizing the next rows) keeps computing
 * while the kernel copies the previous buffer into the page cache.
 *
 * async_writer_put appends bytes to the current buffer; a full buffer goes to
 * the thread, which fwrite()s it while the other one fills. A write failure is
 * remembered and returned by the next put or by close, as an errno value.
 * Bytes reach `fp` in the order they were put. `fp` is flushed at open; a
 * regular file is then written through its descriptor (with O_DIRECT where
 * the file system allows it), so its FILE must not be written until close;
 * it is not closed here. */
#ifndef ELLM_CORE_ASYNC_WRITER_H
#define ELLM_CORE_ASYNC_WRITER_H

#include <stddef.h>
#include <stdio.h>

typedef struct async_writer async_writer;

/* NULL when the buffers or the thread cannot be had: write synchronously. */
async_writer *async_writer_open(FILE *fp, size_t buf_bytes);
/* 0, or the errno of a failed earlier write (EIO when it set none). */
int async_writer_put(async_writer *a, const void *p, size_t n);
/* Writes what is buffered, stops the thread and frees `a`; 0 or the errno
 * of the first failure. */
int async_writer_close(async_writer *a);

#endif
