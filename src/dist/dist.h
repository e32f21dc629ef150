/* A sequence's KV cache sharded over the ranks of an MPI job.
 *
 * Every rank holds the whole model (each maps the same file) and computes the
 * token-wise work (norms, matmuls, RoPE) of every token identically; the KV
 * cache is what is split. Positions belong to ranks in whole parts of
 * ATTENTION_PART_BLOCKS blocks (1,024 tokens at 16-token blocks): part c goes
 * to rank c mod R, which is the least-loaded rank (ties to the lowest) at the
 * moment the sequence opens that part, so every rank knows the owner of every
 * position without a message, and truncation keeps the rule. A rank stores
 * the keys and values of its own positions only; the rest of its cache's
 * address range is never written and so never committed.
 *
 * Attention in each layer: every rank computes the partial states (per query
 * row: running max, sum of exponentials, weighted value sum) of the parts it
 * owns and adds them up itself, with the exact merge one process uses
 * (attention_lse_*: fixed-point sums, which do not depend on how the parts
 * are grouped). One all-reduce per layer per pass, of a record per query
 * row: the merge's bound, its binned int64 sums on the bins of the rank's
 * own largest terms (2 (head_dim + 1)), and acc / l float bits of a rank's
 * only part, merged by a user-defined MPI operation that moves sums to the
 * bins of the larger terms and adds them (exact in any grouping) -- 12.0 KB
 * for a decode step of 9 heads of 64, whatever the context and the number
 * of ranks. A row that saw keys of one part only (one process writes acc / l
 * for it) takes those float bits from the rank holding the part. Sparse attention: every rank keeps the whole index (it
 * computes every key), makes the same selection, and attends to the chosen
 * blocks it holds; parts of a sparse list are cut at the same 32-block
 * parts of the cache (attention.h), so every part is on one rank. Either
 * way the output has a single process's bits whatever R is.
 *
 * Faults: the communicator returns errors instead of aborting, and every
 * exchange has a deadline; a rank that dies or stops answering makes the
 * others report it and stop the job (MPI_Abort) instead of waiting forever.
 * Tests inject faults with ELLM_MPI_FAULT=exit,RANK,N (rank RANK exits at its
 * N-th exchange) or hang,RANK,N (it stops answering there).
 *
 * MPI is confined to this folder (dist_mpi.c): the rest of the library sees
 * only these functions and the public ellm_mpi_* ones. */
#ifndef ELLM_DIST_DIST_H
#define ELLM_DIST_DIST_H

#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "core/threadpool.h"
#include "ellm.h"

typedef struct dist_shard dist_shard;

/* Buffers for calls of up to max_q query tokens of n_head heads of head_dim
 * over a cache of up to max_ctx tokens in blocks of block_tokens. */
ellm_status dist_shard_init(ellm_mpi *mpi, int max_q, int n_head, int head_dim, int max_ctx, int block_tokens,
                            dist_shard **out, ellm_error *err);
void dist_shard_free(dist_shard *sh);

int dist_rank(const dist_shard *sh);
int dist_size(const dist_shard *sh);
/* Tokens per part: ATTENTION_PART_BLOCKS * block_tokens. */
int dist_part_tokens(const dist_shard *sh);
/* Rank that stores position pos. */
int dist_owner(const dist_shard *sh, int pos);
/* Positions of [0, len) this rank stores. */
int dist_local_tokens(const dist_shard *sh, int len);

/* kv_cache_store of the positions of [pos, pos + n) this rank owns (k, v as
 * kv_cache_store takes them, rows for all n tokens). */
void dist_kv_store(dist_shard *sh, kv_cache *kv, int layer, int pos, int n, const float *k, const float *v);

/* attention_forward (blocks NULL) or attention_forward_blocks (ascending
 * lists, as sparse_index_select makes them) across the ranks: every rank
 * calls it with the same arguments (its own cache, the same lists) and gets
 * the same a->out, with the bits one process gets. On a failed exchange
 * a->out is zeros and dist_failed() says why. */
void dist_attention(dist_shard *sh, const attention_args *a, const int32_t *blocks, const int *n_blocks,
                    int max_blocks, attention_workspace *ws, threadpool *pool);

/* NULL, or the message of the first failed exchange. */
const char *dist_failed(const dist_shard *sh);

typedef struct {
    int64_t exchanges;   /* exchanges run (one all-reduce per layer per pass) */
    double bytes_sent;   /* bytes this rank put into the all-reduces */
    double bytes_recv;   /* bytes of their results it received */
    double exchange_ms;  /* wall time inside the collectives (waiting for the slowest rank included) */
    double merge_ms;     /* time merging the parts */
    double compute_ms;   /* time computing this rank's parts */
} dist_stats;

void dist_get_stats(const dist_shard *sh, dist_stats *st);
void dist_reset_stats(dist_shard *sh);

#endif
