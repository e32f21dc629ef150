/* KV page pool: one reserved range of max_pages pages and two stacks of free
 * page indices: warm pages (memory committed: given back recently, or
 * touched ahead by the helper thread) and cold ones (never written, or
 * returned to the OS). Cold pages are taken lowest first, so a pool that
 * never fills touches only the start of its range.
 *
 * Why warm pages: the first write to a cold page faults its memory in (2 MB
 * huge pages with zeroing, possibly compaction), measured at 1-16 ms per
 * 2.9 MB page on a loaded VM. In a server that happens inside an engine
 * step, which every running stream waits for. A pool with a warm reserve
 * (kv_pool_keep_warm) has a helper thread fault cold pages in ahead of need
 * (at idle priority, in the time the engine leaves a core free),
 * and keeps given-back pages committed up to twice the reserve, so a sequence
 * that grows or a new prompt takes pages whose memory is already there, and
 * pages that go and come back with the requests stay committed. */
#include "attention/kv_pool.h"
#include "core/status.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define KV_POOL_HUGE ((size_t)2 << 20)
/* Given-back pages stay committed up to this many times the warm reserve
 * (kv_pool_give says why); the helper refills only up to the reserve. */
#define KEEP_GIVEN_BACK 2

struct kv_pool {
    size_t page_bytes;
    int64_t max_pages;
    char *base;          /* page i at base + i * page_bytes (2 MB aligned) */
    void *map;           /* the mapping: base rounded down */
    size_t map_bytes;
    int64_t *free_stack; /* (max_pages) cold free page indices; top at n_free - 1 */
    int64_t n_free;
    int64_t *warm_stack; /* (max_pages) warm free page indices; top at n_warm - 1 */
    int64_t n_warm;
    int64_t warm_target; /* warm pages the helper keeps ready (0: no helper) */
    int64_t n_warming;   /* pages the helper is touching (free, in neither stack) */
    int stop, helper_started;
    pthread_t helper;
    pthread_mutex_t mu;
    pthread_cond_t cv_helper; /* the helper waits for work */
    pthread_cond_t cv_warmed; /* a taker waits for a page the helper holds */
};

ellm_status kv_pool_init(size_t page_bytes, int64_t max_pages, kv_pool **out, ellm_error *err) {
    *out = NULL;
    long os_page = sysconf(_SC_PAGESIZE);
    if (os_page <= 0) os_page = 4096;
    if (page_bytes == 0 || max_pages < 1)
        return ellm_fail(err, ELLM_ERR_ARG, "KV pool: %zu-byte pages x %lld must both be positive", page_bytes,
                         (long long)max_pages);
    page_bytes = (page_bytes + (size_t)os_page - 1) / (size_t)os_page * (size_t)os_page;
    size_t bytes;
    if (__builtin_mul_overflow(page_bytes, (size_t)max_pages, &bytes) || bytes > SIZE_MAX / 4)
        return ellm_fail(err, ELLM_ERR_NOMEM, "KV pool: %lld pages of %zu bytes do not fit in the address space",
                         (long long)max_pages, page_bytes);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p) return ellm_fail(err, ELLM_ERR_NOMEM, "KV pool: out of memory");
    p->free_stack = malloc((size_t)max_pages * sizeof *p->free_stack);
    p->warm_stack = malloc((size_t)max_pages * sizeof *p->warm_stack);
    /* Address space only (MAP_NORESERVE): memory is committed as pages are
     * written. 2 MB alignment lets the kernel use huge pages, which spares TLB
     * misses when attention streams gigabytes per token. */
    p->map_bytes = bytes + KV_POOL_HUGE;
    p->map = mmap(NULL, p->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!p->free_stack || !p->warm_stack || p->map == MAP_FAILED) {
        if (p->map == MAP_FAILED) p->map = NULL;
        kv_pool_free(p);
        return ellm_fail(err, ELLM_ERR_NOMEM, "KV pool: cannot reserve %.2f GB", (double)bytes / 1e9);
    }
    p->base = (char *)(((uintptr_t)p->map + KV_POOL_HUGE - 1) & ~(uintptr_t)(KV_POOL_HUGE - 1));
#ifdef MADV_HUGEPAGE
    if (bytes >= KV_POOL_HUGE) madvise(p->base, bytes & ~(KV_POOL_HUGE - 1), MADV_HUGEPAGE);
#endif
    p->page_bytes = page_bytes;
    p->max_pages = max_pages;
    for (int64_t i = 0; i < max_pages; i++) p->free_stack[i] = max_pages - 1 - i;
    p->n_free = max_pages;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_helper, NULL);
    pthread_cond_init(&p->cv_warmed, NULL);
    *out = p;
    return ELLM_OK;
}

void kv_pool_free(kv_pool *p) {
    if (!p) return;
    if (p->helper_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_signal(&p->cv_helper);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->helper, NULL);
    }
    if (p->map) {
        munmap(p->map, p->map_bytes);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv_helper);
        pthread_cond_destroy(&p->cv_warmed);
    }
    free(p->free_stack);
    free(p->warm_stack);
    free(p);
}

/* Writes a zero into every OS page of `page` (a cold page reads as zeros, so
 * its contents do not change): the kernel commits its memory now. */
static void touch(char *page, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 4096) ((volatile char *)page)[off] = 0;
}

/* The helper: while fewer than warm_target pages are warm and cold ones are
 * left, takes the lowest cold page, touches it outside the lock and makes it
 * warm. */
static void *helper_main(void *arg) {
    kv_pool *p = arg;
    /* The helper must not take a core from the threads that run the engine's
     * steps: with as many of them as cores, a step waits at every barrier for
     * a thread the helper displaced (a new 512-token prompt in a server of 8
     * streams made the helper fault in ~5 pages, 27 ms of CPU, inside one
     * 17 ms step, which then took 50 ms). SCHED_IDLE runs it only when a core
     * is otherwise idle; where that is refused, the lowest nice value. */
    struct sched_param idle = {0};
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) != 0) (void)setpriority(PRIO_PROCESS, 0, 19);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && (p->n_warm + p->n_warming >= p->warm_target || p->n_free == 0))
            pthread_cond_wait(&p->cv_helper, &p->mu);
        if (p->stop) break;
        int64_t idx = p->free_stack[--p->n_free];
        p->n_warming++;
        pthread_mutex_unlock(&p->mu);
        touch(p->base + (size_t)idx * p->page_bytes, p->page_bytes);
        pthread_mutex_lock(&p->mu);
        p->n_warming--;
        p->warm_stack[p->n_warm++] = idx;
        pthread_cond_broadcast(&p->cv_warmed);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ellm_status kv_pool_keep_warm(kv_pool *p, size_t bytes, ellm_error *err) {
    int64_t pages = (int64_t)(bytes / p->page_bytes);
    if (pages > p->max_pages) pages = p->max_pages;
    pthread_mutex_lock(&p->mu);
    p->warm_target = pages;
    const int start = pages > 0 && !p->helper_started;
    pthread_cond_signal(&p->cv_helper);
    pthread_mutex_unlock(&p->mu);
    if (!start) return ELLM_OK;
    if (pthread_create(&p->helper, NULL, helper_main, p) != 0) {
        pthread_mutex_lock(&p->mu);
        p->warm_target = 0;
        pthread_mutex_unlock(&p->mu);
        return ellm_fail(err, ELLM_ERR_NOMEM, "KV pool: cannot start the page helper thread");
    }
    p->helper_started = 1;
    return ELLM_OK;
}

void *kv_pool_take(kv_pool *p) {
    pthread_mutex_lock(&p->mu);
    /* the last free pages may be in the helper's hands for a moment */
    while (p->n_warm == 0 && p->n_free == 0 && p->n_warming > 0) pthread_cond_wait(&p->cv_warmed, &p->mu);
    char *page = NULL;
    if (p->n_warm > 0) page = p->base + (size_t)p->warm_stack[--p->n_warm] * p->page_bytes;
    else if (p->n_free > 0) page = p->base + (size_t)p->free_stack[--p->n_free] * p->page_bytes;
    if (p->warm_target > 0 && p->n_warm + p->n_warming < p->warm_target && p->n_free > 0)
        pthread_cond_signal(&p->cv_helper);
    pthread_mutex_unlock(&p->mu);
    return page;
}

void kv_pool_give(kv_pool *p, void *page) {
    if (!page) return;
    size_t off = (size_t)((char *)page - p->base);
    ELLM_ASSERT(off % p->page_bytes == 0 && off / p->page_bytes < (size_t)p->max_pages);
    const int64_t idx = (int64_t)(off / p->page_bytes);
    pthread_mutex_lock(&p->mu);
    ELLM_ASSERT(p->n_free + p->n_warm + p->n_warming < p->max_pages);
    /* Kept committed for the next taker up to KEEP_GIVEN_BACK reserves: a sequence
     * that ends gives back its pages, and the next one takes as many again;
     * returning them to the OS only to fault the same number in again (the
     * helper refilling the reserve meanwhile) put a page fault and a TLB
     * shootdown inside the engine's steps for every page of every request. */
    if (p->n_warm + p->n_warming < KEEP_GIVEN_BACK * p->warm_target) {
        p->warm_stack[p->n_warm++] = idx;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    pthread_mutex_unlock(&p->mu);
    madvise(page, p->page_bytes, MADV_DONTNEED); /* the memory goes back to the OS */
    pthread_mutex_lock(&p->mu);
    p->free_stack[p->n_free++] = idx;
    pthread_mutex_unlock(&p->mu);
}

size_t kv_pool_page_bytes(const kv_pool *p) { return p->page_bytes; }
int64_t kv_pool_pages_total(const kv_pool *p) { return p->max_pages; }

int64_t kv_pool_pages_used(const kv_pool *p) {
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    int64_t n = p->max_pages - p->n_free - p->n_warm - p->n_warming;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return n;
}

void *kv_pool_base(const kv_pool *p, size_t *bytes) {
    *bytes = p->page_bytes * (size_t)p->max_pages;
    return p->base;
}

int64_t kv_pool_pages_warm(const kv_pool *p) {
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    int64_t n = p->n_warm;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return n;
}
