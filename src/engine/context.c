/* Context lifecycle and the public decode API. */
#include "core/meminfo.h"
#include "core/status.h"
#include "engine/engine_impl.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_BLOCK_TOKENS 16 /* finer blocks select better: see bench/RESULTS.md */
#define KV_PAGE_TOKENS (KV_PAGE_BLOCKS * KV_BLOCK_TOKENS) /* tokens per page of the KV pool */

ellm_context_params ellm_context_default_params(void) {
    ellm_context_params p;
    memset(&p, 0, sizeof p);
    p.kv_type = ELLM_KV_F16;
    p.n_batch = 256;
    p.sparse_sink_blocks = 1;
    p.sparse_window = 64;
    return p;
}

static void *xalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) return NULL;
    return p;
}

/* Largest prepared-activation size over every matmul of the model, for nb rows. */
static size_t max_act_bytes(const ellm_model *m, int nb) {
    size_t best = 0;
    const model_matrix *extra[2] = {&m->output, &m->tok_embd};
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        const model_matrix *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            size_t b = kern_act_bytes(ws[i]->type, ws[i]->cols, nb);
            if (b > best) best = b;
        }
    }
    if (m->draft_map.data) { /* a shallow draft's map (model.h) */
        size_t b = kern_act_bytes(m->draft_map.type, m->draft_map.cols, nb);
        if (b > best) best = b;
    }
    for (int i = 0; i < 2; i++) {
        size_t b = kern_act_bytes(extra[i]->type, extra[i]->cols, nb);
        if (b > best) best = b;
    }
    return best;
}

static int qtype_of(ellm_kv_type t) {
    return t == ELLM_KV_F32 ? QTYPE_F32 : t == ELLM_KV_Q8_0 ? QTYPE_Q8_0 : QTYPE_F16;
}

const char *ellm_kv_type_name(ellm_kv_type type) {
    if (type != ELLM_KV_F16 && type != ELLM_KV_F32 && type != ELLM_KV_Q8_0) return "unknown";
    return qtype_get(qtype_of(type))->name;
}

static kv_cache_params kv_params_of(const model_config *c, int n_ctx, int kv_type) {
    return (kv_cache_params){.n_layer = c->n_layer,
                             .n_kv_head = c->n_head_kv,
                             .head_dim = c->head_dim,
                             .n_ctx = n_ctx,
                             .block_tokens = KV_BLOCK_TOKENS,
                             .type = kv_type};
}

ellm_status ellm_kv_pool_init(const ellm_model *model, ellm_kv_type type, double gb, ellm_kv_pool **out,
                              ellm_error *err) {
    *out = NULL;
    if (!model) return ellm_fail(err, ELLM_ERR_ARG, "KV pool: no model");
    if (type != ELLM_KV_F16 && type != ELLM_KV_F32 && type != ELLM_KV_Q8_0)
        return ellm_fail(err, ELLM_ERR_ARG, "KV pool: unknown KV type %d", (int)type);
    kv_cache_params kp = kv_params_of(&model->cfg, KV_BLOCK_TOKENS, qtype_of(type));
    size_t page = kv_cache_page_bytes(&kp);
    double pages = gb * 1e9 / (double)page;
    if (!(pages >= 1))
        return ellm_fail(err, ELLM_ERR_ARG, "KV pool: %g GB is less than one page of %d tokens (%.3f MB)", gb,
                         KV_PAGE_TOKENS, (double)page / 1e6);
    if (pages > 1e12) pages = 1e12;
    ellm_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return ellm_fail(err, ELLM_ERR_NOMEM, "KV pool: out of memory");
    ellm_status st = kv_pool_init(page, (int64_t)pages, &p->pages, err);
    if (st) {
        free(p);
        return st;
    }
    /* A shared pool serves a server's sequences: keep a reserve of pages
     * committed (up to 64 MB, a quarter of the pool and an eighth of the
     * memory available; pages given back stay committed up to twice that) so
     * a step that needs a new page does not wait for the kernel to fault its
     * memory in. */
    size_t warm = (size_t)((double)page * (double)(int64_t)pages / 4);
    if (warm > ((size_t)64 << 20)) warm = (size_t)64 << 20;
    ellm_meminfo mi;
    ellm_meminfo_get(&mi);
    if (mi.known && warm > mi.available / 8) warm = mi.available / 8;
    if ((st = kv_pool_keep_warm(p->pages, warm, err))) {
        kv_pool_free(p->pages);
        free(p);
        return st;
    }
    p->kv_type = kp.type;
    p->page_tokens = KV_PAGE_TOKENS;
    p->owned = 1;
    *out = p;
    return ELLM_OK;
}

size_t ellm_kv_pool_page_bytes(const ellm_model *model, ellm_kv_type type) {
    kv_cache_params kp = kv_params_of(&model->cfg, KV_BLOCK_TOKENS, qtype_of(type));
    return kv_cache_page_bytes(&kp);
}

int ellm_kv_pool_page_tokens(void) { return KV_PAGE_TOKENS; }

void ellm_kv_pool_free(ellm_kv_pool *p) {
    if (!p || !p->owned) return;
    kv_pool_free(p->pages);
    free(p);
}

void ellm_kv_pool_get_stats(const ellm_kv_pool *p, ellm_kv_pool_stats *st) {
    st->pages_used = kv_pool_pages_used(p->pages);
    st->pages_total = kv_pool_pages_total(p->pages);
    st->page_tokens = p->page_tokens;
    st->page_bytes = kv_pool_page_bytes(p->pages);
}

int engine_scratch_init(const ellm_model *m, int rows, engine_scratch *s) {
    const model_config *c = &m->cfg;
    size_t B = (size_t)rows, d = (size_t)c->n_embd, hd = (size_t)c->head_dim;
    size_t nq = (size_t)c->n_head * hd, nkv = (size_t)c->n_head_kv * hd, ff = (size_t)c->n_ff;
    size_t wide = d > nq ? d : nq;
    memset(s, 0, sizeof *s);
    s->x = xalloc(B * d * 4);
    s->xn = xalloc(B * wide * 4);
    s->q = xalloc(B * nq * 4);
    s->k = xalloc(B * nkv * 4);
    s->v = xalloc(B * nkv * 4);
    s->att = xalloc(B * nq * 4);
    s->gate = xalloc(B * ff * 4);
    s->up = xalloc(B * ff * 4);
    s->rope_cs = xalloc(B * (size_t)c->n_rot * 4);
    s->act = xalloc(3 * ((max_act_bytes(m, rows) + 63) & ~(size_t)63));
    if (s->x && s->xn && s->q && s->k && s->v && s->att && s->gate && s->up && s->rope_cs && s->act) return 0;
    engine_scratch_free(s);
    return -1;
}

void engine_scratch_free(engine_scratch *s) {
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->gate);
    free(s->up);
    free(s->rope_cs);
    free(s->act);
    memset(s, 0, sizeof *s);
}

ellm_status ellm_context_init(ellm_model *model, const ellm_context_params *params,
                              ellm_context **out, ellm_error *err) {
    return engine_context_init(model, params, NULL, out, err);
}

ellm_status engine_context_init(ellm_model *model, const ellm_context_params *params, threadpool *shared_pool,
                                ellm_context **out, ellm_error *err) {
    *out = NULL;
    if (!model) return ellm_fail(err, ELLM_ERR_ARG, "context: no model");
    ellm_context_params p = params ? *params : ellm_context_default_params();
    const model_config *c = &model->cfg;
    if (p.kv_type != ELLM_KV_F16 && p.kv_type != ELLM_KV_F32 && p.kv_type != ELLM_KV_Q8_0)
        return ellm_fail(err, ELLM_ERR_ARG, "context: unknown KV type %d", (int)p.kv_type);
    int kv_type = qtype_of(p.kv_type);
    if (p.kv_pool && p.kv_pool->kv_type != kv_type)
        return ellm_fail(err, ELLM_ERR_ARG, "context: the shared KV pool holds another KV type");
    /* bytes of K and V per token over all layers (Q8_0: int8 and an F16 scale per 32) */
    size_t per_elem2 = kv_type == QTYPE_F32 ? 8 : kv_type == QTYPE_F16 ? 4 : 0;
    size_t per_token = (size_t)c->n_layer * c->n_head_kv *
                       (per_elem2 ? per_elem2 * c->head_dim : 2 * ((size_t)c->head_dim + (size_t)c->head_dim / 16));
    int64_t n_ctx = p.n_ctx;
    if (n_ctx <= 0 && p.kv_cache_gb > 0 && !p.kv_pool) n_ctx = (int64_t)(p.kv_cache_gb * 1e9 / (double)per_token);
    if (n_ctx <= 0) n_ctx = c->n_ctx_train;
    /* Sliding-window attention (Mistral's `sliding_window`) is not implemented.
     * In a context no longer than the window every query sees every earlier
     * key either way, so a default size is capped at the window and a longer
     * requested one is refused. */
    if (c->sliding_window > 0 && n_ctx > c->sliding_window) {
        if (p.n_ctx > 0)
            return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                             "context: %lld tokens exceed the model's attention window of %d tokens "
                             "(%s.attention.sliding_window); eLLM does not implement sliding-window "
                             "attention, so contexts of this model are limited to %d tokens",
                             (long long)n_ctx, c->sliding_window, c->arch_name, c->sliding_window);
        n_ctx = c->sliding_window;
    }
    if (n_ctx < 1 || n_ctx > (1 << 30))
        return ellm_fail(err, ELLM_ERR_ARG, "context: context size %lld is out of range", (long long)n_ctx);
    if (p.n_batch <= 0) p.n_batch = 256;
    if (p.n_batch > n_ctx) p.n_batch = (int)n_ctx;
    int n_threads = shared_pool ? threadpool_size(shared_pool) : p.n_threads > 0 ? p.n_threads : model->n_threads;
    /* Sharded over MPI ranks, a rank holds its own positions' keys and every
     * position's summaries in the sparse index (it computes every key), so
     * selections match one process's; what scans every key (recall samples,
     * the budget adaptation they drive) cannot run on a shard. */
    if (p.mpi && p.sparse_topk > 0 && (p.sparse_recall_every > 0 || p.sparse_adapt))
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "context: sparse recall sampling and --sparse-adapt read every key of the context, and "
                         "with the KV cache sharded over MPI ranks each rank holds only its own; turn them off");
    if (p.mpi && p.sparse_topk > 0 && p.kv_type == ELLM_KV_Q8_0)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                         "context: sparse attention with a q8_0 KV cache sharded over MPI ranks is not supported "
                         "(the index summarizes stored keys, which are on other ranks); use --kv-type f16");
    if (p.mpi && p.sparse_topk == 0) p.sparse_topk = -1; /* dense: no index to keep */

    ellm_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return ellm_fail(err, ELLM_ERR_NOMEM, "context: out of memory");
    ctx->model = model;
    ctx->params = p;
    ctx->n_ctx = (int)n_ctx;
    ctx->n_batch = p.n_batch;
    ellm_status st;
    kv_cache_params kp = kv_params_of(c, ctx->n_ctx, kv_type);
    /* A long context with a pool of its own takes longer pages (longer runs
     * of each head's blocks for dense attention to stream, kv_cache.h); a
     * shared pool keeps the grain its slots share it in. */
    if (!p.kv_pool) kp.page_blocks = kv_cache_own_page_blocks(ctx->n_ctx, KV_BLOCK_TOKENS);
    int64_t max_pages = 0; /* a private pool of n_ctx tokens */
    if (!p.kv_pool && p.kv_cache_gb > 0) { /* the ceiling of a private pool, at least a page */
        const int page_tokens = kp.page_blocks * KV_BLOCK_TOKENS;
        double pages = p.kv_cache_gb * 1e9 / (double)kv_cache_page_bytes(&kp);
        int64_t all = ((int64_t)n_ctx + page_tokens - 1) / page_tokens;
        max_pages = pages < 1 ? 1 : pages < (double)all ? (int64_t)pages : all;
    }
    ctx->pool = shared_pool;
    ctx->owns_pool = !shared_pool;
    if ((st = kv_cache_init_pooled(&kp, p.kv_pool ? p.kv_pool->pages : NULL, max_pages, &ctx->kv, err)) ||
        ((ctx->kv_pool_view = (struct ellm_kv_pool){.pages = kv_cache_pool(ctx->kv),
                                                     .kv_type = kv_type,
                                                     .page_tokens = kv_cache_page_tokens(ctx->kv)}),
         0) ||
        (!shared_pool && (st = engine_placement_init(ctx, n_threads, err))) ||
        (st = attention_workspace_init(n_threads, ctx->n_batch, c->n_head, c->head_dim, ctx->n_ctx,
                                       KV_BLOCK_TOKENS, &ctx->attn_ws, err)) ||
        (p.mpi && (st = dist_shard_init(p.mpi, ctx->n_batch, c->n_head, c->head_dim, ctx->n_ctx, KV_BLOCK_TOKENS,
                                        &ctx->dist, err)))) {
        ellm_context_free(ctx);
        return st;
    }
    ctx->logits = xalloc((size_t)c->n_vocab * 4);
    if (engine_scratch_init(model, ctx->n_batch, &ctx->s) || !ctx->logits) {
        ellm_context_free(ctx);
        return ellm_fail(err, ELLM_ERR_NOMEM, "context: out of memory for scratch buffers");
    }
    ctx->s.w_delta = ctx->w_delta;
    ctx->s.by_matrix = ctx->split_by_matrix;
    if (p.sparse_topk >= 0) { /* < 0: dense only, no index kept */
        if (p.sparse_sink_blocks < 0 || p.sparse_window < 0 || p.sparse_dense_layers < 0 ||
            p.sparse_recall_every < 0) {
            ellm_context_free(ctx);
            return ellm_fail(err, ELLM_ERR_ARG, "context: negative sparse attention parameter");
        }
        sparse_index_params sp = {.n_layer = c->n_layer,
                                  .n_kv_head = c->n_head_kv,
                                  .head_dim = c->head_dim,
                                  .n_ctx = ctx->n_ctx,
                                  .block_tokens = KV_BLOCK_TOKENS,
                                  .superblock_blocks = 0,
                                  /* Q8_0: the index folds the dequantized keys as they are */
                                  .key_type = kv_type == QTYPE_Q8_0 ? QTYPE_F32 : kv_type};
        if ((st = sparse_index_init(&sp, &ctx->sidx, err))) {
            ellm_context_free(ctx);
            return st;
        }
        size_t nlh = (size_t)c->n_layer * c->n_head_kv;
        ctx->max_blocks = kv_cache_n_blocks(ctx->kv);
        ctx->head_weight = malloc(nlh * sizeof *ctx->head_weight);
        ctx->recall_ema = malloc(nlh * sizeof *ctx->recall_ema);
        ctx->gain_ema = malloc(nlh * sizeof *ctx->gain_ema);
        ctx->layer_dense = calloc((size_t)c->n_layer, 1);
        ctx->sel_blocks = malloc((size_t)c->n_head_kv * ctx->max_blocks * sizeof *ctx->sel_blocks);
        ctx->sel_n = malloc((size_t)c->n_head_kv * sizeof *ctx->sel_n);
        ctx->head_sel_stats = calloc((size_t)c->n_head_kv, sizeof *ctx->head_sel_stats);
        ctx->head_select_ns = calloc((size_t)c->n_head_kv, sizeof *ctx->head_select_ns);
        if (!ctx->head_weight || !ctx->recall_ema || !ctx->gain_ema || !ctx->layer_dense || !ctx->sel_blocks ||
            !ctx->sel_n || !ctx->head_sel_stats || !ctx->head_select_ns) {
            ellm_context_free(ctx);
            return ellm_fail(err, ELLM_ERR_NOMEM, "context: out of memory for the sparse index");
        }
        for (size_t i = 0; i < nlh; i++) {
            ctx->head_weight[i] = 1.0f;
            ctx->recall_ema[i] = ctx->gain_ema[i] = -1.0f;
        }
        for (int l = 0; l < c->n_layer && l < p.sparse_dense_layers; l++) ctx->layer_dense[l] = 1;
        ctx->sparse_topk = p.sparse_topk;
    }
    *out = ctx;
    return ELLM_OK;
}

void ellm_context_free(ellm_context *ctx) {
    if (!ctx) return;
    kv_cache_free(ctx->kv);
    dist_shard_free(ctx->dist);
    attention_workspace_free(ctx->attn_ws);
    if (ctx->owns_pool) threadpool_free(ctx->pool);
    free(ctx->w_delta);
    engine_scratch_free(&ctx->s);
    free(ctx->logits);
    sparse_index_free(ctx->sidx);
    free(ctx->head_weight);
    free(ctx->recall_ema);
    free(ctx->gain_ema);
    free(ctx->probe_blocks);
    free(ctx->probe_n);
    free(ctx->lse_mem);
    free(ctx->lse_parts);
    free(ctx->layer_dense);
    free(ctx->sel_blocks);
    free(ctx->sel_n);
    free(ctx->head_sel_stats);
    free(ctx->head_select_ns);
    free(ctx);
}

int ellm_context_n_ctx(const ellm_context *ctx) { return ctx->n_ctx; }
int ellm_context_pos(const ellm_context *ctx) { return kv_cache_len(ctx->kv); }
int ellm_context_capacity(const ellm_context *ctx) { return kv_cache_capacity(ctx->kv); }
int ellm_context_room(const ellm_context *ctx) { return kv_cache_room(ctx->kv); }
int ellm_context_kv_pages(const ellm_context *ctx) { return kv_cache_pages_held(ctx->kv); }
const ellm_kv_pool *ellm_context_kv_pool(const ellm_context *ctx) { return &ctx->kv_pool_view; }

ellm_status ellm_context_reserve(ellm_context *ctx, int n_tokens, ellm_error *err) {
    return kv_cache_reserve(ctx->kv, n_tokens, err);
}

ellm_status ellm_context_truncate(ellm_context *ctx, int n_keep) {
    if (n_keep < 0 || n_keep > kv_cache_len(ctx->kv)) return ELLM_ERR_ARG;
    /* the index rebuilds a cut block from its keys, which a sharded cache
     * may hold on another rank */
    if (ctx->dist && ctx->sidx && n_keep % kv_cache_get_params(ctx->kv)->block_tokens) return ELLM_ERR_UNSUPPORTED;
    kv_cache_set_len(ctx->kv, n_keep);
    if (ctx->sidx) sparse_index_truncate(ctx->sidx, ctx->kv, n_keep);
    ctx->has_logits = 0;
    return ELLM_OK;
}

ellm_status ellm_context_copy_prefix(ellm_context *dst, const ellm_context *src, int n, ellm_error *err) {
    if (dst == src) return ellm_fail(err, ELLM_ERR_ARG, "copy prefix: a context onto itself");
    if (dst->sidx || src->sidx || dst->dist || src->dist)
        return ellm_fail(err, ELLM_ERR_UNSUPPORTED, "copy prefix: contexts with a sparse index or sharded KV");
    const kv_cache_params *a = kv_cache_get_params(dst->kv), *b = kv_cache_get_params(src->kv);
    if (dst->model != src->model || a->type != b->type || a->block_tokens != b->block_tokens ||
        a->page_blocks != b->page_blocks)
        return ellm_fail(err, ELLM_ERR_ARG, "copy prefix: contexts of different models or caches");
    if (n < 0 || n > kv_cache_len(src->kv) || n > a->n_ctx)
        return ellm_fail(err, ELLM_ERR_ARG, "copy prefix: %d tokens of a context at position %d", n, kv_cache_len(src->kv));
    ellm_context_truncate(dst, 0);
    ellm_status st = kv_cache_reserve(dst->kv, n, err);
    if (st != ELLM_OK) return st;
    kv_cache_copy_prefix(dst->kv, src->kv, n);
    return ELLM_OK;
}

ellm_status ellm_context_set_sparse(ellm_context *ctx, int sparse_topk, ellm_error *err) {
    if (sparse_topk < 0) return ellm_fail(err, ELLM_ERR_ARG, "sparse budget %d is negative", sparse_topk);
    if (sparse_topk > 0 && !ctx->sidx)
        return ellm_fail(err, ELLM_ERR_ARG, "this context was created dense-only (no sparse index)");
    ctx->sparse_topk = sparse_topk;
    return ELLM_OK;
}

/* Reads the next line that is not blank or a '#' comment into buf; 0 at EOF. */
static int next_line(FILE *f, char *buf, size_t cap) {
    while (fgets(buf, (int)cap, f)) {
        char *p = buf;
        while (*p == ' ' || *p == '\t') p++;
        if (*p && *p != '#' && *p != '\n' && *p != '\r') return 1;
    }
    return 0;
}

ellm_status ellm_context_load_sparse_profile(ellm_context *ctx, const char *path, ellm_error *err) {
    const model_config *c = &ctx->model->cfg;
    if (!ctx->sidx) return ellm_fail(err, ELLM_ERR_ARG, "this context was created dense-only (no sparse index)");
    if (!path) {
        for (int i = 0; i < c->n_layer * c->n_head_kv; i++) {
            ctx->head_weight[i] = 1.0f;
            ctx->recall_ema[i] = ctx->gain_ema[i] = -1.0f;
        }
        for (int l = 0; l < c->n_layer; l++) ctx->layer_dense[l] = l < ctx->params.sparse_dense_layers;
        return ELLM_OK;
    }
    FILE *f = fopen(path, "r");
    if (!f) return ellm_fail(err, ELLM_ERR_IO, "sparse profile '%s': cannot open", path);
    char line[4096], magic[64] = {0};
    int version = 0, nl = 0, nh = 0;
    ellm_status st = ELLM_OK;
    size_t nlh = (size_t)c->n_layer * c->n_head_kv;
    float *w = malloc(nlh * sizeof *w);
    unsigned char *dense = calloc((size_t)c->n_layer, 1);
    if (!w || !dense) {
        st = ellm_fail(err, ELLM_ERR_NOMEM, "sparse profile: out of memory");
        goto out;
    }
    if (!next_line(f, line, sizeof line) || sscanf(line, "%63s %d", magic, &version) != 2 ||
        strcmp(magic, "ellm-sparse-profile") || version != 1) {
        st = ellm_fail(err, ELLM_ERR_FORMAT, "sparse profile '%s': not an ellm-sparse-profile v1 file", path);
        goto out;
    }
    if (!next_line(f, line, sizeof line) || sscanf(line, "layers %d kv_heads %d", &nl, &nh) != 2 ||
        nl != c->n_layer || nh != c->n_head_kv) {
        st = ellm_fail(err, ELLM_ERR_FORMAT,
                       "sparse profile '%s': made for %d layers x %d KV heads, this model has %d x %d", path,
                       nl, nh, c->n_layer, c->n_head_kv);
        goto out;
    }
    for (int l = 0; l < c->n_layer && st == ELLM_OK; l++) {
        int li, used = 0;
        char kind[16] = {0};
        if (!next_line(f, line, sizeof line) || sscanf(line, "layer %d %15s %n", &li, kind, &used) != 2 ||
            li != l || (strcmp(kind, "dense") && strcmp(kind, "sparse"))) {
            st = ellm_fail(err, ELLM_ERR_FORMAT, "sparse profile '%s': expected 'layer %d dense|sparse ...'", path, l);
            break;
        }
        dense[l] = !strcmp(kind, "dense");
        const char *p = line + used;
        for (int h = 0; h < c->n_head_kv; h++) {
            char *end;
            float x = strtof(p, &end);
            if (end == p || !(x > 0 && x <= SPARSE_MAX_HEAD_WEIGHT)) {
                st = ellm_fail(err, ELLM_ERR_FORMAT,
                               "sparse profile '%s': layer %d head %d: weight missing or outside (0, 64]", path, l, h);
                break;
            }
            w[l * c->n_head_kv + h] = x;
            p = end;
        }
    }
    if (st == ELLM_OK) {
        for (size_t i = 0; i < nlh; i++) ctx->recall_ema[i] = ctx->gain_ema[i] = -1.0f;
        memcpy(ctx->head_weight, w, nlh * sizeof *w);
        memcpy(ctx->layer_dense, dense, (size_t)c->n_layer);
    }
out:
    fclose(f);
    free(w);
    free(dense);
    return st;
}

void ellm_context_set_sparse_adapt(ellm_context *ctx, int on) { ctx->params.sparse_adapt = on; }

void ellm_context_get_stats(const ellm_context *ctx, ellm_context_stats *stats) {
    *stats = ctx->stats;
    stats->attended_tokens = ctx->n_sparse_heads ? ctx->attended_sum / (double)ctx->n_sparse_heads : 0;
    stats->sparse_selections = ctx->n_sparse_heads;
    stats->attended_share = ctx->n_sparse_heads ? ctx->attended_share_sum / (double)ctx->n_sparse_heads : 0;
    stats->index_bytes_read = (double)ctx->sel_stats.bytes_read;
    stats->index_flat_bytes = (double)ctx->sel_stats.flat_bytes;
    if (ctx->dist) {
        dist_stats ds;
        dist_get_stats(ctx->dist, &ds);
        stats->mpi_ranks = dist_size(ctx->dist);
        stats->mpi_local_tokens = dist_local_tokens(ctx->dist, kv_cache_len(ctx->kv));
        stats->mpi_exchanges = ds.exchanges;
        stats->mpi_bytes_sent = ds.bytes_sent;
        stats->mpi_bytes_recv = ds.bytes_recv;
        stats->mpi_exchange_ms = ds.exchange_ms;
        stats->mpi_merge_ms = ds.merge_ms;
        stats->mpi_parts_ms = ds.compute_ms;
    }
}

ellm_status ellm_decode(ellm_context *ctx, const int32_t *tokens, int n, float *logits,
                        ellm_error *err) {
    if (n <= 0) return ellm_fail(err, ELLM_ERR_ARG, "decode: no tokens given");
    int pos = kv_cache_len(ctx->kv);
    if ((int64_t)pos + n > ctx->n_ctx)
        return ellm_fail(err, ELLM_ERR_CONTEXT_FULL,
                         "decode: %d tokens at position %d exceed the context size %d", n, pos,
                         ctx->n_ctx);
    const int n_vocab = ctx->model->cfg.n_vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return ellm_fail(err, ELLM_ERR_ARG, "decode: token id %d at index %d is outside the vocabulary [0, %d)",
                             tokens[i], i, n_vocab);
    ellm_status st = kv_cache_reserve(ctx->kv, pos + n, err);
    if (st) return st;
    for (int done = 0; done < n;) {
        int chunk = n - done < ctx->n_batch ? n - done : ctx->n_batch;
        int last = done + chunk == n;
        if (logits) {
            engine_forward(ctx, tokens + done, chunk, pos + done, 0, logits + (size_t)done * n_vocab);
            if (last) memcpy(ctx->logits, logits + (size_t)(n - 1) * n_vocab, (size_t)n_vocab * 4);
        } else {
            engine_forward(ctx, tokens + done, chunk, pos + done, last ? chunk - 1 : chunk, ctx->logits);
        }
        done += chunk;
        if (ctx->dist && dist_failed(ctx->dist)) {
            ctx->has_logits = 0;
            return ellm_fail(err, ELLM_ERR_IO, "decode: %s", dist_failed(ctx->dist));
        }
    }
    ctx->has_logits = 1;
    return ELLM_OK;
}

const float *ellm_context_logits(const ellm_context *ctx) { return ctx->has_logits ? ctx->logits : NULL; }
