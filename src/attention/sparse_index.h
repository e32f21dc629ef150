/* Query-aware hierarchical sparse KV index (Quest-style block summaries).
 *
 * For every (layer, KV head) and every KV-cache block of block_tokens tokens
 * the index keeps the per-channel minimum lo[c] and maximum hi[c] of the
 * block's post-RoPE keys, so that for any query q and any key k of the block
 *     q . k  <=  ub(q, block) = sum_c max(q_c * lo_c, q_c * hi_c).
 * Super-blocks of superblock_blocks consecutive blocks keep the min/max of
 * their blocks, hence a bound >= each of their blocks' bounds.
 *
 * Summaries are IEEE half, rounded outward (lo down, hi up): the bound stays
 * an upper bound, exact for an F16 cache (whose keys are halves already), one
 * half ulp looser for an F32 cache, and the bytes read per selection -- the
 * cost that grows with context -- are halved against F32. A block summary is
 * 4 * head_dim bytes (256 B at head_dim 64; 1/16 of the block's F16 keys at
 * 32 tokens). Summaries describe the keys as the cache stores them (rounded to
 * half first for an F16 cache), so they can be rebuilt from the cache after a
 * truncation and stay identical to a fresh build.
 *
 * Selection for one KV head and one step scores every super-block of the
 * candidate range, then expands super-blocks in decreasing bound order,
 * collecting their blocks' bounds; it stops when k blocks already reach the
 * next super-block's bound (from then on the result equals an exhaustive scan
 * of all blocks) or after max(4, ceil(expand * k / superblock_blocks))
 * super-blocks, k being the number of blocks wanted. Work and bytes read are
 * O(n_superblocks + expanded * superblock_blocks), not O(n_blocks). With
 * i.i.d. random keys (no super-block stands out) at 32K tokens, blocks of 32,
 * budget 2048: 48 KB of summaries per selection, 19% of a flat scan; at 128K
 * 96 KB, 9%.
 *
 * Threads: select calls on different (layer, kv_head) pairs may run
 * concurrently (each pair has its own scratch), and with appends to other
 * layers; an append excludes every other call on its layer, a truncate every
 * other call. Nothing allocates after init. */
#ifndef ELLM_ATTENTION_SPARSE_INDEX_H
#define ELLM_ATTENTION_SPARSE_INDEX_H

#include "attention/kv_cache.h"
#include "ellm.h"

#include <stdint.h>

/* Largest head_dim the index supports (query rows are prepared on the stack). */
#define SPARSE_MAX_HEAD_DIM 256

typedef struct {
    int n_layer;
    int n_kv_head;
    int head_dim;          /* <= SPARSE_MAX_HEAD_DIM */
    int n_ctx;             /* capacity in tokens, as the KV cache */
    int block_tokens;      /* as the KV cache */
    int superblock_blocks; /* blocks per super-block, a multiple of 16 (<= 1024); 0: 16 */
    int key_type;          /* the KV cache's element type, QTYPE_F32 (0) or QTYPE_F16 */
    float expand;          /* super-blocks expanded at most per selection:
                              max(4, ceil(expand * blocks wanted / superblock_blocks)); 0: 2 */
} sparse_index_params;

typedef struct sparse_index sparse_index;

/* Work counters, added to by every select call (zero the struct to start). */
typedef struct {
    int64_t calls;              /* selections */
    int64_t scored_calls;       /* selections that scored (budget below the candidates) */
    int64_t superblocks_scored; /* super-block summaries scored (whole tiles of 16) */
    int64_t blocks_scored;      /* block summaries scored (whole tiles of 16) */
    int64_t superblocks_expanded; /* super-blocks whose blocks were scored */
    int64_t bytes_read;         /* bytes of summaries read */
    int64_t flat_bytes;         /* bytes an exhaustive scan of every candidate block's
                                   summary would have read (in whole tiles of 16, as
                                   scans read them), for comparison */
    int64_t exact_calls;        /* scored selections provably equal to an exhaustive scan
                                   (stopped by the bound, not by the expansion cap) */
} sparse_select_stats;

/* Validates `p` and allocates an empty index (summary pages are committed on
 * first use). Returns ELLM_ERR_ARG for bad shapes, ELLM_ERR_UNSUPPORTED for
 * head_dim > SPARSE_MAX_HEAD_DIM or an unknown key type, ELLM_ERR_NOMEM. */
ellm_status sparse_index_init(const sparse_index_params *p, sparse_index **out, ellm_error *err);
void sparse_index_free(sparse_index *idx);

/* Bytes allocated for summaries and scratch. */
size_t sparse_index_bytes(const sparse_index *idx);

/* Adds the keys of positions [pos, pos + n) of `layer` to the summaries.
 * k: n rows of n_kv_head * head_dim floats (head-major inside a row), post-RoPE,
 * the same values given to kv_cache_store. pos must equal the number of
 * positions this layer already holds (appends are in order; use truncate to
 * go back) and pos + n <= n_ctx. */
void sparse_index_append(sparse_index *idx, int layer, int pos, int n, const float *k);

/* Forgets every position >= n_keep in every layer (n_keep <= each layer's
 * length). The last partial block and its super-block are rebuilt from the
 * keys stored in `kv` (which must hold positions [0, n_keep) of every layer,
 * with the index's shapes and key type), so summaries equal those of an index
 * built by appending positions [0, n_keep) afresh. O(n_layer * n_kv_head *
 * (block_tokens + superblock_blocks) * head_dim). */
void sparse_index_truncate(sparse_index *idx, const kv_cache *kv, int n_keep);

/* Chooses the KV blocks KV head `kv_head` of `layer` attends to for a batch of
 * n_q query tokens at positions [len - n_q, len), within budget_tokens keys.
 *   q: n_q x (n_kv_head * group) x head_dim floats, post-RoPE, the layout of
 *      attention_args.q; this KV head's query heads are kv_head * group ..
 *      kv_head * group + group - 1 (the scale does not matter).
 *   len: keys in the cache (1 <= len <= positions appended to this layer;
 *        summaries of blocks holding later positions bound those too).
 *   budget_tokens >= 0, sink_blocks >= 0, window_tokens >= 0.
 * If budget_tokens >= len every block [0, ceil(len / block_tokens)) is chosen,
 * so attention over them equals dense attention exactly. Otherwise, with
 * blocks counted by the keys they hold (the last block may be partial), in
 * this priority: the block holding position len - 1 (always, even over the
 * budget: a query must see some key); the first sink_blocks blocks; the blocks
 * covering the last max(window_tokens, n_q) positions, newest first; then the
 * blocks of highest upper bound (max over the group's heads and the n_q
 * queries) while they fit. blocks_out receives *n_out unique block indices in
 * ascending order; it needs room for min(ceil(len / block_tokens),
 * budget_tokens / block_tokens + 1) entries (kv_cache_n_blocks always
 * suffices). stats, if not NULL, is added to. No allocation. */
void sparse_index_select(sparse_index *idx, int layer, int kv_head, const float *q, int n_q,
                         int group, int len, int budget_tokens, int sink_blocks,
                         int window_tokens, int32_t *blocks_out, int *n_out,
                         sparse_select_stats *stats);

/* Attention recall of a block set: for each query row (token i of the batch at
 * position len - n_q + i, head g of the group), the fraction of its true
 * softmax mass (scores scale * q . k over keys [0, len - n_q + i], causal) that
 * falls on keys of blocks[0 .. n_blocks), which must be ascending and unique.
 * q has the layout of sparse_index_select. Writes the n_q * group per-row
 * recalls to recall_out (row i * group + g) if it is not NULL and returns
 * their mean; 1 exactly when every visible block is listed. A scalar dense
 * scan of the cache on one thread, O(len * head_dim * n_q * group): the
 * reference for the engine's recall samples, which take the same ratio from
 * attention_lse (the SIMD kernels, on the pool). */
float sparse_index_recall(const kv_cache *kv, int layer, int kv_head, const float *q, int n_q,
                          int group, int len, const int32_t *blocks, int n_blocks, float scale,
                          float *recall_out);

#endif
