/* KV cache: fixed-size blocks in pages taken from a page pool as the
 * sequence grows.
 *
 * A page holds PB consecutive blocks (kv_cache_params.page_blocks) of every (layer, kv head):
 * page j covers blocks [j * PB, (j + 1) * PB) and stores them ordered
 * (layer, kv head, block), so attention over a head streams PB adjacent blocks
 * before it moves to the next page (and prefetches across pages by pointer).
 * A block is
 *     K[head_dim][block_tokens] (channel-major) then V[block_tokens][head_dim]
 * in the cache's element type, its size rounded up to 64 bytes so every block
 * starts on a cache line. The page table maps page j to its memory:
 *     block b of (layer, head) = pages[b / PB] + ((layer * n_kv_head + head) * PB + b % PB) * block_stride.
 * Positions never move; pages are held for positions [0, len) (and one page
 * beyond, so a sequence that shrinks and regrows across a page boundary, as
 * speculative rollback does, does not give and take the same page each step). */
#include "attention/kv_cache.h"
#include "attention/kv_pool.h"
#include "attention/attention_kernel.h" /* attn_f32_to_f16_* */
#include "attention/kv_q8.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include "core/status.h"
#include "kernels/quant.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KV_ALIGN 64
/* Sanity limits so every index product fits comfortably in size_t and int. */
#define KV_MAX_HEAD_DIM 4096
#define KV_MAX_BLOCK_TOKENS 4096

struct kv_cache {
    kv_cache_params p;
    int len;             /* committed tokens */
    int n_blocks;        /* blocks per (layer, head): ceil(n_ctx / block_tokens) */
    size_t elt;          /* bytes per element: 2 (F16) or 4 (F32) */
    size_t half_bytes;   /* bytes of K (or V) of one block: block_tokens * head_dim * elt */
    size_t block_stride; /* 2 * half_bytes rounded up to KV_ALIGN */
    size_t bytes;        /* bytes of n_ctx tokens (all pages) */
    kv_pool *pool;       /* where pages come from */
    int owns_pool;       /* a private pool (params.pool was NULL) */
    int page_shift;      /* log2(blocks per page) */
    int n_pages;         /* page table size: ceil(n_blocks / PB) */
    int n_held;          /* pages[0, n_held) are held, the rest NULL */
    char **pages;        /* (n_pages) */
};

static void f32_to_f16_scalar(const float *src, uint16_t *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = ellm_f32_to_f16(src[i]);
}

/* Mirrors the F16C conversion at run time so every ISA stores the same bits. */
static void f32_to_f16(const float *src, uint16_t *dst, int n) {
    switch (ellm_cpu_isa()) {
    case ELLM_ISA_AVX512: attn_f32_to_f16_avx512(src, dst, n); break;
    case ELLM_ISA_AVX2: attn_f32_to_f16_avx2(src, dst, n); break;
    default: f32_to_f16_scalar(src, dst, n); break;
    }
}

/* Physical memory in bytes, or 0 if unknown. */
static size_t phys_mem_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 0;
    return (size_t)pages * (size_t)page;
}

static double gib(size_t bytes) { return (double)bytes / (double)(1u << 30); }

static int page_blocks_of(const kv_cache_params *p) { return p->page_blocks ? p->page_blocks : KV_PAGE_BLOCKS; }

int kv_cache_own_page_blocks(int n_ctx, int block_tokens) {
    return (int64_t)n_ctx >= 8 * (int64_t)KV_PAGE_BLOCKS_LONG * block_tokens ? KV_PAGE_BLOCKS_LONG : KV_PAGE_BLOCKS;
}

/* Validates `p` and allocates the arena (untouched: pages are committed on first
 * store). Returns ELLM_ERR_ARG for bad shapes or type, ELLM_ERR_NOMEM with the
 * size in GB when the arena cannot be had. */
ellm_status kv_cache_init(const kv_cache_params *p, kv_cache **out, ellm_error *err) {
    return kv_cache_init_pooled(p, NULL, 0, out, err);
}

ellm_status kv_cache_init_pooled(const kv_cache_params *p, kv_pool *pool, int64_t max_pages, kv_cache **out,
                                 ellm_error *err) {
    *out = NULL;
    if (p->n_layer <= 0 || p->n_kv_head <= 0 || p->head_dim <= 0 || p->n_ctx <= 0 ||
        p->block_tokens <= 0)
        return ellm_fail(err, ELLM_ERR_ARG,
                         "KV cache: n_layer=%d n_kv_head=%d head_dim=%d n_ctx=%d block_tokens=%d "
                         "must all be positive",
                         p->n_layer, p->n_kv_head, p->head_dim, p->n_ctx, p->block_tokens);
    if (p->block_tokens & (p->block_tokens - 1) || p->block_tokens > KV_MAX_BLOCK_TOKENS)
        return ellm_fail(err, ELLM_ERR_ARG,
                         "KV cache: block_tokens=%d must be a power of two <= %d",
                         p->block_tokens, KV_MAX_BLOCK_TOKENS);
    if (p->head_dim > KV_MAX_HEAD_DIM)
        return ellm_fail(err, ELLM_ERR_ARG, "KV cache: head_dim=%d exceeds %d", p->head_dim,
                         KV_MAX_HEAD_DIM);
    if (p->type != QTYPE_F16 && p->type != QTYPE_F32 && p->type != QTYPE_Q8_0)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "KV cache: element type %d unsupported (F16=%d, F32=%d or Q8_0=%d)", p->type,
                         QTYPE_F16, QTYPE_F32, QTYPE_Q8_0);
    if (p->type == QTYPE_Q8_0 && (p->head_dim % 32 || (long)p->head_dim * p->block_tokens > KV_Q8_MAX_ELEMS))
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "KV cache: Q8_0 needs head_dim a multiple of 32 and head_dim x block_tokens <= %d "
                         "(head_dim %d, block_tokens %d)",
                         KV_Q8_MAX_ELEMS, p->head_dim, p->block_tokens);

    const int pb = page_blocks_of(p);
    if (pb < 1 || pb > 1024 || (pb & (pb - 1)))
        return ellm_fail(err, ELLM_ERR_ARG, "KV cache: %d blocks per page is not a power of two in 1..1024", pb);
    size_t elt = p->type == QTYPE_F16 ? 2 : p->type == QTYPE_F32 ? 4 : 1;
    int n_blocks = (int)(((long)p->n_ctx + p->block_tokens - 1) / p->block_tokens);
    size_t half = p->type == QTYPE_Q8_0 ? kv_q8_half_bytes(p->head_dim, p->block_tokens)
                                        : (size_t)p->block_tokens * (size_t)p->head_dim * elt;
    size_t stride = (2 * half + KV_ALIGN - 1) & ~(size_t)(KV_ALIGN - 1);
    int n_pages = (n_blocks + pb - 1) / pb;
    size_t page_bytes, bytes;
    if (__builtin_mul_overflow((size_t)p->n_layer, (size_t)p->n_kv_head, &page_bytes) ||
        __builtin_mul_overflow(page_bytes, (size_t)pb * stride, &page_bytes) ||
        __builtin_mul_overflow(page_bytes, (size_t)n_pages, &bytes) || bytes > SIZE_MAX / 2)
        return ellm_fail(err, ELLM_ERR_NOMEM,
                         "KV cache: %d layers x %d heads x %d tokens x %d dims does not fit in "
                         "the address space",
                         p->n_layer, p->n_kv_head, p->n_ctx, p->head_dim);
    if (pool && kv_pool_page_bytes(pool) < kv_cache_page_bytes(p))
        return ellm_fail(err, ELLM_ERR_ARG, "KV cache: the shared pool's pages (%zu bytes) do not fit this cache's (%zu)",
                         kv_pool_page_bytes(pool), kv_cache_page_bytes(p));
    int64_t own_pages = pool ? 0 : max_pages > 0 ? max_pages : n_pages;
    /* Refuse a ceiling above what the machine has rather than let the OOM
     * killer strike mid-generation. */
    size_t phys = phys_mem_bytes();
    if (own_pages && phys && (double)own_pages * (double)page_bytes > (double)phys)
        return ellm_fail(err, ELLM_ERR_NOMEM,
                         "KV cache needs %.2f GB (%d tokens) but the machine has %.2f GB; "
                         "lower the context size",
                         gib((size_t)((double)own_pages * (double)page_bytes)), p->n_ctx, gib(phys));

    kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return ellm_fail(err, ELLM_ERR_NOMEM, "KV cache: out of memory");
    kv->pages = calloc((size_t)n_pages, sizeof *kv->pages);
    if (!kv->pages) {
        free(kv);
        return ellm_fail(err, ELLM_ERR_NOMEM, "KV cache: out of memory for a %d-page table", n_pages);
    }
    kv->p = *p;
    kv->n_blocks = n_blocks;
    kv->elt = elt;
    kv->half_bytes = half;
    kv->block_stride = stride;
    kv->bytes = bytes;
    kv->n_pages = n_pages;
    kv->page_shift = __builtin_ctz((unsigned)pb);
    kv->pool = pool;
    if (!pool) {
        ellm_status st = kv_pool_init(page_bytes, own_pages, &kv->pool, err);
        if (st) {
            free(kv->pages);
            free(kv);
            return st;
        }
        kv->owns_pool = 1;
    }
    *out = kv;
    return ELLM_OK;
}

size_t kv_cache_page_bytes(const kv_cache_params *p) {
    size_t elt = p->type == QTYPE_F16 ? 2 : p->type == QTYPE_F32 ? 4 : 1;
    size_t half = p->type == QTYPE_Q8_0 ? kv_q8_half_bytes(p->head_dim, p->block_tokens)
                                        : (size_t)p->block_tokens * (size_t)p->head_dim * elt;
    size_t stride = (2 * half + KV_ALIGN - 1) & ~(size_t)(KV_ALIGN - 1);
    return (size_t)p->n_layer * (size_t)p->n_kv_head * (size_t)page_blocks_of(p) * stride;
}

/* Gives back pages [keep, n_held). */
static void release_pages(kv_cache *kv, int keep) {
    for (int j = kv->n_held - 1; j >= keep; j--) {
        kv_pool_give(kv->pool, kv->pages[j]);
        kv->pages[j] = NULL;
    }
    if (keep < kv->n_held) kv->n_held = keep;
}

void kv_cache_free(kv_cache *kv) {
    if (!kv) return;
    release_pages(kv, 0);
    if (kv->owns_pool) kv_pool_free(kv->pool);
    free(kv->pages);
    free(kv);
}

static int page_tokens(const kv_cache *kv) { return (1 << kv->page_shift) * kv->p.block_tokens; }

ellm_status kv_cache_reserve(kv_cache *kv, int n_tokens, ellm_error *err) {
    if (n_tokens > kv->p.n_ctx)
        return ellm_fail(err, ELLM_ERR_CONTEXT_FULL, "KV cache: %d tokens exceed the context size %d", n_tokens,
                         kv->p.n_ctx);
    const int need = (int)(((long)n_tokens + page_tokens(kv) - 1) / page_tokens(kv));
    while (kv->n_held < need) {
        char *page = kv_pool_take(kv->pool);
        if (!page)
            return ellm_fail(err, ELLM_ERR_CONTEXT_FULL,
                             "KV cache: the memory pool is full (%lld pages of %d tokens, %.2f GB: --kv-cache-gb) "
                             "at %d tokens",
                             (long long)kv_pool_pages_total(kv->pool), page_tokens(kv),
                             (double)kv_pool_pages_total(kv->pool) * (double)kv_pool_page_bytes(kv->pool) / 1e9,
                             kv->n_held * page_tokens(kv));
        kv->pages[kv->n_held++] = page;
    }
    return ELLM_OK;
}

int kv_cache_room(const kv_cache *kv) {
    int64_t free_pages = kv_pool_pages_total(kv->pool) - kv_pool_pages_used(kv->pool);
    int64_t room = ((int64_t)kv->n_held + free_pages) * page_tokens(kv);
    if (room > kv->p.n_ctx) room = kv->p.n_ctx;
    return (int)(room - kv->len);
}

int kv_cache_capacity(const kv_cache *kv) {
    int64_t cap = kv_pool_pages_total(kv->pool) * page_tokens(kv);
    return cap < kv->p.n_ctx ? (int)cap : kv->p.n_ctx;
}

int kv_cache_pages_held(const kv_cache *kv) { return kv->n_held; }
int kv_cache_page_tokens(const kv_cache *kv) { return page_tokens(kv); }
kv_pool *kv_cache_pool(const kv_cache *kv) { return kv->pool; }

const kv_cache_params *kv_cache_get_params(const kv_cache *kv) { return &kv->p; }

size_t kv_cache_bytes(const kv_cache *kv) { return kv->bytes; }

size_t kv_cache_bytes_per_token(const kv_cache *kv) {
    if (kv->p.type == QTYPE_Q8_0) /* int8 and one F16 scale per 32 */
        return (size_t)kv->p.n_layer * (size_t)kv->p.n_kv_head * 2 * ((size_t)kv->p.head_dim + (size_t)kv->p.head_dim / 16);
    return (size_t)kv->p.n_layer * (size_t)kv->p.n_kv_head * 2 * (size_t)kv->p.head_dim * kv->elt;
}

int kv_cache_n_blocks(const kv_cache *kv) { return kv->n_blocks; }

int kv_cache_len(const kv_cache *kv) { return kv->len; }

/* Storage for [0, n) that must exist: the engine reserved it (and handled a
 * full pool) before the pass; direct users of a private pool (tests, tools)
 * get it here. */
static void ensure_pages(kv_cache *kv, int n) {
    if (n > kv->n_held * page_tokens(kv)) {
        ellm_status st = kv_cache_reserve(kv, n, NULL);
        ELLM_ASSERT(st == ELLM_OK);
    }
}

void kv_cache_set_len(kv_cache *kv, int n) {
    ELLM_ASSERT(n >= 0 && n <= kv->p.n_ctx);
    ensure_pages(kv, n);
    if (n < kv->len) { /* keep the page holding position n and one more; none when empty */
        int keep = n ? (int)(((long)n + page_tokens(kv) - 1) / page_tokens(kv)) + 1 : 0;
        release_pages(kv, keep);
    }
    kv->len = n;
}

static inline char *block_ptr(const kv_cache *kv, int layer, int head, int blk) {
    char *page = kv->pages[blk >> kv->page_shift];
    ELLM_ASSERT(page != NULL); /* kv_cache_reserve first */
    size_t idx = (((size_t)layer * (size_t)kv->p.n_kv_head + (size_t)head) << kv->page_shift) +
                 (size_t)(blk & ((1 << kv->page_shift) - 1));
    return page + idx * kv->block_stride;
}

/* Writes each token of every head into its block slot, converting to F16 when
 * the cache is F16: the value row as it is, the key into column `off` of the
 * channel-major K. */
void kv_cache_store(kv_cache *kv, int layer, int pos, int n, const float *k, const float *v) {
    const kv_cache_params *p = &kv->p;
    ELLM_ASSERT(layer >= 0 && layer < p->n_layer);
    ELLM_ASSERT(pos >= 0 && n >= 0 && pos <= p->n_ctx - n);
    const int hd = p->head_dim, bt = p->block_tokens;
    const size_t row_in = (size_t)p->n_kv_head * (size_t)hd; /* floats per input token */
    const size_t row_out = (size_t)hd * kv->elt;             /* bytes per stored V row */
    uint16_t k16[KV_MAX_HEAD_DIM];
    ensure_pages(kv, pos + n);
    for (int t = 0; t < n; t++) {
        int tp = pos + t, blk = tp / bt, off = tp % bt;
        for (int h = 0; h < p->n_kv_head; h++) {
            char *kd = block_ptr(kv, layer, h, blk);
            char *vd = kd + kv->half_bytes + (size_t)off * row_out;
            const float *ks = k + (size_t)t * row_in + (size_t)h * hd;
            const float *vs = v + (size_t)t * row_in + (size_t)h * hd;
            if (p->type == QTYPE_Q8_0) {
                /* key: column off of k[hd][bt], scales kd[hd / 32][bt]; value: row off */
                kv_q8_quantize_ref(ks, hd, (int8_t *)kd + off, (uint16_t *)(kd + (size_t)hd * bt) + off, bt, bt);
                char *vb = kd + kv->half_bytes;
                kv_q8_quantize_ref(vs, hd, (int8_t *)vb + (size_t)off * hd,
                                     (uint16_t *)(vb + (size_t)hd * bt) + (size_t)off * (hd / 32), 1, 1);
            } else if (p->type == QTYPE_F16) {
                f32_to_f16(ks, k16, hd);
                uint16_t *kt = (uint16_t *)kd + off;
                for (int c = 0; c < hd; c++) kt[(size_t)c * bt] = k16[c];
                f32_to_f16(vs, (uint16_t *)vd, hd);
            } else {
                float *kt = (float *)kd + off;
                for (int c = 0; c < hd; c++) kt[(size_t)c * bt] = ks[c];
                memcpy(vd, vs, row_out);
            }
        }
    }
}

void kv_cache_key(const kv_cache *kv, int layer, int head, int pos, float *out) {
    const int hd = kv->p.head_dim, bt = kv->p.block_tokens;
    ELLM_ASSERT(pos >= 0 && pos < kv->p.n_ctx);
    const char *kb = kv_cache_block_k(kv, layer, head, pos / bt);
    const size_t j = (size_t)(pos % bt);
    if (kv->p.type == QTYPE_Q8_0) {
        const uint16_t *kd = (const uint16_t *)(kb + (size_t)hd * bt);
        for (int c = 0; c < hd; c++)
            out[c] = ellm_f16_to_f32(kd[(size_t)(c / 32) * bt + j]) * (float)((const int8_t *)kb)[(size_t)c * bt + j];
    } else if (kv->p.type == QTYPE_F16)
        for (int c = 0; c < hd; c++) out[c] = ellm_f16_to_f32(((const uint16_t *)kb)[(size_t)c * bt + j]);
    else
        for (int c = 0; c < hd; c++) out[c] = ((const float *)kb)[(size_t)c * bt + j];
}

void kv_cache_value(const kv_cache *kv, int layer, int head, int pos, float *out) {
    const int hd = kv->p.head_dim, bt = kv->p.block_tokens;
    ELLM_ASSERT(pos >= 0 && pos < kv->p.n_ctx);
    if (kv->p.type == QTYPE_Q8_0) {
        const char *vh = kv_cache_block_v(kv, layer, head, pos / bt);
        const int8_t *q = (const int8_t *)vh + (size_t)(pos % bt) * hd;
        const uint16_t *d = (const uint16_t *)(vh + (size_t)hd * bt) + (size_t)(pos % bt) * (hd / 32);
        for (int c = 0; c < hd; c++) out[c] = ellm_f16_to_f32(d[c / 32]) * (float)q[c];
        return;
    }
    const char *vb = (const char *)kv_cache_block_v(kv, layer, head, pos / bt) + (size_t)(pos % bt) * hd * kv->elt;
    if (kv->p.type == QTYPE_F16)
        for (int c = 0; c < hd; c++) out[c] = ellm_f16_to_f32(((const uint16_t *)vb)[c]);
    else
        memcpy(out, vb, (size_t)hd * sizeof(float));
}

const void *kv_cache_block_k(const kv_cache *kv, int layer, int head, int blk) {
    ELLM_ASSERT(layer >= 0 && layer < kv->p.n_layer && head >= 0 && head < kv->p.n_kv_head &&
                blk >= 0 && blk < kv->n_blocks);
    return block_ptr(kv, layer, head, blk);
}

const void *kv_cache_block_v(const kv_cache *kv, int layer, int head, int blk) {
    return (const char *)kv_cache_block_k(kv, layer, head, blk) + kv->half_bytes;
}

size_t kv_cache_block_bytes(const kv_cache *kv) { return 2 * kv->half_bytes; }

void kv_cache_copy_prefix(kv_cache *dst, const kv_cache *src, int n) {
    const kv_cache_params *a = &dst->p, *b = &src->p;
    ELLM_ASSERT(a->n_layer == b->n_layer && a->n_kv_head == b->n_kv_head && a->head_dim == b->head_dim &&
                a->block_tokens == b->block_tokens && a->type == b->type && a->page_blocks == b->page_blocks &&
                n >= 0 && n <= src->len && n <= a->n_ctx &&
                (long)dst->n_held * kv_cache_page_tokens(dst) >= n);
    const int nb = (n + a->block_tokens - 1) / a->block_tokens;
    const size_t bytes = kv_cache_block_bytes(src);
    for (int l = 0; l < a->n_layer; l++)
        for (int h = 0; h < a->n_kv_head; h++)
            for (int blk = 0; blk < nb; blk++) memcpy(block_ptr(dst, l, h, blk), block_ptr(src, l, h, blk), bytes);
    kv_cache_set_len(dst, n);
}

void kv_cache_load_keys(const kv_cache *kv, int layer, int pos, int n, float *out) {
    const int hd = kv->p.head_dim, nkv = kv->p.n_kv_head;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nkv; h++) kv_cache_key(kv, layer, h, pos + t, out + ((size_t)t * nkv + h) * hd);
}

void *kv_cache_block_data(kv_cache *kv, int layer, int head, int blk) {
    long end = ((long)blk + 1) * kv->p.block_tokens;
    ensure_pages(kv, end < kv->p.n_ctx ? (int)end : kv->p.n_ctx);
    return (void *)kv_cache_block_k(kv, layer, head, blk);
}
