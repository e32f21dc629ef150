/* KV cache in fixed blocks of tokens.
 *
 * For every layer and KV head, keys and values live in blocks of
 * `block_tokens` tokens: block j of (layer l, head h) holds the keys channel-major,
 * K[head_dim][block_tokens] (the block's values of one channel adjacent, so
 * that a SIMD register holds one channel of many keys and q.k needs no
 * horizontal sums), followed by the values token-major, V[block_tokens][head_dim],
 * in F16 (default) or F32. All blocks are
 * allocated up front (n_ctx tokens), so appending never allocates; a logical
 * block table maps (layer, head, block index) to storage so selection of blocks
 * (sparse attention) and truncation never move data. Truncation is O(1). */
#ifndef ELLM_ATTENTION_KV_CACHE_H
#define ELLM_ATTENTION_KV_CACHE_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_layer;
    int n_kv_head;
    int head_dim;
    int n_ctx;        /* capacity in tokens */
    int block_tokens; /* tokens per block, e.g. 32 */
    int type;         /* QTYPE_F16, QTYPE_F32 or QTYPE_Q8_0 (layout in attention_q8.c) */
} kv_cache_params;

typedef struct kv_cache kv_cache;

ellm_status kv_cache_init(const kv_cache_params *p, kv_cache **out, ellm_error *err);
void kv_cache_free(kv_cache *kv);

const kv_cache_params *kv_cache_get_params(const kv_cache *kv);
size_t kv_cache_bytes(const kv_cache *kv); /* bytes allocated */
/* Bytes of K+V stored per token (all layers and heads). */
size_t kv_cache_bytes_per_token(const kv_cache *kv);

/* Blocks per (layer, head): ceil(n_ctx / block_tokens). */
int kv_cache_n_blocks(const kv_cache *kv);

/* Tokens committed (positions [0, len)). */
int kv_cache_len(const kv_cache *kv);
/* Sets the committed length to n (n <= capacity). Shrinking is O(1):
 * truncation for rejected draft tokens. */
void kv_cache_set_len(kv_cache *kv, int n);

/* Writes K and V of n tokens at positions [pos, pos + n) of `layer`.
 * k and v are n rows of n_kv_head * head_dim floats (head-major inside a row).
 * Requires pos + n <= n_ctx. Does not change len: call kv_cache_set_len after
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

/* The key of position pos of (layer, head) as stored, as head_dim floats. */
void kv_cache_key(const kv_cache *kv, int layer, int head, int pos, float *out);
/* The keys of positions [pos, pos + n) of `layer` as stored (dequantized), as
 * n rows of n_kv_head * head_dim floats: what the sparse index summarizes. */
void kv_cache_load_keys(const kv_cache *kv, int layer, int pos, int n, float *out);

/* The value of position pos of (layer, head) as stored, as head_dim floats
 * (storing them back with kv_cache_store gives the same bits). */
void kv_cache_value(const kv_cache *kv, int layer, int head, int pos, float *out);

#endif
