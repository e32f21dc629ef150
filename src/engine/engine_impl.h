/* Private to src/engine: the state of one sequence being generated (its KV
 * cache, scratch buffers and threads) and the functions the engine's files
 * share. The files form layers, each calling only those below it:
 *   calibrate.c, synthetic.c  (public calibration and benchmark entry points)
 *   batch.c                   (ellm_batch: passes over several contexts)
 *   state.c                   (saving and restoring a context: resumable generation)
 *   shift.c                   (context shift: RoPE re-rotation of moved keys)
 *   context.c                 (context lifecycle, ellm_decode)
 *   forward.c                 (the transformer pass over a batch of tokens)
 *   sparse_budget.c           (per-head sparse budgets and recall samples) */
#ifndef ELLM_ENGINE_ENGINE_IMPL_H
#define ELLM_ENGINE_ENGINE_IMPL_H

#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "attention/sparse_index.h"
#include "core/threadpool.h"
#include "dist/dist.h"
#include "model/model.h"

/* The largest per-head budget weight (a head's budget is sparse_topk times
 * its weight): what a sparse profile may give, and so what a state file may
 * hold (adaptation keeps weights within [1/2, 2] before renormalizing). */
#define SPARSE_MAX_HEAD_WEIGHT 64.0f

/* What ellm_sparse_calibrate measures while it decodes: recall at each budget. */
struct engine_calib {
    const int *budgets;
    int n_budgets;
    int sample_every;
    double *sum;        /* (n_layer * n_kv_head * n_budgets) recall sums */
    int64_t *n_samples;
};

/* Scratch of one forward pass, for up to `rows` tokens (shapes per token). */
typedef struct {
    float *x;         /* (d) residual stream */
    float *xn;        /* (max(d, n_head * hd)) normalized; projection outputs */
    float *q;         /* (n_head * hd) */
    float *k, *v;     /* (n_kv * hd) */
    float *att;       /* (n_head * hd) attention output */
    float *gate, *up; /* (ff) */
    float *rope_cs;   /* (n_rot) cos/sin pairs */
    void *act;        /* prepared activations for up to 3 matmuls of the widest input */
    const ptrdiff_t *w_delta; /* NUMA weight copies per thread (see struct ellm_context), or NULL */
    int by_matrix;
} engine_scratch;

/* Allocates `s` for `rows` tokens of model `m` (w_delta/by_matrix left 0).
 * Returns 0, or -1 out of memory (`s` then freed). */
int engine_scratch_init(const ellm_model *m, int rows, engine_scratch *s);
void engine_scratch_free(engine_scratch *s);

/* The public face of a KV page pool (kv_pool.h) and the KV type its pages are for. */
struct ellm_kv_pool {
    kv_pool *pages;
    int kv_type;     /* QTYPE_* */
    int page_tokens; /* tokens per page */
    int owned;       /* 1: ellm_kv_pool_init made it (0: a context's private pool) */
};

struct ellm_context {
    ellm_model *model;
    ellm_context_params params;
    int n_ctx;
    int n_batch;
    kv_cache *kv;
    struct ellm_kv_pool kv_pool_view; /* its pool (shared or private), for stats */
    attention_workspace *attn_ws;
    dist_shard *dist; /* KV sharded over MPI ranks (params.mpi), or NULL */
    threadpool *pool;
    /* NUMA placement (placement.c): per-thread offset to the thread's node's
     * copy of the weights (replicate; NULL otherwise), and whether each
     * matrix's rows are split on their own (distribute over several nodes,
     * so a node's threads compute exactly the rows stored on it). */
    ptrdiff_t *w_delta; /* (n_threads) */
    int split_by_matrix;
    int owns_pool;   /* 0: the pool belongs to the ellm_batch the context was made from */
    engine_scratch s; /* sized for n_batch tokens */
    float *logits;   /* (n_vocab) after the last token */
    int has_logits;

    /* Sparse attention. The index is maintained whenever it exists, so the
     * mode can change between passes. */
    sparse_index *sidx;     /* NULL: this context is dense-only */
    int sparse_topk;        /* 0: dense */
    int sparse_force_select; /* tests: select and attend blocks even when every
                                budget covers the context (dense is then skipped) */
    float *head_weight;     /* (n_layer * n_kv_head) budget multipliers, mean 1 */
    unsigned char *layer_dense; /* (n_layer) 1: always dense */
    float *recall_ema;      /* (n_layer * n_kv_head) sampled recall */
    float *gain_ema;        /* (n_layer * n_kv_head) sampled recall gained per extra token */
    int32_t *sel_blocks;    /* (n_kv_head * max_blocks) chosen blocks of the current layer */
    int *sel_n;             /* (n_kv_head) */
    int max_blocks;
    int64_t n_sparse_heads; /* (layer, head) selections made, for the mean budget */
    double attended_sum;    /* tokens chosen, summed over selections */
    double attended_share_sum; /* tokens chosen / keys visible, summed over selections */
    sparse_select_stats sel_stats;
    sparse_select_stats *head_sel_stats; /* (n_kv_head) counters of the current layer */
    uint64_t *head_select_ns;            /* (n_kv_head) selection time of the current layer */
    ellm_context_stats stats;

    /* Recall samples (sparse_budget.c), made at the first one: attention
     * parts of a decode row, per query head the log-sum-exp over all keys,
     * the chosen blocks and a probe's blocks, and the probe's lists. */
    float *lse_mem;
    float **lse_parts;
    float *lse_all, *lse_set, *lse_probe;
    int32_t *probe_blocks; /* (n_kv_head * max_blocks) blocks of a probe at another budget */
    int *probe_n;          /* (n_kv_head) */

    int step_sparse;   /* the pass under way used sparse attention */
    int sample_recall; /* the pass under way samples recall */

    /* Calibration hook (ellm_sparse_calibrate): NULL outside calibration. */
    struct engine_calib *calib;
    /* Importance-matrix hook (ellm_imatrix_collect): NULL outside it. */
    ellm_imatrix *imatrix;
    /* Residual-stream hook (draft map calibration, src/spec/draft_map.c):
     * called after each layer of a single-context pass with the n rows of the
     * stream x (n x d); NULL outside it. */
    void (*layer_hook)(void *arg, int layer, const float *x, int n);
    void *layer_hook_arg;
};

/* ---- imatrix.c ---- */

/* The matmul inputs of a layer an importance matrix records; Q, K and V
 * share one input, as do gate and up. */
enum { IM_ATTN_IN, IM_ATTN_OUT, IM_FFN_IN, IM_FFN_DOWN, IM_SLOTS };
/* Adds nb input rows X (the slot's cols each) of `layer` to the sums. */
void engine_imatrix_observe(ellm_imatrix *im, int layer, int slot, const float *X, int nb);
/* Adds `calls` forward passes and `rows` tokens to the counts the means divide by. */
void engine_imatrix_count(ellm_imatrix *im, int64_t calls, int64_t rows);

/* ---- context.c ---- */


/* ellm_context_init with the threads of `shared_pool` (not freed with the
 * context) or, if NULL, a pool of its own. */
ellm_status engine_context_init(ellm_model *model, const ellm_context_params *params, threadpool *shared_pool,
                                ellm_context **out, ellm_error *err);

/* ---- sparse_budget.c ---- */

/* Budget in tokens of (layer, KV head) for the current sparse_topk. */
int engine_sparse_budget(const struct ellm_context *ctx, int layer, int head);
/* Re-balances head budgets from recall samples (--sparse-adapt). */
void engine_sparse_adapt(struct ellm_context *ctx);
/* Samples the recall of the blocks just chosen for `layer` (ctx->sel_blocks)
 * into the stats and the per-head averages, and with --sparse-adapt probes
 * what 64 more tokens would buy. `len` is the context length in tokens. */
void engine_sparse_sample_recall(struct ellm_context *ctx, int layer, int len);
/* Calibration sample for `layer` at the current decode step (n == 1). */
void engine_calibrate_layer(struct ellm_context *ctx, int layer, int len);

/* ---- forward.c ---- */

/* Starts the context's threads (pinned per the model's placement plan when
 * it has one) and places the KV cache's heads on the nodes whose threads read
 * them; after kv_cache_init, before anything is stored. */
ellm_status engine_placement_init(struct ellm_context *ctx, int n_threads, ellm_error *err);
/* Scratch of a forward pass, sized for its rows (shapes per row as in
 * struct ellm_context). */

/* One sequence's part of a pass: n tokens at positions [pos, pos + n) of its
 * context; rows [first_logit_row, n) write their logits to `logits` (row
 * stride n_vocab). */
typedef struct {
    struct ellm_context *ctx;
    const int32_t *tokens;
    int n, pos;
    int first_logit_row;
    float *logits;
} engine_seq;

/* Runs one pass over the rows of n_seq sequences stacked in `s` (sized for
 * their total): every matmul takes all rows at once, so each weight is read
 * once per pass; attention runs per sequence over its own KV cache. A row's
 * result does not depend on the other rows (the matmuls are row-independent).
 * `logits_tmp` holds the logit rows of all sequences when n_seq > 1. */
void engine_forward_seqs(const ellm_model *m, const engine_scratch *s, threadpool *pool, float *logits_tmp,
                         const engine_seq *seqs, int n_seq);

/* Rebuilds the sparse index from the keys of positions [0, pos) held in the
 * cache (replacing its contents). */
void engine_rebuild_index(struct ellm_context *ctx, int pos);

/* Runs the model on n tokens (n <= n_batch) at positions [pos, pos + n) and
 * writes the logits of rows [first_logit_row, n) to `logits` (row stride
 * n_vocab). The KV cache must hold exactly `pos` tokens; on return it holds
 * pos + n. */
void engine_forward(struct ellm_context *ctx, const int32_t *tokens, int n, int pos,
                    int first_logit_row, float *logits);

#endif
