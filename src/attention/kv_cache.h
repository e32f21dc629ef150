/* KV cache in fixed blocks of tokens.
 *
 * For every layer and KV head, keys and values live in blocks of
 * `block_tokens` tokens: block j of (layer l, head h) holds the keys channel-major,
 * K[head_dim][block_tokens] (the block's values of one channel adjacent, so
 * that a SIMD register holds one channel of many keys and q.k needs no
 * horizontal sums), followed by the values token-major, V[block_tokens][head_dim],
 * in F16 (default), F32 or Q8_0. Blocks live in pages of KV_PAGE_BLOCKS
 * blocks (of every layer and head) taken from a page pool (kv_pool.h) as the
 * sequence grows, with kv_cache_reserve before a pass stores past the pages
 * held; a page table maps (layer, head, block index) to storage, so selection
 * of blocks (sparse attention) and truncation never move data. Truncation
 * gives pages back to the pool. The pool is the cache's own (ceiling: n_ctx
 * tokens or max_pages) or shared by several caches of one shape (the server's
 * slots). */
#ifndef ELLM_ATTENTION_KV_CACHE_H
#define ELLM_ATTENTION_KV_CACHE_H

#include "ellm.h"
#include "attention/kv_pool.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_layer;
    int n_kv_head;
    int head_dim;
    int n_ctx;        /* capacity in tokens */
    int block_tokens; /* tokens per block, e.g. 32 */
    int type;         /* QTYPE_F16, QTYPE_F32 or QTYPE_Q8_0 (layout in attention_q8.c) */
    int page_blocks;  /* blocks per page, a power of two up to 1024 (0: KV_PAGE_BLOCKS) */
} kv_cache_params;

/* Blocks per page by default: 8 blocks of 16 tokens hold 128 tokens of every
 * layer and head (the grain in which a server's slots share one pool). */
#define KV_PAGE_BLOCKS 8
/* Blocks per page for a long context with a pool of its own
 * (kv_cache_own_page_blocks), equal to an attention part
 * (ATTENTION_PART_BLOCKS): dense attention then reads a (layer, head)'s
 * blocks in contiguous runs of 64 (256 KB at 64 dims in F16), and the KV
 * heads of a layer one after another as one run, instead of runs of 8
 * before jumping to the next page; the hardware prefetchers follow long
 * runs while each jump starts cold. bench_attention --read-pass at 16K on 2
 * threads, two alternated rounds, 8 -> 32 blocks per page: decode attention
 * 34.0-34.1 -> 42.3-43.4 GB/s, a plain read of the same blocks 40.0-40.2 ->
 * 53.6-54.4 GB/s; 32 -> 64 together with parts of 64 blocks: see
 * ATTENTION_PART_BLOCKS. The price is a coarser grain of KV memory: 1,024
 * tokens. */
#define KV_PAGE_BLOCKS_LONG 64
/* Blocks per page for a cache of n_ctx tokens in blocks of block_tokens whose
 * pool is its own: KV_PAGE_BLOCKS_LONG once the context holds 8 such pages
 * (8,192 tokens of 16), else KV_PAGE_BLOCKS. */
int kv_cache_own_page_blocks(int n_ctx, int block_tokens);

typedef struct kv_cache kv_cache;

/* A cache with a private pool of n_ctx tokens. */
ellm_status kv_cache_init(const kv_cache_params *p, kv_cache **out, ellm_error *err);
/* A cache whose pages come from `pool` (shared with other caches of this
 * shape and type; its pages at least kv_cache_page_bytes), or, if pool is
 * NULL, from a private pool of max_pages pages (0: n_ctx tokens). */
ellm_status kv_cache_init_pooled(const kv_cache_params *p, kv_pool *pool, int64_t max_pages, kv_cache **out,
                                 ellm_error *err);
void kv_cache_free(kv_cache *kv);

const kv_cache_params *kv_cache_get_params(const kv_cache *kv);
size_t kv_cache_bytes(const kv_cache *kv); /* bytes of n_ctx tokens (all pages held) */
/* Bytes of one page of a cache with these parameters (what a shared pool's pages must be). */
size_t kv_cache_page_bytes(const kv_cache_params *p);

/* Takes pages from the pool until positions [0, n_tokens) have storage.
 * ELLM_ERR_CONTEXT_FULL beyond n_ctx or when the pool is empty (pages taken
 * before the failure stay held). */
ellm_status kv_cache_reserve(kv_cache *kv, int n_tokens, ellm_error *err);
/* Tokens that can still be appended: up to n_ctx, within the pages held and
 * those the pool has free now. */
int kv_cache_room(const kv_cache *kv);
/* Most tokens this cache can ever hold: n_ctx, or less if its pool is smaller. */
int kv_cache_capacity(const kv_cache *kv);
int kv_cache_pages_held(const kv_cache *kv);
int kv_cache_page_tokens(const kv_cache *kv); /* page_blocks * block_tokens */
kv_pool *kv_cache_pool(const kv_cache *kv);
/* Bytes of K+V stored per token (all layers and heads). */
size_t kv_cache_bytes_per_token(const kv_cache *kv);

/* Blocks per (layer, head): ceil(n_ctx / block_tokens). */
int kv_cache_n_blocks(const kv_cache *kv);

/* Tokens committed (positions [0, len)). */
int kv_cache_len(const kv_cache *kv);
/* Sets the committed length to n (n <= capacity, within the pages held).
 * Shrinking is O(1) in the data (truncation for rejected draft tokens) and
 * gives back the pages past the one holding position n and one more (all of
 * them at 0). */
void kv_cache_set_len(kv_cache *kv, int n);

/* Writes K and V of n tokens at positions [pos, pos + n) of `layer`.
 * k and v are n rows of n_kv_head * head_dim floats (head-major inside a row).
 * Requires storage (kv_cache_reserve(pos + n)). Does not change len: call kv_cache_set_len after
 * all layers are written. */
void kv_cache_store(kv_cache *kv, int layer, int pos, int n, const float *k, const float *v);

/* Storage of block `blk` of (layer, head): K at the returned pointer
 * (channel-major, see above), V at kv_cache_block_v (token-major). Element
 * type per params.type. */
const void *kv_cache_block_k(const kv_cache *kv, int layer, int head, int blk);
const void *kv_cache_block_v(const kv_cache *kv, int layer, int head, int blk);

/* Bytes of one block as stored (K then V, no padding): what saving the cache
 * writes per block and restoring it reads back into kv_cache_block_data. */
size_t kv_cache_block_bytes(const kv_cache *kv);
/* Writable storage of block `blk` of (layer, head): block_bytes bytes. */
void *kv_cache_block_data(kv_cache *kv, int layer, int head, int blk);

/* Copies positions [0, n) of src (whole blocks, n <= kv_cache_len(src)) into
 * dst, a cache of the same parameters holding storage for them
 * (kv_cache_reserve(dst, n)), and sets dst's length to n: the same bits as
 * storing those keys and values in dst. */
void kv_cache_copy_prefix(kv_cache *dst, const kv_cache *src, int n);

/* The key of position pos of (layer, head) as stored, as head_dim floats. */
void kv_cache_key(const kv_cache *kv, int layer, int head, int pos, float *out);
/* The keys of positions [pos, pos + n) of `layer` as stored (dequantized), as
 * n rows of n_kv_head * head_dim floats: what the sparse index summarizes. */
void kv_cache_load_keys(const kv_cache *kv, int layer, int pos, int n, float *out);

/* The value of position pos of (layer, head) as stored, as head_dim floats
 * (storing them back with kv_cache_store gives the same bits). */
void kv_cache_value(const kv_cache *kv, int layer, int head, int pos, float *out);

#endif
