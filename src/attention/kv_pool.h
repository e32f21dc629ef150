/* A pool of KV cache pages, taken as sequences grow and given back when they
 * shrink or end.
 *
 * A page holds page_blocks consecutive KV blocks of every (layer, KV head) of
 * one cache shape (see kv_cache.h), so every cache drawing from a pool must
 * have the same shape and element type. The pool reserves address space for
 * its ceiling (max_pages) up front but commits memory only when a page is
 * written; a page given back is returned to the OS (MADV_DONTNEED), so the
 * resident size follows the pages held -- plus, with kv_pool_keep_warm, a
 * bounded reserve of free pages kept committed (at most twice the bytes
 * asked for). Thread-safe. */
#ifndef ELLM_ATTENTION_KV_POOL_H
#define ELLM_ATTENTION_KV_POOL_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kv_pool kv_pool;

/* page_bytes is rounded up to the OS page size. ELLM_ERR_NOMEM when the
 * address space cannot be reserved. */
ellm_status kv_pool_init(size_t page_bytes, int64_t max_pages, kv_pool **out, ellm_error *err);
void kv_pool_free(kv_pool *pool);
/* Keeps `bytes` of free pages committed (whole pages; 0: none): a helper
 * thread faults cold pages in ahead of need while fewer are warm, and
 * given-back pages stay committed up to twice that, so pages that a request
 * gives back and the next takes again are not faulted in again. Takers get
 * warm pages first. */
ellm_status kv_pool_keep_warm(kv_pool *pool, size_t bytes, ellm_error *err);

/* A page (page_bytes, 64-byte aligned, contents undefined), or NULL when
 * max_pages are taken. */
void *kv_pool_take(kv_pool *pool);
/* Gives back a page from kv_pool_take. */
void kv_pool_give(kv_pool *pool, void *page);

size_t kv_pool_page_bytes(const kv_pool *pool);
int64_t kv_pool_pages_total(const kv_pool *pool);
int64_t kv_pool_pages_used(const kv_pool *pool);
/* Free pages whose memory is committed (the warm reserve). */
int64_t kv_pool_pages_warm(const kv_pool *pool);
/* Start and size of the reserved range (for NUMA placement). */
void *kv_pool_base(const kv_pool *pool, size_t *bytes);

#endif
