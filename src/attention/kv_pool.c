/* KV page pool: one reserved range of max_pages pages and a stack of free
 * page indices (lowest first, so a pool that never fills touches only the
 * start of its range). */
#include "attention/kv_pool.h"
#include "core/status.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define KV_POOL_HUGE ((size_t)2 << 20)

struct kv_pool {
    size_t page_bytes;
    int64_t max_pages;
    char *base;          /* page i at base + i * page_bytes (2 MB aligned) */
    void *map;           /* the mapping: base rounded down */
    size_t map_bytes;
    int64_t *free_stack; /* (max_pages) free page indices; top at n_free - 1 */
    int64_t n_free;
    pthread_mutex_t mu;
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
    /* Address space only (MAP_NORESERVE): memory is committed as pages are
     * written. 2 MB alignment lets the kernel use huge pages, which spares TLB
     * misses when attention streams gigabytes per token. */
    p->map_bytes = bytes + KV_POOL_HUGE;
    p->map = mmap(NULL, p->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!p->free_stack || p->map == MAP_FAILED) {
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
    *out = p;
    return ELLM_OK;
}

void kv_pool_free(kv_pool *p) {
    if (!p) return;
    if (p->map) {
        munmap(p->map, p->map_bytes);
        pthread_mutex_destroy(&p->mu);
    }
    free(p->free_stack);
    free(p);
}

void *kv_pool_take(kv_pool *p) {
    pthread_mutex_lock(&p->mu);
    char *page = p->n_free > 0 ? p->base + (size_t)p->free_stack[--p->n_free] * p->page_bytes : NULL;
    pthread_mutex_unlock(&p->mu);
    return page;
}

void kv_pool_give(kv_pool *p, void *page) {
    if (!page) return;
    size_t off = (size_t)((char *)page - p->base);
    ELLM_ASSERT(off % p->page_bytes == 0 && off / p->page_bytes < (size_t)p->max_pages);
    madvise(page, p->page_bytes, MADV_DONTNEED); /* the memory goes back to the OS */
    pthread_mutex_lock(&p->mu);
    ELLM_ASSERT(p->n_free < p->max_pages);
    p->free_stack[p->n_free++] = (int64_t)(off / p->page_bytes);
    pthread_mutex_unlock(&p->mu);
}

size_t kv_pool_page_bytes(const kv_pool *p) { return p->page_bytes; }
int64_t kv_pool_pages_total(const kv_pool *p) { return p->max_pages; }

int64_t kv_pool_pages_used(const kv_pool *p) {
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    int64_t n = p->max_pages - p->n_free;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return n;
}

void *kv_pool_base(const kv_pool *p, size_t *bytes) {
    *bytes = p->page_bytes * (size_t)p->max_pages;
    return p->base;
}
