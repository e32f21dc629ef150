/* Persistent thread pool: generation counter + spin-then-sleep workers. */
#include "core/threadpool.h"
#include "core/cpu.h"
#include "core/status.h"
#include "core/timer.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Workers spin this long after a run before sleeping: long enough to span the
 * gaps between the many small launches of a decode step, short enough not to
 * burn a core another process needs. */
#define SPIN_NS 200000ull
/* While spinning (a worker between launches, the caller waiting for the
 * workers), yield the CPU every this many pauses (about 10 us): a thread that
 * waits to run on this CPU (a server's HTTP threads, a client on the same
 * machine) then runs while this one has nothing to do, instead of
 * preempting it in the middle of its share of a launch, which the others
 * would wait for. With nothing else runnable, sched_yield returns at once. */
#define YIELD_SPINS 256u

struct threadpool;

typedef struct {
    struct threadpool *pool;
    int ith;
    pthread_t thread;
} worker;

struct threadpool {
    int n_threads;
    worker *workers;
    threadpool_fn fn;
    void *arg;
    atomic_uint generation; /* bumped for each run */
    atomic_int n_done;      /* workers finished with the current run */
    atomic_int stop;
    atomic_int n_sleeping;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
};

static void pin_to_cpu(pthread_t t, int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(t, sizeof set, &set);
}

static void *worker_main(void *p) {
    worker *w = p;
    threadpool *pool = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        unsigned spins = 0;
        uint64_t spin_start = 0;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_relaxed)) {
            if (++spins & 63) {
                __builtin_ia32_pause();
                continue;
            }
            uint64_t now = ellm_time_ns();
            if (!spin_start) spin_start = now;
            if (now - spin_start < SPIN_NS) {
                if ((spins & (YIELD_SPINS - 1)) == 0) sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool->mutex);
            atomic_fetch_add(&pool->n_sleeping, 1);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cond, &pool->mutex);
            atomic_fetch_sub(&pool->n_sleeping, 1);
            pthread_mutex_unlock(&pool->mutex);
            spins = 0;
            spin_start = 0;
        }
        if (atomic_load(&pool->stop)) break;
        seen = gen;
        pool->fn(pool->arg, w->ith, pool->n_threads);
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_release);
    }
    return NULL;
}

static ellm_status pool_init(int n_threads, int pin, const int *cpus, threadpool **out, ellm_error *err);

ellm_status threadpool_init(int n_threads, int pin, threadpool **out, ellm_error *err) {
    return pool_init(n_threads, pin, NULL, out, err);
}

ellm_status threadpool_init_cpus(int n_threads, const int *cpus, threadpool **out, ellm_error *err) {
    return pool_init(n_threads, 1, cpus, out, err);
}

static ellm_status pool_init(int n_threads, int pin, const int *cpus, threadpool **out, ellm_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return ellm_fail(err, ELLM_ERR_ARG, "thread count %d out of range 1..1024", n_threads);
    threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory for thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->cond, NULL);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) {
        free(pool);
        return ellm_fail(err, ELLM_ERR_NOMEM, "out of memory for thread pool");
    }
    if (pin) pin_to_cpu(pthread_self(), cpus ? cpus[0] : ellm_cpu_core_id(0));
    for (int i = 1; i < n_threads; i++) {
        worker *w = &pool->workers[i];
        w->pool = pool;
        w->ith = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pool->n_threads = i; /* workers 1..i-1 exist */
            threadpool_free(pool);
            return ellm_fail(err, ELLM_ERR_NOMEM, "cannot start compute thread %d", i);
        }
        if (pin) pin_to_cpu(w->thread, cpus ? cpus[i] : ellm_cpu_core_id(i));
    }
    *out = pool;
    return ELLM_OK;
}

/* Spins until *c >= target (acquire), yielding now and then (see
 * YIELD_SPINS). */
static void spin_until(atomic_int *c, int target) {
    for (unsigned spins = 1; atomic_load_explicit(c, memory_order_acquire) < target; spins++) {
        if (spins % YIELD_SPINS == 0) sched_yield();
        else __builtin_ia32_pause();
    }
}

void threadpool_run(threadpool *pool, threadpool_fn fn, void *arg) {
    if (pool->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->cond);
        pthread_mutex_unlock(&pool->mutex);
    }
    fn(arg, 0, pool->n_threads);
    spin_until(&pool->n_done, pool->n_threads - 1); /* the workers */
}

void threadpool_barrier(atomic_int *arrived, int nth, int k) {
    if (nth <= 1) return;
    atomic_fetch_add_explicit(arrived, 1, memory_order_acq_rel);
    spin_until(arrived, nth * k);
}

int threadpool_size(const threadpool *pool) { return pool->n_threads; }

void threadpool_free(threadpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cond);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->workers[i].thread, NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->cond);
    free(pool->workers);
    free(pool);
}
