/* A persistent pool of compute threads, pinned to physical cores.
 *
 * threadpool_run(pool, fn, arg) calls fn(arg, ith, nth) once on each of the nth
 * threads (the caller is thread 0) and returns when all have finished. Workers
 * spin briefly between runs so a decode step's many small launches cost little,
 * then sleep. A pool is driven by one caller thread at a time. */
#ifndef ELLM_CORE_THREADPOOL_H
#define ELLM_CORE_THREADPOOL_H

#include "ellm.h"

#include <stdatomic.h>

typedef struct threadpool threadpool;
typedef void (*threadpool_fn)(void *arg, int ith, int nth);

/* Starts n_threads - 1 workers (n_threads >= 1). With `pin`, thread i runs on
 * the i-th physical core. */
ellm_status threadpool_init(int n_threads, int pin, threadpool **out, ellm_error *err);
/* As threadpool_init, thread i (the caller is thread 0) pinned to OS CPU
 * cpus[i] (a placement plan's choice). */
ellm_status threadpool_init_cpus(int n_threads, const int *cpus, threadpool **out, ellm_error *err);
void threadpool_free(threadpool *pool);
int threadpool_size(const threadpool *pool);
void threadpool_run(threadpool *pool, threadpool_fn fn, void *arg);
/* A barrier inside a run: returns once all nth threads of the run have
 * called it for the k-th time (k = 1, 2, ... within the run). `arrived` is a
 * counter of the run's job, zero when the run starts. What a thread wrote
 * before the barrier is visible to every thread after it. */
void threadpool_barrier(atomic_int *arrived, int nth, int k);

/* Splits [0, n) into nth nearly equal parts, rounded to multiples of `align`;
 * writes part ith to [*begin, *end). */
static inline void threadpool_split(long n, int ith, int nth, long align, long *begin, long *end) {
    long units = (n + align - 1) / align;
    long per = units / nth, extra = units % nth;
    long b = ith * per + (ith < extra ? ith : extra);
    long e = b + per + (ith < extra ? 1 : 0);
    b *= align;
    e *= align;
    *begin = b < n ? b : n;
    *end = e < n ? e : n;
}

#endif
