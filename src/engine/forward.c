/* The transformer forward pass over a batch of tokens.
 *
 * Each weight matrix is multiplied against all tokens of the batch in one
 * kern_matmul call per thread, so prefill and speculative verification read
 * each weight once per pass. The element-wise work between two matmuls
 * (norms, residual adds, RoPE, SwiGLU, preparing the activations) is done on
 * rows, and from ELEMENTWISE_PAR_ROWS rows the threads of the matmul's launch
 * split those rows, meeting at a barrier inside the launch; a row's values do
 * not depend on which thread computes them. */
#include "core/timer.h"
#include "engine/engine_impl.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Sparse batches of at most this many tokens run attention token by token
 * (bit-identical to single-token steps); see engine_forward. */
#define ENGINE_SPARSE_EXACT_ROWS 32

typedef struct {
    struct ellm_context *ctx;
    const float *q; /* the n query rows (attention_args.q) */
    int layer, n, len;
} select_job;

/* attention_select_fn: chooses the blocks of one KV head. Each head is chosen
 * once per layer, so its counters need no lock. */
static void select_head(void *arg, int h, int thread, int32_t *blocks, int *n_blocks) {
    select_job *j = arg;
    struct ellm_context *ctx = j->ctx;
    const ellm_context_params *p = &ctx->params;
    (void)thread;
    uint64_t t0 = ellm_time_ns();
    int group = ctx->model->cfg.n_head / ctx->model->cfg.n_head_kv;
    /* A batch (prefill chunk, verification) makes one selection for all its
     * queries. Each of them keeps what a single step would have: the window
     * before the batch's first query as well as the batch itself, and the
     * budget beyond them. Without this the first queries of a chunk lost
     * their own recent tokens (ppl x1.20 at a 256-token budget in 256-token
     * chunks, `ellm eval` sparse:256:prefill). */
    const int extra = j->n - 1;
    sparse_index_select(ctx->sidx, j->layer, h, j->q, j->n, group, j->len,
                        engine_sparse_budget(ctx, j->layer, h) + extra, p->sparse_sink_blocks,
                        p->sparse_window + extra, blocks, n_blocks, &ctx->head_sel_stats[h]);
    ctx->head_select_ns[h] = ellm_time_ns() - t0;
}

/* Every KV head's selection on the pool's threads (KV sharded over ranks:
 * each rank chooses from its own copy of the index, which holds every
 * position's summary, so all ranks choose the blocks one process does). */
static void select_all_task(void *arg, int ith, int nth) {
    select_job *j = arg;
    struct ellm_context *ctx = j->ctx;
    for (int h = ith; h < ctx->model->cfg.n_head_kv; h += nth)
        select_head(j, h, ith, ctx->sel_blocks + (size_t)h * ctx->max_blocks, &ctx->sel_n[h]);
}

/* Sparse attention for `layer` if some KV head's budget is below the context:
 * blocks are chosen and attended in one parallel job (into ctx->sel_blocks /
 * sel_n), or, with the KV cache sharded, chosen on every rank and attended
 * across them. Returns 0, doing nothing, if the layer should run dense. */
static int sparse_attention_layer(struct ellm_context *ctx, const attention_args *aa, int n, int len) {
    const model_config *c = &ctx->model->cfg;
    const int layer = aa->layer;
    if (!ctx->sidx || ctx->sparse_topk <= 0 || ctx->layer_dense[layer]) return 0;
    int any_sparse = 0;
    for (int h = 0; h < c->n_head_kv; h++)
        if (engine_sparse_budget(ctx, layer, h) + n - 1 < len) any_sparse = 1;
    /* every budget covers the context: dense is exact (tests may force the
     * selection path to check that claim) */
    if (!any_sparse && !ctx->sparse_force_select) return 0;
    select_job job = {ctx, aa->q, layer, n, len};
    memset(ctx->head_sel_stats, 0, (size_t)c->n_head_kv * sizeof *ctx->head_sel_stats);
    if (ctx->dist) {
        threadpool_run(ctx->pool, select_all_task, &job);
        dist_attention(ctx->dist, aa, ctx->sel_blocks, ctx->sel_n, ctx->max_blocks, ctx->attn_ws, ctx->pool);
    } else {
        attention_forward_select(aa, select_head, &job, ctx->sel_blocks, ctx->sel_n, ctx->max_blocks,
                                 ctx->attn_ws, ctx->pool);
    }
    int bt = kv_cache_get_params(ctx->kv)->block_tokens;
    uint64_t select_ns = 0;
    for (int h = 0; h < c->n_head_kv; h++) {
        sparse_select_stats *a = &ctx->sel_stats, *b = &ctx->head_sel_stats[h];
        a->calls += b->calls;
        a->scored_calls += b->scored_calls;
        a->superblocks_scored += b->superblocks_scored;
        a->blocks_scored += b->blocks_scored;
        a->superblocks_expanded += b->superblocks_expanded;
        a->bytes_read += b->bytes_read;
        a->flat_bytes += b->flat_bytes;
        a->exact_calls += b->exact_calls;
        /* FNV-1a over the block indices, one step per block (not per byte:
         * this runs for every head and layer of every sparse step) */
        const int32_t *blk = ctx->sel_blocks + (size_t)h * ctx->max_blocks;
        uint64_t dg = ctx->stats.sparse_digest ? ctx->stats.sparse_digest : 0xcbf29ce484222325ull;
        for (int i = 0; i < ctx->sel_n[h]; i++) dg = (dg ^ (uint32_t)blk[i]) * 0x100000001b3ull;
        ctx->stats.sparse_digest = dg;
        int tokens = ctx->sel_n[h] * bt;
        ctx->attended_sum += tokens < len ? tokens : len;
        ctx->attended_share_sum += (tokens < len ? tokens : len) / (double)len;
        select_ns += ctx->head_select_ns[h];
    }
    ctx->n_sparse_heads += c->n_head_kv;
    /* Selections run on all threads at once: their time over the threads is
     * the share of the step's wall time they take. */
    ctx->stats.select_ms += (double)select_ns / 1e6 / threadpool_size(ctx->pool);
    return 1;
}

/* Launches of up to this many threads balance a decode matmul's ranges
 * (matmul_task); more threads keep fixed ranges. */
#define MATMUL_PARTS 8

/* Up to 3 matmuls sharing one launch (Q/K/V, gate/up): threads split the
 * concatenated rows so the launch overhead is paid once. */
typedef struct {
    int n;
    const model_matrix *w[3];
    const void *act[3];
    float *y[3];
    int64_t ldy[3];
    int nb;
    const ptrdiff_t *delta; /* (nth) offset to thread i's node's copy of the weights, or NULL */
    int by_matrix;          /* split each matrix on its own (rows placed per node) */
    /* Matrix 0's output row a is also copied to scatter[a] (n columns), each
     * piece as soon as it is computed, while it is in the thread's cache;
     * NULL: no copy. */
    float *const *scatter;
    atomic_long next;       /* more threads than parts: the next 16-row unit of the concatenated rows to take */
    /* Units taken so far from the front of each thread's own range
     * (matmul_task), a cache line each. */
    struct {
        atomic_long taken;
        char pad[64 - sizeof(atomic_long)];
    } part[MATMUL_PARTS];
} matmul_job;

/* Rows of the concatenated matrices are taken in chunks, about
 * MATMUL_CHUNKS_PER_THREAD per thread: a thread that starts
 * late or is preempted (the machine's other processes, an HTTP thread of the
 * server) leaves its share to the others instead of holding them at the end
 * of the launch. Which thread computes a row does not change its bits. */
#define MATMUL_CHUNKS_PER_THREAD 16
/* Pieces of matrices in MODEL_LAYOUT_R16 are at least this many units:
 * its batch kernel reads 2 groups of 16 rows per pass, and more passes per
 * call keep its prefetch of the next groups going. bench_batch, SmolLM2-135M
 * Q8_0, 2 threads, 8 alternated rounds: 4 units against 2, a 16-sequence
 * step 9.65 against 9.91 ms, 4 sequences 4.59 against 4.81. */
#define MATMUL_R16_MIN_UNITS 4
/* Below this many activation rows each thread takes one fixed range. */
#define MATMUL_SHARED_MIN_ROWS 4

/* Rows [r0, r1) of matrix i of the job (and their copies, job->scatter). */
static void matmul_piece_of(const matmul_job *job, int i, ptrdiff_t delta, int64_t r0, int64_t r1) {
    const model_matrix *w = job->w[i];
    if (w->layout == MODEL_LAYOUT_R16)
        kern_matmul_r16(w->type, (const char *)w->data + delta, w->cols, r0, r1, job->act[i], job->nb, job->y[i],
                        job->ldy[i]);
    else
        kern_matmul(w->type, (const char *)w->data + delta, w->cols, r0, r1, job->act[i], job->nb, job->y[i],
                    job->ldy[i]);
    if (i == 0 && job->scatter)
        for (int a = 0; a < job->nb; a++)
            memcpy(job->scatter[a] + r0, job->y[0] + (int64_t)a * job->ldy[0] + r0, (size_t)(r1 - r0) * 4);
}

/* Rows [b, e) of the job's concatenated matrices. */
static void matmul_rows(const matmul_job *job, ptrdiff_t delta, int64_t b, int64_t e) {
    int64_t base = 0;
    for (int i = 0; i < job->n; i++) {
        const model_matrix *w = job->w[i];
        int64_t r0 = b - base, r1 = e - base;
        if (r0 < 0) r0 = 0;
        if (r1 > w->rows) r1 = w->rows;
        if (r0 < r1) matmul_piece_of(job, i, delta, r0, r1);
        base += w->rows;
    }
}

/* Units of a piece when `left` units of a range are not yet taken. Few
 * activation rows (chunk 0): a quarter of them, so a range goes in a few
 * large pieces (each a kernel call that starts its own prefetch) and ends in
 * pieces of 2 units. More rows (compute-bound): `chunk` units, small enough
 * that a preempted thread holds little; the batched kernel prefetches the
 * rows after its piece, the next piece of the same range. */
static long matmul_piece(long left, long chunk) {
    if (chunk > 0) return chunk;
    return left / 4 > 2 ? left / 4 : 2;
}

/* Takes the next piece [*u0, *u1) of a range of n units whose first *taken
 * are gone; 0 when nothing is left. */
static int matmul_take(atomic_long *taken, long n, long chunk, long *u0, long *u1) {
    long u = atomic_load_explicit(taken, memory_order_relaxed), e;
    do {
        if (u >= n) return 0;
        e = u + matmul_piece(n - u, chunk);
        if (e > n) e = n;
    } while (!atomic_compare_exchange_weak_explicit(taken, &u, e, memory_order_relaxed, memory_order_relaxed));
    *u0 = u;
    *u1 = e;
    return 1;
}

static void matmul_task(void *arg, int ith, int nth) {
    matmul_job *job = arg;
    const ptrdiff_t delta = job->delta ? job->delta[ith] : 0;
    if (job->by_matrix) {
        /* the rows topo_plan_node_rows placed on this thread's node */
        for (int i = 0; i < job->n; i++) {
            const model_matrix *w = job->w[i];
            long b, e;
            threadpool_split((long)w->rows, ith, nth, 16, &b, &e);
            if (b < e) matmul_piece_of(job, i, delta, b, e);
        }
        return;
    }
    int64_t total = 0;
    int r16 = 0; /* a launch may mix layouts (Q4_K beside Q6_K) */
    for (int i = 0; i < job->n; i++) {
        total += job->w[i]->rows;
        r16 |= job->w[i]->layout == MODEL_LAYOUT_R16;
    }
    const long units = (long)((total + 15) / 16);
    long chunk = units / ((long)nth * MATMUL_CHUNKS_PER_THREAD);
    if (chunk < 1) chunk = 1;
    /* the 16-row interleaved kernel takes pairs of groups at a time */
    if (chunk < MATMUL_R16_MIN_UNITS && r16) chunk = MATMUL_R16_MIN_UNITS;
    if (nth <= MATMUL_PARTS) {
        /* Few activation rows: the launch streams the weights from memory;
         * one contiguous range per thread streams them fastest. More rows:
         * a thread's consecutive pieces are consecutive rows, so the kernel's
         * prefetch of the rows after a piece serves the thread's next one
         * (pieces taken from one shared counter alternate between threads).
         * The ranges are not fixed, though: with fixed halves, one thread
         * (slowed by another process on its core, interrupts, its pages)
         * kept the other waiting at the end of the launches for 7% and 14%
         * of a SmolLM2-135M decode step in two timed runs. Each thread
         * takes pieces from the front of its own range, then from the
         * others' fronts; which thread computes a row does not change it. */
        const long piece = job->nb < MATMUL_SHARED_MIN_ROWS ? 0 : chunk;
        for (int k = 0; k < nth; k++) {
            const int part = (ith + k) % nth;
            long b, e;
            threadpool_split(units, part, nth, 1, &b, &e);
            for (long u0, u1; matmul_take(&job->part[part].taken, e - b, piece, &u0, &u1);)
                matmul_rows(job, delta, (int64_t)(b + u0) * 16, (b + u1) * 16 < total ? (int64_t)(b + u1) * 16 : total);
        }
        return;
    }
    if (job->nb < MATMUL_SHARED_MIN_ROWS) {
        long b, e;
        threadpool_split(units, ith, nth, 1, &b, &e);
        matmul_rows(job, delta, (int64_t)b * 16, e * 16 < total ? (int64_t)e * 16 : total);
        return;
    }
    for (long u; (u = atomic_fetch_add_explicit(&job->next, chunk, memory_order_relaxed)) < units;) {
        const int64_t b = (int64_t)u * 16, e = (u + chunk) * 16 < total ? (int64_t)(u + chunk) * 16 : total;
        matmul_rows(job, delta, b, e);
    }
}

/* Bytes of nb rows prepared for w's kernels (w's type and layout). */
static size_t act_bytes(const model_matrix *w, int nb) {
    return w->layout == MODEL_LAYOUT_R16 ? kern_act_bytes_r16(w->cols, nb) : kern_act_bytes(w->type, w->cols, nb);
}

/* Rows [t0, t1) of nb rows X prepared for w's kernels. */
static void act_prepare_rows(const model_matrix *w, const float *X, int nb, int t0, int t1, void *act) {
    if (w->layout == MODEL_LAYOUT_R16) kern_act_prepare_rows_r16(w->type, X, w->cols, nb, t0, t1, act);
    else kern_act_prepare_rows(w->type, X, w->cols, nb, t0, t1, act);
}

/* Y (nb rows of w->rows, stride ldy) = X (nb rows of w->cols) * W^T; with
 * scatter, Y row a is also copied to scatter[a]. */
static void matmul_to(const engine_scratch *s, threadpool *pool, const model_matrix *w, const float *X, int nb,
                      float *Y, int64_t ldy, float *const *scatter) {
    act_prepare_rows(w, X, nb, 0, nb, s->act);
    matmul_job job = {.n = 1, .w = {w}, .act = {s->act}, .y = {Y}, .ldy = {ldy}, .nb = nb,
                      .delta = s->w_delta, .by_matrix = s->by_matrix, .scatter = scatter};
    threadpool_run(pool, matmul_task, &job);
}

static void matmul(const engine_scratch *s, threadpool *pool, const model_matrix *w, const float *X, int nb,
                   float *Y, int64_t ldy) {
    matmul_to(s, pool, w, X, nb, Y, ldy, NULL);
}

/* Passes of at least this many rows split their element-wise work over the
 * threads; fewer rows are done on the calling thread (a barrier would cost
 * more than the work). Rows go to threads in groups of 4, so below 8 rows
 * one thread would get them all. */
#define ELEMENTWISE_PAR_ROWS 8

/* Where the prepared activations of the matrices w[0..n) (one input, same
 * cols) go in s->act: one buffer per distinct weight type and layout, in
 * order of first use. */
static void act_slots(const engine_scratch *s, int n, const model_matrix *const *w, int nb, const void **act) {
    char *p = s->act;
    for (int i = 0; i < n; i++) {
        int j;
        for (j = 0; j < i; j++)
            if (w[j]->type == w[i]->type && w[j]->layout == w[i]->layout) break;
        if (j < i) {
            act[i] = act[j];
        } else {
            act[i] = p;
            p += (act_bytes(w[i], nb) + 63) & ~(size_t)63;
        }
    }
}

/* Rows [t0, t1) of the nb rows X prepared for the matrices w (act_slots). */
static void act_rows(const engine_scratch *s, int n, const model_matrix *const *w, const float *X, int nb, int t0,
                     int t1) {
    const void *act[3];
    act_slots(s, n, w, nb, act);
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < i && act[j] != act[i]) j++;
        if (j == i) act_prepare_rows(w[i], X, nb, t0, t1, (void *)act[i]);
    }
}

/* One pass's rows and where the layer loop keeps them (engine_scratch). */
typedef struct {
    const ellm_model *m;
    const engine_scratch *s;
    int n;    /* rows of the pass */
    int fuse; /* ROWS_DOWN_OUT also does the next layer's ROWS_ATTN_IN */
} fwd_pass;

/* The element-wise steps of a layer, each on rows [t0, t1). */
enum {
    ROWS_NONE,
    ROWS_ATTN_IN,  /* xn = rmsnorm(x); xn prepared for Q/K/V */
    ROWS_QKV_OUT,  /* biases, Q/K norms, RoPE on q and k */
    ROWS_ATT_ACT,  /* att prepared for the output projection */
    ROWS_FFN_IN,   /* x += xn (attention's projection); xn = rmsnorm(x); xn prepared for gate/up */
    ROWS_FFN_ACT,  /* gate = swiglu(gate, up), prepared for down */
    ROWS_DOWN_OUT, /* x += xn (the FFN's output); with fuse, the next layer's ROWS_ATTN_IN */
};

static void rows_work(const fwd_pass *f, int op, int l, int t0, int t1) {
    const model_config *c = &f->m->cfg;
    const engine_scratch *s = f->s;
    const model_layer *L = &f->m->layers[l];
    const int64_t d = c->n_embd, hd = c->head_dim, nq = (int64_t)c->n_head * hd,
                  nkv = (int64_t)c->n_head_kv * hd, ff = c->n_ff;
    if (t0 >= t1) return;
    switch (op) {
    case ROWS_ATTN_IN: {
        for (int t = t0; t < t1; t++) kern_rmsnorm(s->xn + t * d, s->x + t * d, L->attn_norm, d, c->norm_eps);
        const model_matrix *w[3] = {&L->wq, &L->wk, &L->wv};
        act_rows(s, 3, w, s->xn, f->n, t0, t1);
        break;
    }
    case ROWS_QKV_OUT:
        for (int t = t0; t < t1; t++) {
            float *q = s->q + t * nq, *k = s->k + t * nkv, *v = s->v + t * nkv;
            if (L->bq) {
                kern_add(q, L->bq, nq);
                kern_add(k, L->bk, nkv);
                kern_add(v, L->bv, nkv);
            }
            if (L->q_norm) {
                for (int h = 0; h < c->n_head; h++)
                    kern_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, c->norm_eps);
                for (int h = 0; h < c->n_head_kv; h++)
                    kern_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, c->norm_eps);
            }
            const float *cs = s->rope_cs + (size_t)t * c->n_rot;
            kern_rope(q, c->n_head, (int)hd, c->n_rot, cs, c->rope_neox);
            kern_rope(k, c->n_head_kv, (int)hd, c->n_rot, cs, c->rope_neox);
        }
        break;
    case ROWS_ATT_ACT: {
        const model_matrix *w[1] = {&L->wo};
        act_rows(s, 1, w, s->att, f->n, t0, t1);
        break;
    }
    case ROWS_FFN_IN: {
        kern_add(s->x + t0 * d, s->xn + t0 * d, (int64_t)(t1 - t0) * d);
        for (int t = t0; t < t1; t++) kern_rmsnorm(s->xn + t * d, s->x + t * d, L->ffn_norm, d, c->norm_eps);
        const model_matrix *w[2] = {&L->w_gate, &L->w_up};
        act_rows(s, 2, w, s->xn, f->n, t0, t1);
        break;
    }
    case ROWS_FFN_ACT: {
        /* row by row: a row's elements meet the same vector lanes as alone */
        for (int t = t0; t < t1; t++) kern_swiglu(s->gate + t * ff, s->gate + t * ff, s->up + t * ff, ff);
        const model_matrix *w[1] = {&L->w_down};
        act_rows(s, 1, w, s->gate, f->n, t0, t1);
        break;
    }
    case ROWS_DOWN_OUT:
        kern_add(s->x + t0 * d, s->xn + t0 * d, (int64_t)(t1 - t0) * d);
        if (f->fuse && l + 1 < c->n_layer) rows_work(f, ROWS_ATTN_IN, l + 1, t0, t1);
        break;
    }
}

/* A matmul launch of the layer loop with its element-wise work: `pre` on
 * the rows before the matmul (which reads what it prepares), `post` after
 * it (on what it wrote). */
typedef struct {
    matmul_job mm;
    const fwd_pass *f;
    int layer, pre, post;
    atomic_int arrived; /* threadpool_barrier's counter */
} layer_job;

static void layer_task(void *arg, int ith, int nth) {
    layer_job *j = arg;
    long b, e; /* this thread's rows: whole groups of 4 (kern_act_prepare_rows) */
    threadpool_split(j->f->n, ith, nth, 4, &b, &e);
    int k = 0;
    if (j->pre) {
        rows_work(j->f, j->pre, j->layer, (int)b, (int)e);
        threadpool_barrier(&j->arrived, nth, ++k);
    }
    matmul_task(&j->mm, ith, nth);
    if (j->post) {
        threadpool_barrier(&j->arrived, nth, ++k);
        rows_work(j->f, j->post, j->layer, (int)b, (int)e);
    }
}

/* Y[i] (f->n rows of w[i]->rows) = X * w[i]^T for up to 3 matrices of one
 * input X, whose activations `pre` or an earlier step prepared (act_slots);
 * `pre` and `post` on the pool's threads with par, else on this one. */
static void layer_matmul(const fwd_pass *f, threadpool *pool, int par, int l, int n_w, const model_matrix *const *w,
                         float *const *Y, int pre, int post) {
    layer_job job = {.mm = {.n = n_w, .nb = f->n, .delta = f->s->w_delta, .by_matrix = f->s->by_matrix},
                     .f = f,
                     .layer = l,
                     .pre = par ? pre : ROWS_NONE,
                     .post = par ? post : ROWS_NONE};
    act_slots(f->s, n_w, w, f->n, job.mm.act);
    for (int i = 0; i < n_w; i++) {
        job.mm.w[i] = w[i];
        job.mm.y[i] = Y[i];
        job.mm.ldy[i] = w[i]->rows;
    }
    if (!par) rows_work(f, pre, l, 0, f->n);
    threadpool_run(pool, layer_task, &job);
    if (!par) rows_work(f, post, l, 0, f->n);
}

/* Stores the keys and values of positions [pos, pos + n) of layer l and
 * appends the keys to the sparse index. With the KV cache sharded, the cache
 * takes this rank's positions only and the index all of them. A quantized
 * cache holds other keys than computed, so the index summarizes the stored
 * ones (reloaded into k, which the caller no longer needs; context init
 * refuses a quantized cache with a sharded sparse index, whose positions'
 * stored keys would be on other ranks). */
static void store_kv(struct ellm_context *ctx, int l, int pos, int n, float *k, const float *v) {
    if (ctx->dist) dist_kv_store(ctx->dist, ctx->kv, l, pos, n, k, v);
    else kv_cache_store(ctx->kv, l, pos, n, k, v);
    if (!ctx->sidx) return;
    if (kv_cache_get_params(ctx->kv)->type == QTYPE_Q8_0) kv_cache_load_keys(ctx->kv, l, pos, n, k);
    sparse_index_append(ctx->sidx, l, pos, n, k);
}

/* Dense attention of aa, in this process or across the ranks. */
static void attend_dense(struct ellm_context *ctx, const attention_args *aa) {
    if (ctx->dist) dist_attention(ctx->dist, aa, NULL, NULL, 0, ctx->attn_ws, ctx->pool);
    else attention_forward(aa, ctx->attn_ws, ctx->pool);
}

/* Stores the layer's K/V of one sequence (rows already in ctx->s.q/k/v) and runs
 * its attention into ctx->s.att: sparse when its budget says so, else dense. */
static void attend_seq(struct ellm_context *ctx, int l, int n, int pos) {
    const model_config *c = &ctx->model->cfg;
    attention_args aa = {.kv = ctx->kv,
                         .layer = l,
                         .n_q = n,
                         .q_pos0 = pos,
                         .n_head = c->n_head,
                         .q = ctx->s.q,
                         .out = ctx->s.att,
                         .scale = 1.0f / sqrtf((float)c->head_dim)};
    if (n > 1 && n <= ENGINE_SPARSE_EXACT_ROWS && ctx->sidx && ctx->sparse_topk > 0 && !ctx->layer_dense[l]) {
        /* Sparse verification-sized batch: token by token, each storing its
         * key, choosing its own blocks from the index as it stood after that
         * key and attending to them, so every row equals a single-token step
         * (a verified draft gets the tokens sparse decode would). The weights
         * are still read once per batch. Longer batches (prefill chunks)
         * share one selection per tile. */
        const int64_t nq = (int64_t)c->n_head * c->head_dim, nkv = (int64_t)c->n_head_kv * c->head_dim;
        for (int t = 0; t < n; t++) {
            store_kv(ctx, l, pos + t, 1, ctx->s.k + t * nkv, ctx->s.v + t * nkv);
            attention_args at = aa;
            at.n_q = 1;
            at.q_pos0 = pos + t;
            at.q = ctx->s.q + t * nq;
            at.out = ctx->s.att + t * nq;
            if (sparse_attention_layer(ctx, &at, 1, pos + t + 1)) ctx->step_sparse = 1;
            else attend_dense(ctx, &at);
        }
        return;
    }
    /* With the KV cache sharded over MPI ranks (ctx->dist) each rank stores
     * its own positions, attends over them, and the ranks' partials are
     * merged; recall samples and calibration, which scan every key, are off
     * there (context init refuses them). */
    store_kv(ctx, l, pos, n, ctx->s.k, ctx->s.v);
    if (sparse_attention_layer(ctx, &aa, n, pos + n)) {
        ctx->step_sparse = 1;
        if (ctx->sample_recall) engine_sparse_sample_recall(ctx, l, pos + n);
    } else {
        attend_dense(ctx, &aa);
    }
    if (ctx->calib && n == 1 && ctx->stats.decode_steps % ctx->calib->sample_every == 0)
        engine_calibrate_layer(ctx, l, pos + n);
}

/* Batched decode: many sequences with a few rows each. Launching the pool for
 * each one's attention costs a barrier per sequence and layer (16 sequences x
 * 30 layers = 480 per pass), each for a few microseconds of work; instead
 * the threads take whole sequences from a shared counter in one launch per
 * layer, each attending on its own thread (attention_forward with no pool:
 * the same bits as on the pool's threads, see attention.c). A sequence takes
 * this path when its attention is plain dense attention over its own cache
 * (no sparse index to select from or append to, no MPI shards, no
 * calibration) and it feeds few rows; the others keep their own launches. */
#define ENGINE_SEQ_ATTN_ROWS 16

/* Plain dense attention over the sequence's own cache: nothing reads the
 * context's scratch (a sparse selection, its recall samples and calibration
 * do), so its rows are attended where they are in the batch scratch. A
 * server slot's scratch then is never touched, and its first step does not
 * wait for the kernel to fault those pages in. */
static int plain_dense(const struct ellm_context *ctx) { return !ctx->dist && !ctx->sidx && !ctx->calib; }

static int attend_on_one_thread(const struct ellm_context *ctx, int n) {
    return n <= ENGINE_SEQ_ATTN_ROWS && plain_dense(ctx);
}

/* Stores a plain dense sequence's n rows of K/V (k, v: n x nkv) at its
 * positions [pos, pos + n) of layer l and attends its queries q (n x nq)
 * into att, on the pool (NULL: on this thread, the same bits). */
static void attend_plain(struct ellm_context *ctx, int l, int n, int pos, const float *q, float *k, const float *v,
                         float *att, threadpool *pool) {
    const model_config *c = &ctx->model->cfg;
    store_kv(ctx, l, pos, n, k, v);
    attention_args aa = {.kv = ctx->kv,
                         .layer = l,
                         .n_q = n,
                         .q_pos0 = pos,
                         .n_head = c->n_head,
                         .q = q,
                         .out = att,
                         .scale = 1.0f / sqrtf((float)c->head_dim)};
    attention_forward(&aa, ctx->attn_ws, pool);
}

typedef struct {
    const engine_seq *seqs;
    const engine_scratch *s;
    const fwd_pass *f; /* the pass, whose ROWS_QKV_OUT a thread does on the rows of the sequences it takes */
    const int *seq;  /* (n) the sequences of the launch */
    const int *row;  /* (n) their first row in s */
    int n, layer;
    atomic_int next; /* the next entry of seq to take */
} seq_attn_job;

static void seq_attn_task(void *arg, int ith, int nth) {
    seq_attn_job *j = arg;
    (void)ith;
    (void)nth;
    for (int e; (e = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;) {
        const engine_seq *sq = &j->seqs[j->seq[e]];
        struct ellm_context *ctx = sq->ctx;
        const model_config *c = &ctx->model->cfg;
        const int64_t nq = (int64_t)c->n_head * c->head_dim, nkv = (int64_t)c->n_head_kv * c->head_dim;
        const int r = j->row[e];
        rows_work(j->f, ROWS_QKV_OUT, j->layer, r, r + sq->n);
        attend_plain(ctx, j->layer, sq->n, sq->pos, j->s->q + r * nq, j->s->k + r * nkv, j->s->v + r * nkv,
                     j->s->att + r * nq, NULL);
    }
}

/* After the layers of a pass: the logits of the rows each sequence wants,
 * normalized side by side into xn, in one matmul (into the sequence's
 * buffer when there is one). */
static void forward_logits(const ellm_model *m, const engine_scratch *s, threadpool *pool, float *logits_tmp,
                           const engine_seq *seqs, int n_seq) {
    const model_config *c = &m->cfg;
    const int64_t d = c->n_embd;
    int n_out = 0;
    for (int i = 0, r = 0; i < n_seq; r += seqs[i].n, i++)
        for (int t = seqs[i].first_logit_row; t < seqs[i].n; t++, n_out++) {
            if (!m->draft_map.data) kern_rmsnorm(s->xn + n_out * d, s->x + (r + t) * d, m->output_norm, d, c->norm_eps);
            else if (n_out != r + t) memmove(s->x + n_out * d, s->x + (r + t) * d, (size_t)d * 4); /* n_out <= r + t */
        }
    if (n_out <= 0) return;
    if (m->draft_map.data) {
        /* a shallow draft: the kept layers' stream mapped to the full
         * model's (model.h), then normalized */
        for (int o = 0; o < n_out && m->draft_map_norm; o++) {
            float *xr = s->x + (size_t)o * d;
            double ss = 0;
            for (int64_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
            float inv = 1.0f / sqrtf((float)(ss / (double)d) + c->norm_eps);
            for (int64_t i = 0; i < d; i++) xr[i] *= inv;
        }
        matmul(s, pool, &m->draft_map, s->x, n_out, s->xn, d);
        for (int o = 0; o < n_out; o++) kern_rmsnorm(s->xn + o * d, s->xn + o * d, m->output_norm, d, c->norm_eps);
    }
    if (n_seq == 1) {
        matmul(s, pool, &m->output, s->xn, n_out, seqs[0].logits, c->n_vocab);
        return;
    }
    /* several sequences: rows side by side in logits_tmp, each piece copied
     * to its sequence's buffer by the thread that computed it */
    float *dst[n_out];
    for (int i = 0, o = 0; i < n_seq; i++)
        for (int t = seqs[i].first_logit_row; t < seqs[i].n; t++, o++)
            dst[o] = seqs[i].logits + (size_t)(t - seqs[i].first_logit_row) * c->n_vocab;
    matmul_to(s, pool, &m->output, s->xn, n_out, logits_tmp, c->n_vocab, dst);
}

void engine_forward_seqs(const ellm_model *m, const engine_scratch *s, threadpool *pool, float *logits_tmp,
                         const engine_seq *seqs, int n_seq) {
    const model_config *c = &m->cfg;
    const int64_t d = c->n_embd, hd = c->head_dim, nq = (int64_t)c->n_head * hd,
                  nkv = (int64_t)c->n_head_kv * hd;
    /* One sequence in its own context's scratch needs no copies. */
    const int own = n_seq == 1 && s->q == seqs[0].ctx->s.q;
    const uint64_t t_start = ellm_time_ns();
    int n = 0;
    for (int i = 0; i < n_seq; i++) {
        struct ellm_context *ctx = seqs[i].ctx;
        ctx->step_sparse = 0;
        ctx->sample_recall = ctx->sidx && seqs[i].n == 1 && ctx->params.sparse_recall_every > 0 &&
                             ctx->stats.decode_steps % ctx->params.sparse_recall_every == 0;
        for (int t = 0; t < seqs[i].n; t++, n++) {
            model_matrix_row(&m->tok_embd, seqs[i].tokens[t], s->x + n * d);
            model_rope_cos_sin(m, seqs[i].pos + t, s->rope_cs + (size_t)n * c->n_rot);
        }
    }

    /* sequences whose attention runs on one thread each (needs 2 or more) */
    int one_seq[n_seq], one_row[n_seq], n_one = 0;
    for (int i = 0, r = 0; i < n_seq; r += seqs[i].n, i++)
        if (!own && attend_on_one_thread(seqs[i].ctx, seqs[i].n)) {
            one_seq[n_one] = i;
            one_row[n_one++] = r;
        }

    ellm_imatrix *imat = n_seq == 1 ? seqs[0].ctx->imatrix : NULL;
    /* A layer hook may change x after a layer: the next layer's norm then
     * waits for it instead of following the FFN's add. */
    const int hook = n_seq == 1 && seqs[0].ctx->layer_hook;
    const fwd_pass f = {.m = m, .s = s, .n = n, .fuse = !hook};
    const int par = n >= ELEMENTWISE_PAR_ROWS;
    /* the pass's time by part (ellm_context_stats), ns */
    uint64_t t_mm = 0, t_att = 0, t_mark = ellm_time_ns();
    for (int l = 0; l < c->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        int pre = l == 0 || !f.fuse ? ROWS_ATTN_IN : ROWS_NONE;
        if (imat) { /* observes the normalized input before the matmul */
            rows_work(&f, pre, l, 0, n);
            pre = ROWS_NONE;
            engine_imatrix_observe(imat, l, IM_ATTN_IN, s->xn, n);
        }
        const model_matrix *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *const yqkv[3] = {s->q, s->k, s->v};
        /* With sequences attended one per thread, each thread finishes the
         * q and k rows of those it takes (no barrier); the others' rows are
         * finished here before their attention. */
        layer_matmul(&f, pool, par, l, 3, wqkv, yqkv, pre, n_one > 1 ? ROWS_NONE : ROWS_QKV_OUT);
        uint64_t t = ellm_time_ns();
        t_mm += t - t_mark;
        t_mark = t;
        /* Attention reads each sequence's own KV: per sequence, on its rows;
         * those of one_seq[] in a single launch. */
        if (n_one > 1) {
            seq_attn_job job = {.seqs = seqs, .s = s, .f = &f, .seq = one_seq, .row = one_row, .n = n_one, .layer = l};
            atomic_init(&job.next, 0);
            threadpool_run(pool, seq_attn_task, &job);
        }
        for (int i = 0, r = 0; i < n_seq; r += seqs[i].n, i++) {
            struct ellm_context *ctx = seqs[i].ctx;
            const int ni = seqs[i].n;
            if (n_one > 1 && attend_on_one_thread(ctx, ni)) continue;
            if (n_one > 1) rows_work(&f, ROWS_QKV_OUT, l, r, r + ni);
            if (!own && plain_dense(ctx)) {
                attend_plain(ctx, l, ni, seqs[i].pos, s->q + r * nq, s->k + r * nkv, s->v + r * nkv, s->att + r * nq,
                             pool);
                continue;
            }
            if (!own) {
                memcpy(ctx->s.q, s->q + r * nq, (size_t)ni * nq * 4);
                memcpy(ctx->s.k, s->k + r * nkv, (size_t)ni * nkv * 4);
                memcpy(ctx->s.v, s->v + r * nkv, (size_t)ni * nkv * 4);
            }
            attend_seq(ctx, l, ni, seqs[i].pos);
            if (!own) memcpy(s->att + r * nq, ctx->s.att, (size_t)ni * nq * 4);
        }
        t = ellm_time_ns();
        t_att += t - t_mark;
        t_mark = t;
        /* x += Wo att  (xn holds the projection output until ROWS_FFN_IN adds it) */
        if (imat) engine_imatrix_observe(imat, l, IM_ATTN_OUT, s->att, n);
        const model_matrix *wo[1] = {&L->wo};
        float *const ywo[1] = {s->xn};
        layer_matmul(&f, pool, par, l, 1, wo, ywo, ROWS_ATT_ACT, ROWS_FFN_IN);
        if (imat) engine_imatrix_observe(imat, l, IM_FFN_IN, s->xn, n);
        const model_matrix *wgu[2] = {&L->w_gate, &L->w_up};
        float *const ygu[2] = {s->gate, s->up};
        layer_matmul(&f, pool, par, l, 2, wgu, ygu, ROWS_NONE, ROWS_FFN_ACT);
        if (imat) engine_imatrix_observe(imat, l, IM_FFN_DOWN, s->gate, n);
        const model_matrix *wd[1] = {&L->w_down};
        float *const yd[1] = {s->xn};
        layer_matmul(&f, pool, par, l, 1, wd, yd, ROWS_NONE, ROWS_DOWN_OUT);
        if (hook) seqs[0].ctx->layer_hook(seqs[0].ctx->layer_hook_arg, l, s->x, n);
        t = ellm_time_ns();
        t_mm += t - t_mark;
        t_mark = t;
    }
    for (int i = 0; i < n_seq; i++) {
        struct ellm_context *ctx = seqs[i].ctx;
        kv_cache_set_len(ctx->kv, seqs[i].pos + seqs[i].n);
        ctx->stats.decode_steps++;
        ctx->stats.sparse_steps += ctx->step_sparse;
        if (ctx->sample_recall && ctx->step_sparse && ctx->params.sparse_adapt) engine_sparse_adapt(ctx);
    }
    const uint64_t t_layers = ellm_time_ns();
    forward_logits(m, s, pool, logits_tmp, seqs, n_seq);
    const uint64_t t_end = ellm_time_ns();
    for (int i = 0; i < n_seq; i++) {
        ellm_context_stats *st = &seqs[i].ctx->stats;
        st->forward_ms += (double)(t_end - t_start) / 1e6;
        st->matmul_ms += (double)t_mm / 1e6;
        st->attention_ms += (double)t_att / 1e6;
        st->output_ms += (double)(t_end - t_layers) / 1e6;
    }
}

void engine_forward(struct ellm_context *ctx, const int32_t *tokens, int n, int pos,
                    int first_logit_row, float *logits) {
    engine_seq seq = {.ctx = ctx, .tokens = tokens, .n = n, .pos = pos,
                      .first_logit_row = first_logit_row, .logits = logits};
    engine_forward_seqs(ctx->model, &ctx->s, ctx->pool, NULL, &seq, 1);
}
