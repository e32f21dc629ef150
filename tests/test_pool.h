/* One shared thread pool for attention tests that run the same call at several
 * thread counts. */
#ifndef ELLM_TEST_POOL_H
#define ELLM_TEST_POOL_H

#include "core/threadpool.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>

/* One pool alive at a time: idle pools' spinning workers would steal the
 * cores from the pool in use. */
static threadpool *g_pool;

/* Ends the pool so no worker spins while a reference runs single-threaded. */
static inline void pool_release(void) {
    threadpool_free(g_pool);
    g_pool = NULL;
}

/* A pool of n unpinned threads (replacing the previous one if its size differs). */
static inline threadpool *pool_of(int n) {
    if (g_pool && threadpool_size(g_pool) == n) return g_pool;
    pool_release();
    ellm_error err;
    if (threadpool_init(n, 0, &g_pool, &err) != ELLM_OK) {
        fprintf(stderr, "threadpool_init(%d): %s\n", n, err.msg);
        exit(1);
    }
    return g_pool;
}

#endif
