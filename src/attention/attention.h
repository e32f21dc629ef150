/* Fused attention over the block KV cache (flash-decoding).
 *
 * For each KV head, its group of query heads (GQA) and all query tokens of the
 * batch are processed together against each KV block: QK^T, online softmax and
 * PV in one pass, never writing a score matrix to memory. Work is split across
 * threads by (KV head, range of KV blocks); each part keeps a running max, sum
 * and weighted V per query row, and parts are merged with a log-sum-exp
 * reduction. Causal: query i of the batch sees keys [0, q_pos0 + i]. */
#ifndef ELLM_ATTENTION_ATTENTION_H
#define ELLM_ATTENTION_ATTENTION_H

#include "attention/kv_cache.h"
#include <stdint.h>
#include "core/threadpool.h"

typedef struct {
    const kv_cache *kv;
    int layer;
    int n_q;      /* query tokens in the batch (1 for decode) */
    int q_pos0;   /* position of query token 0 */
    int n_head;   /* query heads; a multiple of the cache's n_kv_head */
    const float *q; /* n_q x n_head x head_dim */
    float *out;     /* n_q x n_head x head_dim */
    float scale;    /* usually 1/sqrt(head_dim) */
} attention_args;

/* Scratch for partial results; sized once for the largest call. */
typedef struct attention_workspace attention_workspace;

ellm_status attention_workspace_init(int n_threads, int max_q, int n_head, int head_dim,
                                     int max_ctx, int block_tokens,
                                     attention_workspace **out, ellm_error *err);
void attention_workspace_free(attention_workspace *ws);

/* Runs on all threads of `pool` (NULL: the calling thread alone; the pool may
 * have at most the workspace's n_threads). The keys/values of positions up to
 * q_pos0 + n_q - 1 must already be stored for `layer`. One call at a time per
 * workspace. */
void attention_forward(const attention_args *a, attention_workspace *ws, threadpool *pool);

/* Sparse variant: KV head h (and its query heads) attends only to the blocks
 * blocks[h * max_blocks + 0 .. n_blocks[h]), each a block index < kv_cache_n_blocks,
 * listed once, any order, 1 <= n_blocks[h] <= max_blocks; the causal mask still
 * applies. Same threading, workspace and output as attention_forward; a query row
 * that sees no key of its blocks gets zeros. A list is cut into parts where
 * its blocks move to another part of ATTENTION_PART_BLOCKS cache blocks (for
 * an ascending list: one part per cache part it touches), merged in list
 * order. */
void attention_forward_blocks(const attention_args *a, const int32_t *blocks, const int *n_blocks,
                              int max_blocks, attention_workspace *ws, threadpool *pool);

/* Chooses the blocks of KV head kv_head (any thread of the pool may call it,
 * `thread` being its index, for per-thread scratch or counters; calls for
 * different heads run concurrently): writes 1 <= *n_blocks <= max_blocks
 * block indices to blocks (the head's row of the caller's array). */
typedef void (*attention_select_fn)(void *arg, int kv_head, int thread, int32_t *blocks,
                                    int *n_blocks);

/* attention_forward_blocks with the block lists made by `select` inside the
 * same parallel job: for a decode or verification batch (n_q <= 16) threads
 * take the selection of each head, then parts of the chosen blocks, as they
 * come free, so selection is spread over the threads and a head's attention
 * starts as soon as its own selection is done; larger batches select, then
 * attend. blocks (n_kv_head x max_blocks) and n_blocks (n_kv_head) receive the
 * lists. The output equals attention_forward_blocks' up to rounding; with
 * n_q <= 16 parts are merged in a fixed order, so the bits do not depend on
 * the number of threads or their timing. */
void attention_forward_select(const attention_args *a, attention_select_fn select, void *select_arg,
                              int32_t *blocks, int *n_blocks, int max_blocks,
                              attention_workspace *ws, threadpool *pool);

/* ---- attention split into parts (KV sharded over processes) -------------
 *
 * A dense call's work per (KV head, tile of ATTN tile tokens) is cut into
 * parts of ATTENTION_PART_BLOCKS KV blocks at fixed places (part c holds
 * blocks [c * ATTENTION_PART_BLOCKS, (c + 1) * ATTENTION_PART_BLOCKS)), each
 * computed from an empty online-softmax state and merged in part order; this
 * is what attention_forward does internally. The functions below expose it:
 * attention_forward_parts computes the partial states of chosen parts and
 * attention_merge_parts merges a full set of them into `out` with the same
 * arithmetic, so parts computed in different processes and merged in part
 * order give attention_forward's bits exactly.
 *
 * Records: the parts of a call are numbered tile-major, part-minor
 * (attention_part_first(a, t) + c is part c of tile t). Record floats
 * (attention_part_floats) hold, for each KV head h, for each row
 * r = token_in_tile * group + g of the tile: m, l, acc[head_dim] (running
 * max of the scaled scores, sum of exp(score - m), sum of exp(score - m) * v). */
/* 64 blocks (1,024 tokens of 16) rather than 32: every part costs its own
 * start, state and exact merge (attention_lse_*), which at 32 blocks was a
 * large share of a decode call. bench_attention, 2 threads, 4 alternated
 * rounds on a Zen 5 guest, parts and long-context pages (KV_PAGE_BLOCKS_LONG)
 * of 32 -> 64 blocks, ms per step: F16 16K 8.52 -> 6.74, 32K 16.34 -> 13.91;
 * Q8_0 16K 5.22 -> 4.75, 32K 10.19 -> 9.50 (128 blocks: 6.35, 13.96, 4.46,
 * 8.70, with half as many parts to share among threads); a whole ellm bench
 * decode step of the 135M shape 3-5% faster at 16K and 32K. */
#define ATTENTION_PART_BLOCKS 64
/* How far ahead dense attention asks for the blocks it reads next, in bytes
 * (attention.c says why 8 KB), and that distance in blocks of block_bytes (K
 * and V): whole blocks, 2 to 7. */
#define ATTENTION_DENSE_PREFETCH_BYTES 8192
int attention_dense_look_ahead(size_t block_bytes);
/* Query tiles of a call (ceil(n_q / 16)). */
int attention_n_tiles(const attention_args *a);
/* Parts of tile t: blocks its last query token sees, in parts. */
int attention_tile_parts(const attention_args *a, int t);
/* Number of the first record of tile t; attention_part_first(a, n_tiles) is
 * the call's total. */
long attention_part_first(const attention_args *a, int t);
/* Floats of one record of tile t. */
size_t attention_part_floats(const attention_args *a, int t);
/* Computes every record whose parts[i] is not NULL into parts[i] (attention_part_first
 * numbering). Keys of the blocks of those parts must be stored; other blocks
 * are never read. blocks NULL: dense attention (attention_forward's parts).
 * Else sparse, as attention_forward_blocks with the same lists, which must be
 * ascending here: part c of KV head h is the run of h's list within cache
 * blocks [c * ATTENTION_PART_BLOCKS, (c + 1) * ATTENTION_PART_BLOCKS), as
 * attention_forward_blocks and attention_forward_select cut it, and a head
 * with no block there gets rows m = -inf, l = 0, acc = 0. */
void attention_forward_parts(const attention_args *a, const int32_t *blocks, const int *n_blocks, int max_blocks,
                             float *const *parts, attention_workspace *ws, threadpool *pool);
/* Merges all records (none NULL) into a->out as attention_forward and
 * attention_forward_blocks do (the exact merge below), so parts computed
 * anywhere give their bits. */
void attention_merge_parts(const attention_args *a, const float *const *parts, threadpool *pool);
/* Log-sum-exp of each query row's scaled scores (a->scale * q . k, as the
 * kernels compute them) over the keys the row sees among the blocks: all of
 * them with blocks NULL, else the lists of attention_forward_parts. lse gets
 * n_q x n_head floats in the layout of a->q's rows (-inf for a row that sees
 * no key); a->out is not written. parts: attention_part_first(a,
 * attention_n_tiles(a)) records of scratch, as attention_forward_parts
 * fills them. A row's value is its parts' (m, l) combined in part order, so a
 * list of every block a row sees gives the bits of the dense call: the
 * attention mass a block set holds is exp(lse over the set - lse over all),
 * exactly 1 for the full set. For occasional sampling (sparse recall,
 * calibration): it costs an attention pass over the blocks. */
void attention_lse(const attention_args *a, const int32_t *blocks, const int *n_blocks, int max_blocks,
                   float *const *parts, float *lse, attention_workspace *ws, threadpool *pool);

/* ---- exact merge of partial states (attention_merge.c) ------------------
 *
 * One query row's partials (m, l, acc[hd]) from several parts merge into
 * out = sum_i e_i acc_i / sum_i e_i l_i, e_i = exp(m_i) up to a common
 * factor, with both sums taken in binned fixed point: each term is an exact
 * binary number of its own part, and its digits in the two 40-bit bins
 * below the largest term of the row (acc and l apart) are summed in int64
 * (attention_merge.c says why), so the result depends neither on the order
 * nor on the grouping in which parts are added: threads, or processes
 * holding shards of the KV cache, may each add up their own parts, on the
 * bins of their own largest term, and the sums of groups merge exactly
 * (attention_lse_bound_merge, attention_lse_rebase, then add). Steps: fold
 * every part into a bound (maxima: any order, any grouping); make the grid
 * from the bound; add every part into the int64 sums (zeroed first); divide.
 * A part with m = -inf (the row saw none of its keys) is skipped. A row that
 * saw keys of one part only is not merged: it gets that part's acc / l in
 * float (attention_lse_one), as a segment of one part is written, so a
 * row's bits do not depend on which other parts its tile holds. */
#define ATTENTION_LSE_BIN_BITS 40
#define ATTENTION_LSE_NONE INT64_MIN /* no bin: no nonzero term */
typedef struct {
    int64_t ta;        /* bin of the largest acc term (ATTENTION_LSE_NONE: none) */
    int64_t tl;        /* bin of the largest l term */
    int64_t last;      /* max part index i with finite m_i (INT64_MIN: none) */
    int64_t neg_first; /* max of -i: minus the min part index with finite m_i */
} attention_lse_bound;

typedef struct {
    int empty;      /* no part saw a key: out is zeros */
    int64_t ta, tl; /* the top bins the sums are kept in */
} attention_lse_grid;

/* int64 per row of sums: the upper bin of acc[0..hd) and of l, then the
 * lower bin of each. */
#define ATTENTION_LSE_SUMS(hd) (2 * ((hd) + 1))

void attention_lse_bound_init(attention_lse_bound *b);
/* Folds part number `part` (any numbering, the same for every fold). */
void attention_lse_bound_add(attention_lse_bound *b, int part, float m, float l, const float *acc, int hd);
/* b = the bound of b's and o's parts together. */
void attention_lse_bound_merge(attention_lse_bound *b, const attention_lse_bound *o);
/* The number of the one part whose keys the row saw, or -1 (several or none). */
int attention_lse_single(const attention_lse_bound *b);
void attention_lse_grid_init(attention_lse_grid *g, const attention_lse_bound *b);
/* sum: ATTENTION_LSE_SUMS(hd) int64 (acc, then l). */
void attention_lse_sum(const attention_lse_grid *g, float m, float l, const float *acc, int hd, int64_t *sum);
/* Sums added on grid `from` re-expressed on grid `to`, whose bound includes
 * from's (its bins are the same or higher); then sums of both add up. */
void attention_lse_rebase(const attention_lse_grid *from, const attention_lse_grid *to, int64_t *sum, int hd);
/* A running merge of parts added one at a time: bound_add into b, the grid
 * g of the new bound, rebase of sum from the old grid onto it, then sum (the
 * same integers as those steps, with m split once). */
void attention_lse_accumulate(attention_lse_bound *b, attention_lse_grid *g, int64_t *sum, int part, float m, float l,
                              const float *acc, int hd);
void attention_lse_out(const attention_lse_grid *g, const int64_t *sum, int hd, float *out);
/* out = acc / l of a single part, in float: (0 + acc) * (1 / l). */
void attention_lse_one(float l, const float *acc, int hd, float *out);

/* Turns pair steps of the single-row AVX-512 kernel (two whole blocks'
 * scores in one pass; the same bits), and the Q8_0 kernel's multi-block
 * steps (2 whole blocks, each phase for both; the same bits),
 * on (default) or off, for benchmarks and tests comparing them; not
 * thread-safe against running calls. */
void attention_pairs_enable(int on);

/* How the AVX-512 decode kernels (a few rows of one KV head, K and V read
 * in place: attn_blocks_f16_avx512, attn_blocks_q8_avx512) ask for the
 * blocks ahead: 1 non-temporally (prefetchnta), 0 towards L2 (prefetcht1),
 * -1 (the default) by CPU vendor: non-temporal on AMD, towards L2 elsewhere.
 * The same bytes and bits either way; the speed differs by vendor. On a Zen 4
 * guest non-temporal read F16 caches 4-12% faster at 16K (one thread) and
 * Q8_0 ones 4-6% (two threads, Zen 5); on a Xeon (Sapphire/Emerald Rapids
 * family) guest non-temporal prefetches were no better than none, and
 * towards L2 read both 1.3-1.45x faster (bench/KV.md, 2026-12-08). Not
 * thread-safe against running calls. */
void attention_prefetch_nta(int mode);
/* The choice in effect (0 or 1). */
int attention_prefetch_nta_active(void);

/* Tests: with `on`, dense and sparse-list calls start thread 0 with every
 * part and the other threads with none, so every part another thread
 * computes is one it took from thread 0 (attn_worker's work stealing); the
 * outputs must keep their bits. Not thread-safe against running calls.
 * attention_parts_taken: how many parts threads have taken from another
 * thread's range since the program started. */
void attention_uneven_ranges(int on);
long attention_parts_taken(void);

/* Naive reference: full score rows, softmax, PV (single thread; tests). */
void attention_forward_ref(const attention_args *a);

#endif
