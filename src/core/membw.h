/* Memory read-bandwidth self-test: the yardstick for "fraction of bandwidth". */
#ifndef ELLM_CORE_MEMBW_H
#define ELLM_CORE_MEMBW_H

#include "core/threadpool.h"
#include <stddef.h>

/* Streams a `bytes` buffer (much larger than the caches) with all threads of
 * `pool`, `reps` times, and returns the best read rate in GB/s (1e9 bytes/s);
 * 0 if the buffer cannot be allocated. */
double membw_read_gbps(threadpool *pool, size_t bytes, int reps);

/* As membw_read_gbps over a caller's buffer (committed, 64-byte aligned,
 * placed where the caller wants it, e.g. on one NUMA node). Thread i of the
 * pool reads part i of threadpool_split(bytes, i, n, 4096). */
double membw_read_buffer_gbps(threadpool *pool, const void *buf, size_t bytes, int reps);

#endif
