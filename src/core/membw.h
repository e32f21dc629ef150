/* Memory read-bandwidth self-test: the yardstick for "fraction of bandwidth". */
#ifndef ELLM_CORE_MEMBW_H
#define ELLM_CORE_MEMBW_H

#include "core/threadpool.h"
#include <stddef.h>

/* Streams a `bytes` buffer (much larger than the caches) with all threads of
 * `pool`, `reps` times, and returns the best read rate in GB/s (1e9 bytes/s);
 * 0 if the buffer cannot be allocated. */
double membw_read_gbps(threadpool *pool, size_t bytes, int reps);

/* A committed buffer of about `*bytes` (rounded down to whole 4 KB pages,
 * written to *bytes) in huge pages where the kernel gives them, for repeated
 * membw_read_buffer_gbps calls; NULL if it cannot be allocated. Free it with
 * free(). */
void *membw_buffer_alloc(size_t *bytes);

/* As membw_read_gbps over a caller's buffer (committed, 64-byte aligned,
 * placed where the caller wants it, e.g. on one NUMA node). Thread i of the
 * pool reads part i of threadpool_split(bytes, i, n, 4096). */
double membw_read_buffer_gbps(threadpool *pool, const void *buf, size_t bytes, int reps);

#endif
