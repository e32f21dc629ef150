/* Scheduler and engine thread (see sched.h). */
#include "server/sched.h"
#include "core/meminfo.h"
#include "topology/probe.h"
#include "server/sched_mpi.h"
#include "server/step_cost.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KV_BLOCK 16 /* tokens per KV cache block (the engine's; the pool's pages hold several) */
/* While sequences generate, a step takes prompt rows only up to this many
 * times the time of its decode rows alone (step_cost.h): their inter-token
 * gap stays within 2.5x of a plain step while a prompt's time to first token
 * grows by about 2.5 / 1.5 = 1.7x over a prefill alone. */
#define STEP_PREFILL_RATIO 2.5
/* ...but at least this many prompt rows, so a prompt always moves on. */
#define STEP_PREFILL_MIN_ROWS 16
/* Bytes of logits a job that scores its prompt (echo with logprobs) keeps:
 * the rows of a prefill pass (all but the prompt's last token, whose pass
 * leaves its logits in the context), at most the server's prefill chunk (on a
 * 2-vCPU machine, SmolLM2-135M: 32 rows per pass scored at 0.65-0.8 of the
 * plain prefill's tokens/s, 128 rows at 0.8-0.9; bench/run_scoring.mjs). */
#define SCORE_ROWS_BYTES ((size_t)32 << 20)

/* Tokens one step can give a job: a speculative step's draft_max (<= 31)
 * drafts, its first token and one drawn on a rejection. */
#define STEP_TOKENS_MAX 64

typedef struct {
    ellm_context *ctx;
    int32_t *tokens; /* (n_ctx) the tokens whose K/V the context holds */
    int n_tokens;
    job *job;        /* NULL: idle */
    int io;          /* being saved or restored (POST /slots): neither admitted to nor evicted */
    uint64_t last_used;
    ellm_spec *spec; /* --spec: the slot's speculative state, or NULL */
    int n_hist;      /* --spec: tokens of the sequence so far (the last may not be fed yet) */
    int n_exact;     /* leading tokens whose K/V a prompt fed alone from position 0 gives too (sparse_from) */
    /* This step's outcome for the slot's job (engine thread): the tokens a
     * speculative step drew, how many of them the job emits, the length of
     * its text that may be shown after each, and its finish reason. */
    int32_t step_out[STEP_TOKENS_MAX];
    int n_out, n_emit;
    size_t shows[STEP_TOKENS_MAX];
    logprobs_token lp[STEP_TOKENS_MAX]; /* the step's tokens', when its job asked for logprobs */
    int lp_ready;                       /* a speculative step's lp[] are set (not from the spec state) */
    const char *fin;
} slot;

struct sched {
    ellm_model *model;
    sched_params p;
    server_metrics *metrics;
    ellm_batch *batch;
    ellm_kv_pool *kv_pool; /* every slot's KV pages: taken as sequences grow */
    slot *slots;
    int n_ctx;
    char memory_note[200]; /* the KV pool asked for is larger than the memory available, or "" */
    int n_vocab;           /* floats in a row of logits */
    int score_rows;        /* prompt rows per pass of a job that scores its prompt (SCORE_ROWS_BYTES) */
    /* Sparse attention: passes whose last token sees more keys than this
     * (a multiple of sparse_chunk; INT_MAX when dense) select blocks for all
     * their rows at once, so their K/V depend on how the prompt was cut:
     * from there prompts are fed in whole chunks of sparse_chunk rows at
     * multiples of it, whatever else runs (prompt_piece) */
    int sparse_from, sparse_chunk;
    int share_prefix;      /* slots may copy a prompt's KV from each other (ellm_context_copy_prefix) */
    double bw_gbps;        /* read bandwidth measured at start */
    uint64_t weight_bytes; /* weight bytes one pass reads */
    size_t kv_bytes_per_token;

    pthread_mutex_t mu;
    pthread_cond_t cv_engine; /* new work, cancellations, stop */
    pthread_cond_t cv_idle;   /* every job finished (drain) */
    job *queue_head, *queue_tail;
    int n_queued, n_running;
    int n_outstanding; /* submitted jobs the HTTP side has not released */
    int draining, stop;
    uint64_t use_clock;
    sched_mpi *mpi;  /* --mpi: the passes run on every rank (sched_mpi.h), or NULL */
    char lost[480];  /* --mpi: why the server lost a rank (lock held), or "" */
    pthread_t thread;
    int thread_started;

    /* engine-thread scratch for one step */
    ellm_context **step_ctx;
    const int32_t **step_tok;
    int *step_n;
    job **step_job;
    float **step_rows;  /* a speculative verify's logits of every row, or NULL */
    int *step_spec;     /* speculative slots of this step */
    job **step_extra;   /* jobs of this step outside the pass (a speculative step complete before it) */
    uint8_t *json_allow; /* JSON mode: the tokens allowed next (n_vocab) ... */
    float *json_logits;  /* ... and the logits with the others at -inf */
    int rr; /* round-robin start among generating slots */
    double bw_t0, bw_bytes;
    step_cost cost; /* pass time against rows, for the prefill budget */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sched_lock(sched *s) { pthread_mutex_lock(&s->mu); }
void sched_unlock(sched *s) { pthread_mutex_unlock(&s->mu); }
int sched_n_ctx(const sched *s) { return s->n_ctx; }

const char *sched_memory_note(const sched *s) { return s->memory_note; }

/* JSON mode (json_mask.h): the vocabulary's bytes and ends of generation. */
static const char *json_token_bytes(const void *model, int32_t id, size_t *len) {
    return ellm_tokenizer_token_bytes(ellm_model_tokenizer(model), id, len);
}
static int json_token_eog(const void *model, int32_t id) { return ellm_token_is_eog(model, id); }

/* Job j's logits with every token that would leave JSON at -inf (engine
 * thread; s's scratch). A reply that can go nowhere (nesting at the cap
 * with nothing to close it) may only end. */
static const float *json_masked(sched *s, job *j, const float *logits) {
    const int n = json_allowed(&j->json, s->n_vocab, json_token_bytes, json_token_eog, s->model, s->json_allow);
    for (int i = 0; i < s->n_vocab; i++) {
        const int ok = n ? s->json_allow[i] : json_token_eog(s->model, i);
        s->json_logits[i] = ok ? logits[i] : -INFINITY;
    }
    return s->json_logits;
}

/* Moves job j's JSON state past the token it drew. */
static void json_advance(sched *s, job *j, int32_t tok) {
    size_t len = 0;
    const char *b = json_token_eog(s->model, tok) ? NULL : json_token_bytes(s->model, tok, &len);
    if (b && len) (void)json_feed(&j->json, b, len);
}

job *job_new(req_params *p, const int32_t *prompt, int n_prompt) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->prompt = malloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof *j->prompt);
    if (!j->prompt) {
        free(j);
        return NULL;
    }
    memcpy(j->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    j->n_prompt = n_prompt;
    j->p = *p;
    memset(p, 0, sizeof *p);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->slot = -1;
    j->t_arrive = now_s();
    json_state_init(&j->json);
    return j;
}

static void job_free(job *j) {
    req_params_free(&j->p);
    ellm_sampler_free(j->sampler);
    pthread_cond_destroy(&j->cv);
    free(j->prompt);
    free(j->text);
    free(j->tok_end);
    free(j->lps);
    free(j->prompt_lps);
    free(j->prompt_rows);
    free(j->gen);
    free(j);
}

/* Drops a reference; the lock is held. */
static void job_unref(job *j) {
    if (--j->refs == 0) job_free(j);
}

/* Gauges of the scheduler (lock held): KV blocks are the pool's, counted in
 * the cache's 16-token blocks (a page holds page_tokens / 16 of them); a
 * slot's pages stay in use after its request (kept for prefix reuse) until a
 * cancellation, the next request or a pool that needs them drops them. */
static void update_gauges(sched *s) {
    ellm_kv_pool_stats ps;
    ellm_kv_pool_get_stats(s->kv_pool, &ps);
    const int per_page = ps.page_tokens / KV_BLOCK;
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->requests_running = s->n_running;
    s->metrics->requests_waiting = s->n_queued;
    s->metrics->kv_blocks_used = (int)(ps.pages_used * per_page);
    s->metrics->kv_blocks_total = (int)(ps.pages_total * per_page);
    pthread_mutex_unlock(&s->metrics->mu);
}

static void *engine_main(void *arg);

ellm_status sched_init(ellm_model *model, const sched_params *params, server_metrics *metrics, sched **out,
                       ellm_error *err) {
    *out = NULL;
    sched_params p = *params;
    if (p.n_slots < 1 || p.n_slots > 256)
        return (err ? snprintf(err->msg, sizeof err->msg, "--parallel %d is out of range [1, 256]", p.n_slots) : 0),
               ELLM_ERR_ARG;
    if (p.n_batch < 1) p.n_batch = p.n_slots;
    if (p.chunk < 1) p.chunk = 128;
    if (p.draft_max <= 0) p.draft_max = ellm_spec_default_params().draft_max;
    if (p.max_queue < 0) p.max_queue = 0;
    ellm_model_info info;
    ellm_model_get_info(model, &info);
    sched *s = calloc(1, sizeof *s);
    if (!s) return ELLM_ERR_NOMEM;
    s->model = model;
    s->metrics = metrics;
    s->n_ctx = p.n_ctx > 0 ? p.n_ctx : info.n_ctx_train;
    s->n_vocab = info.n_vocab;
    const size_t fit = SCORE_ROWS_BYTES / ((size_t)info.n_vocab * sizeof(float));
    s->score_rows = fit < 16 ? 16 : fit > (size_t)p.chunk ? p.chunk : (int)fit;
    /* One pool of KV pages for all slots (K and V of --kv-type): --kv-cache-gb, else
     * every slot's full context, capped at 80% of the memory available now
     * (MemAvailable, or less where the process's memory cgroup, e.g. a
     * container's limit, leaves less). A sequence takes pages as it grows; a
     * request is limited to what the whole pool holds. */
    const size_t page_bytes = ellm_kv_pool_page_bytes(model, p.kv_type);
    const int page_tokens = ellm_kv_pool_page_tokens();
    double pool_bytes = p.kv_cache_gb > 0 ? p.kv_cache_gb * 1e9
                                          : ((double)p.n_slots * ((s->n_ctx + page_tokens - 1) / page_tokens) + 0.5) *
                                                (double)page_bytes;
    ellm_meminfo mi;
    ellm_meminfo_get(&mi);
    const int capped = p.kv_cache_gb <= 0 && mi.known && pool_bytes > 0.8 * (double)mi.available;
    if (capped) pool_bytes = 0.8 * (double)mi.available;
    ellm_status pst = ellm_kv_pool_init(model, p.kv_type, pool_bytes / 1e9, &s->kv_pool, err);
    if (pst != ELLM_OK) {
        free(s);
        return pst;
    }
    {
        ellm_kv_pool_stats ps;
        ellm_kv_pool_get_stats(s->kv_pool, &ps);
        double pool_tokens = (double)ps.pages_total * ps.page_tokens;
        if (pool_tokens < 2) {
            if (err && capped)
                snprintf(err->msg, sizeof err->msg,
                         "the memory available (%.3g GB%s) holds fewer than 2 tokens of KV cache; pass --kv-cache-gb",
                         mi.available / 1e9, mi.cgroup_bound ? ", the memory cgroup's limit" : "");
            else if (err)
                snprintf(err->msg, sizeof err->msg, "--kv-cache-gb %g holds fewer than 2 tokens", p.kv_cache_gb);
            ellm_kv_pool_free(s->kv_pool);
            free(s);
            return ELLM_ERR_ARG;
        }
        if (pool_tokens < s->n_ctx) s->n_ctx = (int)pool_tokens;
    }
    if (p.chunk > s->n_ctx) p.chunk = s->n_ctx;
    /* --kv-cache-gb beyond what the process may take: its pages are taken as
     * sequences grow, so it starts, but a full pool would be killed (a
     * container's limit) or swap; said at start, while nothing is lost */
    if (p.kv_cache_gb > 0 && mi.known && pool_bytes > (double)mi.available)
        snprintf(s->memory_note, sizeof s->memory_note,
                 "--kv-cache-gb %g is more than the %.2f GB of memory available%s: a full pool may get the "
                 "server killed",
                 p.kv_cache_gb, mi.available / 1e9, mi.cgroup_bound ? " (memory cgroup limit)" : "");
    s->p = p;
    s->weight_bytes = info.decode_weight_bytes;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_engine, NULL);
    pthread_cond_init(&s->cv_idle, NULL);
    /* rows of a pass: a token per decoding sequence (a speculative one's
     * verify takes up to draft_max + 1) and the prompt rows */
    int max_rows = p.n_batch * (p.spec ? p.draft_max + 1 : 1) + p.chunk;
    ellm_status st = ellm_batch_init(model, p.n_threads, max_rows, &s->batch, err);
    s->slots = calloc((size_t)p.n_slots, sizeof *s->slots);
    s->step_ctx = calloc((size_t)p.n_slots, sizeof *s->step_ctx);
    s->step_tok = calloc((size_t)p.n_slots, sizeof *s->step_tok);
    s->step_n = calloc((size_t)p.n_slots, sizeof *s->step_n);
    s->step_job = calloc((size_t)p.n_slots, sizeof *s->step_job);
    s->step_rows = calloc((size_t)p.n_slots, sizeof *s->step_rows);
    s->step_spec = calloc((size_t)p.n_slots, sizeof *s->step_spec);
    s->step_extra = calloc((size_t)p.n_slots, sizeof *s->step_extra);
    s->json_allow = malloc((size_t)s->n_vocab);
    s->json_logits = malloc((size_t)s->n_vocab * sizeof *s->json_logits);
    if (st == ELLM_OK && (!s->slots || !s->step_ctx || !s->step_tok || !s->step_n || !s->step_job || !s->step_rows ||
                          !s->step_spec || !s->step_extra || !s->json_allow || !s->json_logits))
        st = ELLM_ERR_NOMEM;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = s->n_ctx;
    cp.n_batch = p.chunk;
    cp.kv_pool = s->kv_pool;
    cp.kv_type = p.kv_type;
    cp.sparse_topk = p.sparse_topk > 0 ? p.sparse_topk : -1; /* dense: no index kept */
    cp.sparse_recall_every = p.sparse_topk > 0 && !p.mpi ? 64 : 0; /* a shard does not hold every key */
    cp.mpi = p.mpi;
    if (p.spec && p.sparse_topk <= 0 && strstr(p.spec, "sparse")) cp.sparse_topk = 0; /* the drafter's index */
    s->share_prefix = cp.sparse_topk < 0 && !p.mpi; /* no index to rebuild, every key on this rank */
    s->sparse_chunk = p.chunk < s->score_rows ? p.chunk : s->score_rows; /* a scored pass keeps all its rows */
    s->sparse_from = INT_MAX;
    if (p.spec && cp.n_batch < p.draft_max + 1) cp.n_batch = p.draft_max + 1;
    for (int i = 0; i < p.n_slots && st == ELLM_OK; i++) {
        st = ellm_batch_context_init(s->batch, &cp, &s->slots[i].ctx, err);
        if (st == ELLM_OK && p.sparse_profile)
            st = ellm_context_load_sparse_profile(s->slots[i].ctx, p.sparse_profile, err);
        if (st == ELLM_OK && p.sparse_topk > 0) {
            const int dense_len = ellm_context_sparse_dense_len(s->slots[i].ctx);
            const int from = dense_len - dense_len % s->sparse_chunk;
            if (from < s->sparse_from) s->sparse_from = from;
        }
        /* room for a speculative step's tokens beyond a full context */
        if (st == ELLM_OK && !(s->slots[i].tokens = malloc((size_t)(s->n_ctx + 64) * sizeof(int32_t)))) st = ELLM_ERR_NOMEM;
        if (st == ELLM_OK && p.spec) {
            ellm_spec_params spp = ellm_spec_default_params();
            spp.drafters = p.spec;
            spp.draft_max = p.draft_max;
            spp.draft_map = p.draft_map;
            spp.verify_sparse = p.sparse_topk > 0;
            spp.adapt = 1;
            st = ellm_spec_init(s->slots[i].ctx, &spp, &s->slots[i].spec, err);
        }
    }
    if (st == ELLM_OK) s->kv_bytes_per_token = ellm_context_kv_bytes_per_token(s->slots[0].ctx);
    if (st == ELLM_OK && p.mpi) {
        ellm_context *ctxs[p.n_slots];
        for (int i = 0; i < p.n_slots; i++) ctxs[i] = s->slots[i].ctx;
        sched_mpi_setup su = {.n_slots = p.n_slots, .max_rows = max_rows, .n_ctx = s->n_ctx, .ctx_batch = cp.n_batch,
                              .sparse_topk = cp.sparse_topk, .pool_gb = pool_bytes / 1e9};
        st = sched_mpi_leader_init(p.mpi, &su, ctxs, &s->mpi, err);
    }
    if (st == ELLM_OK) {
        /* The bandwidth ellm_mem_bandwidth_util divides by (over a buffer
         * past the caches, within a small container's memory). */
        s->bw_gbps = ellm_measure_read_gbps(p.n_threads > 0 ? p.n_threads : ellm_default_threads(),
                                            probe_test_bytes(NULL), 2);
        if (pthread_create(&s->thread, NULL, engine_main, s) != 0) st = ELLM_ERR_NOMEM;
        else s->thread_started = 1;
    }
    if (st != ELLM_OK) {
        if (err && st == ELLM_ERR_NOMEM && !err->msg[0]) snprintf(err->msg, sizeof err->msg, "scheduler: out of memory");
        sched_free(s);
        return st;
    }
    *out = s;
    return ELLM_OK;
}

void sched_free(sched *s) {
    if (!s) return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv_engine);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    sched_mpi_free(s->mpi); /* the followers stop with the engine thread */
    for (int i = 0; s->slots && i < s->p.n_slots; i++) {
        ellm_spec_free(s->slots[i].spec);
        ellm_context_free(s->slots[i].ctx);
        free(s->slots[i].tokens);
    }
    /* Jobs still referenced belong to HTTP threads, which are gone by now. */
    free(s->slots);
    free(s->json_allow);
    free(s->json_logits);
    free(s->step_ctx);
    free(s->step_tok);
    free(s->step_n);
    free(s->step_job);
    free(s->step_rows);
    free(s->step_spec);
    free(s->step_extra);
    ellm_batch_free(s->batch);
    ellm_kv_pool_free(s->kv_pool);
    pthread_cond_destroy(&s->cv_engine);
    pthread_cond_destroy(&s->cv_idle);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

submit_result sched_submit(sched *s, job *j, ellm_error *err) {
    if (j->n_prompt < 1 || j->n_prompt >= s->n_ctx) {
        snprintf(err->msg, sizeof err->msg,
                 "the prompt is %d tokens; this server's context holds %d tokens per request (prompt plus at least one "
                 "generated token)",
                 j->n_prompt, s->n_ctx);
        return SUBMIT_BAD;
    }
    pthread_mutex_lock(&s->mu);
    submit_result r = SUBMIT_OK;
    int free_slots = s->p.n_slots - s->n_running;
    if (s->lost[0]) {
        snprintf(err->msg, sizeof err->msg, "%s", s->lost);
        r = SUBMIT_UNAVAILABLE;
    } else if (s->draining) r = SUBMIT_DRAINING;
    else if (s->n_queued >= s->p.max_queue + (free_slots > 0 ? free_slots : 0)) r = SUBMIT_QUEUE_FULL;
    if (r == SUBMIT_OK) {
        j->refs++; /* the scheduler's */
        j->submitted = 1;
        s->n_outstanding++;
        j->next = NULL;
        if (s->queue_tail) s->queue_tail->next = j;
        else s->queue_head = j;
        s->queue_tail = j;
        s->n_queued++;
        pthread_cond_signal(&s->cv_engine);
    }
    if (r == SUBMIT_OK) update_gauges(s);
    pthread_mutex_unlock(&s->mu);
    return r;
}

void sched_release(sched *s, job *j) {
    pthread_mutex_lock(&s->mu);
    if (!j->done && j->refs > 1) {
        j->cancelled = 1;
        pthread_cond_signal(&s->cv_engine);
    }
    if (j->submitted && --s->n_outstanding == 0) pthread_cond_broadcast(&s->cv_idle);
    job_unref(j);
    pthread_mutex_unlock(&s->mu);
}

void sched_wait(sched *s, job *j, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&j->cv, &s->mu, &ts);
}

void sched_drain(sched *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    /* until every response has been sent, not only generated */
    while (s->n_queued || s->n_running || s->n_outstanding) pthread_cond_wait(&s->cv_idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* ---- slot save / restore ------------------------------------------------------ */

static int reserve_kv(sched *s, slot *sl, int n_tokens);

/* Claims idle slot `id` for file I/O (lock taken and released here). */
static slot_result claim_slot(sched *s, int id, ellm_error *err) {
    if (id < 0 || id >= s->p.n_slots) {
        snprintf(err->msg, sizeof err->msg, "slot %d does not exist (this server has slots 0 to %d)", id,
                 s->p.n_slots - 1);
        return SLOT_BAD_ID;
    }
    pthread_mutex_lock(&s->mu);
    slot *sl = &s->slots[id];
    slot_result r = SLOT_OK;
    if (sl->job || sl->io) {
        snprintf(err->msg, sizeof err->msg, "slot %d is processing a request; try again when it is idle", id);
        r = SLOT_BUSY;
    } else {
        sl->io = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

slot_result sched_slot_save(sched *s, int id, const char *path, int *n_tokens, ellm_error *err) {
    slot_result r = claim_slot(s, id, err);
    if (r != SLOT_OK) return r;
    /* The engine thread leaves a claimed slot alone: no lock needed for its context. */
    slot *sl = &s->slots[id];
    *n_tokens = sl->n_tokens;
    if (ellm_context_state_save(sl->ctx, path, sl->tokens, (size_t)sl->n_tokens * sizeof(int32_t), err) != ELLM_OK)
        r = SLOT_FAILED;
    pthread_mutex_lock(&s->mu);
    sl->io = 0;
    pthread_mutex_unlock(&s->mu);
    return r;
}

slot_result sched_slot_restore(sched *s, int id, const char *path, int *n_tokens, ellm_error *err) {
    void *app = NULL;
    size_t app_len = 0;
    if (id < 0 || id >= s->p.n_slots) return claim_slot(s, id, err);
    if (ellm_state_read_app(path, &app, &app_len, err) != ELLM_OK) return SLOT_FAILED;
    if (app_len % sizeof(int32_t) || app_len / sizeof(int32_t) > (size_t)s->n_ctx) {
        snprintf(err->msg, sizeof err->msg, "state file '%s' does not hold a slot of this server (%zu token bytes)",
                 path, app_len);
        ellm_free(app);
        return SLOT_FAILED;
    }
    const int n = (int)(app_len / sizeof(int32_t));
    for (int i = 0; i < n; i++) { /* the tokens are compared with prompts' and may be fed again */
        int32_t t;
        memcpy(&t, (const char *)app + (size_t)i * sizeof t, sizeof t);
        if (t < 0 || t >= s->n_vocab) {
            snprintf(err->msg, sizeof err->msg, "state file '%s': token %d at position %d is outside the vocabulary [0, %d)",
                     path, t, i, s->n_vocab);
            ellm_free(app);
            return SLOT_FAILED;
        }
    }
    slot_result r = claim_slot(s, id, err);
    if (r != SLOT_OK) {
        ellm_free(app);
        return r;
    }
    slot *sl = &s->slots[id];
    pthread_mutex_lock(&s->mu);
    int room = reserve_kv(s, sl, n); /* other idle slots give up their KV if the pool is short */
    pthread_mutex_unlock(&s->mu);
    if (!room) {
        snprintf(err->msg, sizeof err->msg, "the KV pool cannot hold the %d tokens of '%s' now (requests are running)",
                 n, path);
        r = SLOT_BUSY;
    } else if (ellm_context_state_load(sl->ctx, path, err) != ELLM_OK) {
        r = SLOT_FAILED;
    } else if (ellm_context_pos(sl->ctx) != n) {
        snprintf(err->msg, sizeof err->msg, "state file '%s' holds %d positions for %d tokens", path,
                 ellm_context_pos(sl->ctx), n);
        ellm_context_truncate(sl->ctx, 0);
        r = SLOT_FAILED;
    } else {
        memcpy(sl->tokens, app, app_len);
    }
    pthread_mutex_lock(&s->mu);
    /* the tokens describe what the context holds (a failed load left it as it was or emptied it) */
    if (r != SLOT_OK && ellm_context_pos(sl->ctx) != sl->n_tokens) {
        ellm_context_truncate(sl->ctx, 0);
        sl->n_tokens = 0;
    }
    if (r == SLOT_OK) sl->n_tokens = n;
    sl->n_exact = 0; /* how the file's K/V was computed is not known: only up to sparse_from */
    sl->io = 0;
    sl->last_used = ++s->use_clock;
    update_gauges(s);
    pthread_mutex_unlock(&s->mu);
    *n_tokens = n;
    ellm_free(app);
    return r;
}

/* ---- engine thread ---------------------------------------------------------- */

static int append(char **buf, size_t *len, size_t *cap, const char *src, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = 2 * *cap + n + 64;
        char *b = realloc(*buf, c);
        if (!b) return 0;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    (*buf)[*len] = 0;
    return 1;
}

/* Ends a job (the lock is held): publishes the outcome, frees its slot for
 * the next request. A cancelled job's KV is dropped; a finished one's is kept
 * for prefix reuse. */
static void finish_job(sched *s, job *j, const char *finish) {
    slot *sl = j->slot >= 0 ? &s->slots[j->slot] : NULL;
    j->done = 1;
    j->finish = finish;
    if (sl) {
        if (!finish) {
            ellm_context_truncate(sl->ctx, 0);
            sl->n_tokens = 0;
        }
        sl->job = NULL;
        sl->last_used = ++s->use_clock;
        s->n_running--;
    }
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->requests_total[finish ? REQ_STATUS_OK : j->failed ? REQ_STATUS_ERROR : REQ_STATUS_CANCELLED]++;
    s->metrics->prompt_tokens_total += (uint64_t)j->n_prompt;
    pthread_mutex_unlock(&s->metrics->mu);
    pthread_cond_broadcast(&j->cv);
    job_unref(j);
    if (!s->n_running && !s->n_queued) pthread_cond_broadcast(&s->cv_idle);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Takes KV pages for positions [0, n_tokens) of slot `sl` (lock held). When
 * the pool is short, idle slots give up the KV they kept for prefix reuse,
 * least recently used first. Returns 0 if the pool still cannot give them. */
static int reserve_kv(sched *s, slot *sl, int n_tokens) {
    while (ellm_context_reserve(sl->ctx, n_tokens, NULL) != ELLM_OK) {
        slot *victim = NULL;
        for (int i = 0; i < s->p.n_slots; i++) {
            slot *o = &s->slots[i];
            if (o != sl && !o->job && !o->io && ellm_context_kv_pages(o->ctx) > 0 && (!victim || o->last_used < victim->last_used))
                victim = o;
        }
        if (!victim) return 0;
        ellm_context_truncate(victim->ctx, 0); /* gives back all its pages */
        victim->n_tokens = 0;
    }
    return 1;
}

/* Ends job j because the pool is full of running sequences (lock held), with
 * what the detokenizer and the stop check held back. */
static void finish_pool_full(sched *s, job *j) {
    char tail[64];
    int nb = ellm_detok_flush(&j->dt, tail, sizeof tail);
    if (nb > 0) append(&j->gen, &j->gen_len, &j->gen_cap, tail, (size_t)nb);
    if (j->gen_len > j->gen_emitted &&
        append(&j->text, &j->text_len, &j->text_cap, j->gen + j->gen_emitted, j->gen_len - j->gen_emitted))
        j->gen_emitted = j->gen_len;
    finish_job(s, j, "length");
}

/* 1 if the job scores its prompt: each prompt token's log-probability is
 * computed from the rows of its prefill (echo with logprobs). */
static int scores_prompt(const job *j) { return j->p.echo && j->p.logprobs; }

/* n tokens, cut back past sparse_from to a whole chunk (sparse_from is a
 * multiple of sparse_chunk): what whole-chunk passes of a prompt's first n
 * tokens leave exact. */
static int whole_chunks(const sched *s, int n) {
    return n <= s->sparse_from ? n : n - (n - s->sparse_from) % s->sparse_chunk;
}

/* Leading tokens of sl's K/V that equal what a prompt fed alone from
 * position 0 gives: every token before sparse_from (dense passes), and a
 * finished prompt's whole chunks past it. */
static int exact_tokens(const sched *s, const slot *sl) {
    const int own = sl->n_exact < sl->n_tokens ? sl->n_exact : sl->n_tokens;
    const int dense = sl->n_tokens < s->sparse_from ? sl->n_tokens : s->sparse_from;
    return own > dense ? own : dense;
}

/* Tokens of job j's prompt that slot sl may keep from its cache, given the
 * common prefix lcp: at least the prompt's last token is fed again (for its
 * logits); a scored prompt keeps none (every row's logits are needed); a
 * sharded sparse index is cut at whole blocks only (ellm_context_truncate);
 * past sparse_from, only the K/V a fresh prefill in whole chunks gives. */
static int reusable_tokens(const sched *s, const slot *sl, const job *j, int lcp) {
    if (scores_prompt(j)) return 0;
    int keep = lcp < j->n_prompt - 1 ? lcp : j->n_prompt - 1;
    if (s->p.mpi && s->p.sparse_topk > 0) keep -= keep % KV_BLOCK;
    const int exact = exact_tokens(s, sl);
    if (keep > exact) keep = exact;
    return whole_chunks(s, keep);
}

/* Rows of j's prompt a step feeds, given `budget` rows: any up to
 * sparse_from; past it a whole chunk (sparse_chunk rows at a multiple of
 * sparse_chunk, or up to the prompt's end), even over the budget, so the K/V
 * are those of the prompt fed alone, or by `ellm run -b sparse_chunk`. */
static int prompt_piece(const sched *s, const job *j, int budget) {
    if (j->n_fed >= s->sparse_from) {
        const int end = (j->n_fed / s->sparse_chunk + 1) * s->sparse_chunk;
        return (end < j->n_prompt ? end : j->n_prompt) - j->n_fed;
    }
    int c = j->n_prompt - j->n_fed < budget ? j->n_prompt - j->n_fed : budget;
    if (c > s->sparse_from - j->n_fed) c = s->sparse_from - j->n_fed;
    return c;
}

/* Copying a prompt's KV from another slot pays from this many tokens. */
#define SHARE_MIN_TOKENS 16
#define SHARE_WAIT (-2)

/* Another running slot whose KV holds more of job j's prompt than slot sl's
 * own cache (*keep tokens): its index, with *keep raised to what it holds
 * (at most the prompt but its last token, fed again for its logits); -1 if
 * none; SHARE_WAIT if a running job is still computing a prompt that shares
 * at least half of j's and more than any slot holds now (the n choices of
 * one prompt, several requests with one long system prompt): j then waits
 * and copies it, instead of computing it again beside it (lock held). */
static int share_source(const sched *s, const job *j, const slot *sl, int *keep) {
    if (!s->share_prefix || scores_prompt(j) || j->n_prompt - 1 < SHARE_MIN_TOKENS) return -1;
    int from = -1, best = *keep, coming = 0;
    for (int i = 0; i < s->p.n_slots; i++) {
        const slot *o = &s->slots[i];
        if (!o->job || o == sl) continue;
        const int have = common_prefix(o->tokens, o->n_tokens, j->prompt, j->n_prompt - 1);
        if (have > best) {
            best = have;
            from = i;
        }
        const job *r = o->job;
        const int shared = common_prefix(r->prompt, r->n_prompt, j->prompt, j->n_prompt - 1);
        if (!r->generating && shared * 2 >= j->n_prompt && shared > coming) coming = shared;
    }
    if (coming > best && coming - best >= SHARE_MIN_TOKENS) return SHARE_WAIT;
    if (from < 0 || best - *keep < SHARE_MIN_TOKENS) return -1;
    *keep = best;
    return from;
}

/* Moves queued jobs into idle slots (lock held), oldest first. The slot whose cached tokens
 * share the longest prefix with the prompt wins (ties: the least recently
 * used) if that prefix is at least half the prompt. At least the prompt's last token is fed again, for its logits.
 * A job is admitted only when the KV pool can hold its prompt and first
 * generated token; otherwise it (and every job behind it) waits for
 * running requests to end and give their pages back. */
static void admit(sched *s) {
    while (s->queue_head && s->n_running < s->p.n_slots) {
        job *j = s->queue_head;
        if (j->cancelled) {
            s->queue_head = j->next;
            if (!s->queue_head) s->queue_tail = NULL;
            s->n_queued--;
            finish_job(s, j, NULL);
            continue;
        }
        int best = -1, best_lcp = -1;
        for (int i = 0; i < s->p.n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->job || sl->io) continue;
            int lcp = common_prefix(sl->tokens, sl->n_tokens, j->prompt, j->n_prompt);
            if (lcp > best_lcp || (lcp == best_lcp && sl->last_used < s->slots[best].last_used)) {
                best = i;
                best_lcp = lcp;
            }
        }
        /* A short shared prefix (BOS, a template header) is not worth
         * evicting another conversation's cache: take the least recently
         * used idle slot instead (never-used slots first). */
        if (best < 0) break; /* the free slots are being saved or restored */
        if (best_lcp * 2 < j->n_prompt) {
            for (int i = 0; i < s->p.n_slots; i++)
                if (!s->slots[i].job && !s->slots[i].io && s->slots[i].last_used < s->slots[best].last_used) best = i;
            best_lcp = common_prefix(s->slots[best].tokens, s->slots[best].n_tokens, j->prompt, j->n_prompt);
        }
        if (scores_prompt(j) && !j->prompt_rows) {
            /* a pass keeps at most score_rows rows, and only of the prompt but its last token */
            const int scored = j->n_prompt - 1 > 0 ? j->n_prompt - 1 : 1;
            const int rows = scored < s->score_rows ? scored : s->score_rows;
            j->prompt_rows = malloc((size_t)rows * (size_t)s->n_vocab * sizeof *j->prompt_rows);
            j->prompt_lps = calloc((size_t)j->n_prompt, sizeof *j->prompt_lps);
            if (!j->prompt_rows || !j->prompt_lps) {
                s->queue_head = j->next;
                if (!s->queue_head) s->queue_tail = NULL;
                s->n_queued--;
                j->failed = 1;
                snprintf(j->errmsg, sizeof j->errmsg, "out of memory for the prompt's log-probabilities");
                finish_job(s, j, NULL);
                continue;
            }
            j->prompt_lps[0] = (logprobs_token){.chosen = {j->prompt[0], NAN}, .n_top = 0};
        }
        slot *sl = &s->slots[best];
        const int own = reusable_tokens(s, sl, j, best_lcp);
        int keep = own;
        const int from = share_source(s, j, sl, &keep);
        if (from == SHARE_WAIT) break; /* at the head of the queue until that prompt is computed */
        ellm_error cerr = {0};
        if (from < 0 || ellm_context_copy_prefix(sl->ctx, s->slots[from].ctx, keep, &cerr) != ELLM_OK) {
            keep = own; /* the pool is short for a copy: its own cache */
            ellm_context_truncate(sl->ctx, keep);
        } else {
            memcpy(sl->tokens, j->prompt, (size_t)keep * sizeof *sl->tokens);
        }
        sl->n_tokens = keep;
        sl->n_exact = keep;
        if (!reserve_kv(s, sl, j->n_prompt + 1)) break; /* waits at the head of the queue */
        s->queue_head = j->next;
        if (!s->queue_head) s->queue_tail = NULL;
        s->n_queued--;
        sl->job = j;
        if (sl->spec) ellm_spec_reset(sl->spec); /* a new sequence */
        j->slot = best;
        j->n_fed = keep;
        j->n_cached = keep;
        j->generating = 0;
        memset(&j->dt, 0, sizeof j->dt);
        j->dt.n_emitted = 1; /* a continuation: keep the first piece's leading space, as `ellm run` does */
        s->n_running++;
        /* a speculative slot keeps the logits of each step's tokens for logprobs */
        ellm_error err = {0};
        if (sl->spec && ellm_spec_keep_logits(sl->spec, j->p.logprobs, &err) != ELLM_OK) {
            j->failed = 1;
            snprintf(j->errmsg, sizeof j->errmsg, "%s", err.msg);
            finish_job(s, j, NULL);
        }
    }
}

/* Text of `gen` that may be shown: all of it unless its end could be the
 * start of a stop string. */
static size_t safe_len(const job *j) {
    size_t safe = j->gen_len;
    for (int i = 0; i < j->p.n_stop; i++) {
        size_t sl = strlen(j->p.stop[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k >= 1; k--) {
            if (k <= j->gen_len && !memcmp(j->gen + j->gen_len - k, j->p.stop[i], k)) {
                if (j->gen_len - k < safe) safe = j->gen_len - k;
                break;
            }
        }
    }
    return safe;
}

/* Shows one more generated token to the HTTP side (lock held): gen[gen_emitted,
 * show) joins the job's text and the token gets its own entry in tok_end (and
 * lps, from *lp, when the job asked for log-probabilities), so its stream
 * sends a chunk for it now, with whatever text it completed (maybe none). Out
 * of memory, the text still joins and goes out with a later chunk. */
static void publish_token(job *j, size_t show, const logprobs_token *lp) {
    if (show > j->gen_emitted && append(&j->text, &j->text_len, &j->text_cap, j->gen + j->gen_emitted, show - j->gen_emitted))
        j->gen_emitted = show;
    if (j->n_tok == j->tok_cap) {
        int cap = j->tok_cap ? 2 * j->tok_cap : 64;
        if (j->p.logprobs) {
            logprobs_token *l = realloc(j->lps, (size_t)cap * sizeof *l);
            if (!l) return;
            j->lps = l;
        }
        size_t *t = realloc(j->tok_end, (size_t)cap * sizeof *t);
        if (!t) return;
        j->tok_end = t;
        j->tok_cap = cap;
    }
    if (j->p.logprobs) j->lps[j->n_tok] = *lp;
    j->tok_end[j->n_tok++] = j->text_len;
}

/* Text of gen that may be shown after a token: all of it once the job ends
 * (what the detokenizer held back flushed first), else up to a possible
 * stop-string prefix (engine thread, no lock). */
static size_t shown_after(job *j, const char *fin) {
    if (!fin) return safe_len(j);
    char tail[64];
    int nb = ellm_detok_flush(&j->dt, tail, sizeof tail);
    if (nb > 0) append(&j->gen, &j->gen_len, &j->gen_cap, tail, (size_t)nb);
    return j->gen_len;
}

/* With logprobs asked, *out for token tok drawn from logits (engine thread);
 * an end-of-generation token that ends the job is marked as not shown. */
static void token_lp(const sched *s, const job *j, const float *logits, int32_t tok, logprobs_token *out) {
    if (!j->p.logprobs) return;
    if (!logits) { /* a speculative state that did not keep its rows: shown without a log-probability */
        *out = (logprobs_token){.chosen = {tok, NAN}};
        return;
    }
    logprobs_compute(logits, s->n_vocab, tok, j->p.top_logprobs, out);
    if (ellm_token_is_eog(s->model, tok) && !j->p.ignore_eos) out->chosen.id = -1;
}

/* Handles the token sampled for job j after a pass (engine thread, no lock).
 * Returns the finish reason, or NULL to continue. */
static const char *on_token(sched *s, job *j, slot *sl, int32_t tok) {
    j->n_gen++;
    if (ellm_token_is_eog(s->model, tok) && !j->p.ignore_eos) return "stop";
    char piece[4096];
    int nb = ellm_detok_push(s->model, &j->dt, tok, piece, sizeof piece);
    size_t old = j->gen_len;
    if (nb > 0 && !append(&j->gen, &j->gen_len, &j->gen_cap, piece, (size_t)nb)) return "length";
    for (int i = 0; i < j->p.n_stop; i++) {
        size_t sl_len = strlen(j->p.stop[i]);
        size_t from = old >= sl_len ? old - sl_len + 1 : 0;
        char *hit = j->gen_len >= sl_len ? memmem(j->gen + from, j->gen_len - from, j->p.stop[i], sl_len) : NULL;
        if (hit) {
            j->gen_len = (size_t)(hit - j->gen);
            j->gen[j->gen_len] = 0;
            memset(&j->dt, 0, sizeof j->dt); /* nothing more to flush */
            return "stop";
        }
    }
    if (j->p.max_tokens >= 0 && j->n_gen >= j->p.max_tokens) return "length";
    if (sl->n_tokens + 1 > s->n_ctx) return "length"; /* the token cannot be fed: context full */
    return NULL;
}

/* The first half of a speculative step of job j (engine thread, no lock):
 * its first token and drafts (ellm_spec_draft_step) into sl->step_out. Returns
 * the number of tokens its verify must feed in this step's pass (*feed, with
 * the logits of every row to *rows), 0 if the step is complete without one,
 * or -1 if it failed (j->failed). */
static int spec_draft_job(sched *s, job *j, slot *sl, const int32_t **feed, float **rows) {
    ellm_error err = {0};
    int n_feed = 0;
    sl->n_out = 0;
    if (ellm_context_pos(sl->ctx) >= s->n_ctx) { /* full: one last token from the logits, never fed */
        const float *logits = ellm_context_logits(sl->ctx);
        sl->step_out[sl->n_out++] = ellm_sampler_sample(j->sampler, logits, sl->tokens, sl->n_hist);
        token_lp(s, j, logits, sl->step_out[0], &sl->lp[0]);
        sl->lp_ready = 1;
        return 0;
    }
    sl->lp_ready = 0;
    int left = j->p.max_tokens >= 0 ? j->p.max_tokens - j->n_gen : 1 << 30;
    if (ellm_spec_draft_step(sl->spec, j->sampler, sl->tokens, sl->n_hist, left > 0 ? left : 1, sl->step_out, &sl->n_out,
                             feed, &n_feed, rows, &err) != ELLM_OK) {
        j->failed = 1;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", err.msg);
        return -1;
    }
    return n_feed;
}

/* The end of a speculative step of job j (engine thread, no lock): the
 * tokens in sl->step_out go through on_token as if sampled one at a time,
 * each judged against the KV length at its own position; sl->n_emit and
 * sl->shows say what the job emits. Returns the finish reason or NULL. */
static const char *spec_finish_job(sched *s, job *j, slot *sl) {
    ellm_context *ctx = sl->ctx;
    ellm_error err = {0};
    const int base = sl->n_hist, n_out = sl->n_out;
    sl->n_emit = 0;
    /* all of them: the KV may hold tokens beyond a stop within this step */
    memcpy(sl->tokens + base, sl->step_out, (size_t)n_out * sizeof *sl->step_out);
    if (n_out == 0) { /* a pending token fed with no draft: nothing new yet */
        sl->n_tokens = ellm_context_pos(ctx);
        return NULL;
    }
    const char *fin = NULL;
    int i = 0;
    while (i < n_out && !fin) {
        sl->n_tokens = base + i; /* what the KV held when this token was drawn */
        if (!sl->lp_ready) token_lp(s, j, ellm_spec_token_logits(sl->spec, i), sl->step_out[i], &sl->lp[i]);
        fin = on_token(s, j, sl, sl->step_out[i]);
        sl->shows[i] = shown_after(j, fin);
        i++;
    }
    sl->n_emit = i;
    sl->n_hist = base + i;
    j->last = sl->step_out[i - 1];
    /* an end-of-generation token the step left unfed, generation going on
     * (ignore_eos): feed it, as plain decoding does */
    if (!fin && ellm_context_pos(ctx) == sl->n_hist - 1 && ellm_token_is_eog(s->model, j->last) &&
        ellm_decode(ctx, &j->last, 1, NULL, &err) != ELLM_OK) {
        j->failed = 1;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", err.msg);
    }
    sl->n_tokens = ellm_context_pos(ctx); /* the KV (sl->tokens holds them) */
    return fin;
}

/* ellm_spec_acceptance_rate (accepted over drafted tokens, all slots, since
 * start) and ellm_sparse_recall (mean sampled recall of the slots that
 * sampled any) for /metrics; engine thread, lock held. */
static void update_quality_metrics(sched *s) {
    int64_t acc = 0, prop = 0, n_recall = 0;
    double recall = 0;
    for (int i = 0; i < s->p.n_slots; i++) {
        if (s->slots[i].spec) {
            ellm_spec_stats st;
            ellm_spec_get_stats(s->slots[i].spec, &st);
            acc += st.accepted;
            prop += st.proposed;
        }
        if (s->p.sparse_topk > 0) {
            ellm_context_stats cs;
            ellm_context_get_stats(s->slots[i].ctx, &cs);
            if (cs.recall_samples > 0) recall += cs.sparse_recall, n_recall++;
        }
    }
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->spec_acceptance_rate = prop ? (double)acc / (double)prop : 0;
    s->metrics->sparse_recall = n_recall ? recall / (double)n_recall : 0;
    pthread_mutex_unlock(&s->metrics->mu);
}

int sched_unavailable(sched *s, char *msg, size_t cap) {
    pthread_mutex_lock(&s->mu);
    int lost = s->lost[0] != 0;
    if (lost && cap) snprintf(msg, cap, "%s", s->lost);
    pthread_mutex_unlock(&s->mu);
    return lost;
}

/* --mpi (engine thread, lock held): once a rank is lost no pass can run;
 * every queued and running job fails with the reason (503) and the engine
 * thread only waits to be stopped. Returns 1 if lost. */
static int mpi_lost(sched *s) {
    const char *why = sched_mpi_lost(s->mpi);
    if (!why) return 0;
    if (!s->lost[0]) {
        snprintf(s->lost, sizeof s->lost, "the server lost an MPI rank: %.440s", why);
        fprintf(stderr, "ellm serve: %s\n", s->lost);
    }
    for (int i = 0; i < s->p.n_slots; i++) {
        job *j = s->slots[i].job;
        if (!j) continue;
        j->failed = j->unavailable = 1;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", s->lost);
        finish_job(s, j, NULL);
    }
    while (s->queue_head) {
        job *j = s->queue_head;
        s->queue_head = j->next;
        s->n_queued--;
        j->failed = j->unavailable = 1;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", s->lost);
        finish_job(s, j, NULL);
    }
    s->queue_tail = NULL;
    update_gauges(s);
    if (!s->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->cv_engine, &s->mu, &ts);
    }
    return 1;
}

static void *engine_main(void *arg) {
    sched *s = arg;
    pthread_mutex_lock(&s->mu);
    s->bw_t0 = now_s();
    while (!s->stop) {
        double t_sched = now_s();
        /* cancellations first: their slots and KV are free for this step */
        for (int i = 0; i < s->p.n_slots; i++)
            if (s->slots[i].job && s->slots[i].job->cancelled) finish_job(s, s->slots[i].job, NULL);
        if (s->mpi && mpi_lost(s)) continue;
        admit(s);
        update_gauges(s);
        if (!s->n_running) {
            sched_mpi_ping(s->mpi, 1.0); /* a lost rank shows on /health without traffic */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&s->cv_engine, &s->mu, &ts);
            pthread_mutex_lock(&s->metrics->mu);
            s->metrics->mem_bandwidth_util = 0; /* idle */
            pthread_mutex_unlock(&s->metrics->mu);
            s->bw_t0 = now_s();
            s->bw_bytes = 0;
            continue;
        }
        /* One step: a token for each generating sequence (round robin when
         * more than n_batch; a speculative one verifies its drafts), then
         * prompt rows, oldest prompt first, up to the budget that keeps the
         * step short while sequences generate. */
        int ns = 0, rows = 0, n_prefilling = 0, n_spec = 0, n_extra = 0;
        int any_rows = 0; /* a sequence of the pass wants the logits of every row (a verify, a scored prompt) */
        for (int i = 0; i < s->p.n_slots; i++)
            if (s->slots[i].job && !s->slots[i].job->generating) n_prefilling++;
        int max_decode = s->p.n_batch - (n_prefilling > 0 && s->p.n_batch > 1 ? 1 : 0);
        for (int k = 0; k < s->p.n_slots && ns + n_spec < max_decode; k++) {
            int i = (s->rr + k) % s->p.n_slots;
            slot *sl = &s->slots[i];
            job *j = sl->job;
            if (!j || !j->generating) continue;
            /* a speculative step writes up to draft_max + 1 tokens: their
             * pages come from the pool as plain decoding's do */
            int need = sl->spec ? sl->n_tokens + s->p.draft_max + 1 : sl->n_tokens + 1;
            if (!reserve_kv(s, sl, need < s->n_ctx ? need : s->n_ctx)) {
                finish_pool_full(s, j);
                continue;
            }
            if (sl->spec) {
                s->step_spec[n_spec++] = i; /* drafts after the lock is released */
                continue;
            }
            s->step_ctx[ns] = sl->ctx;
            s->step_tok[ns] = &j->last;
            s->step_n[ns] = 1;
            s->step_rows[ns] = NULL;
            s->step_job[ns++] = j;
            rows++;
        }
        s->rr = (s->rr + 1) % s->p.n_slots;
        /* one prompt arriving among running streams gets the budget; a burst
         * of prompts (more than the sequences generating) a full chunk */
        int prompt_rows = step_cost_prefill_rows(&s->cost, ns + n_spec, rows + n_spec, n_prefilling, STEP_PREFILL_RATIO,
                                                 STEP_PREFILL_MIN_ROWS, s->p.chunk);
        while (ns < s->p.n_batch && prompt_rows > 0) {
            job *pick = NULL;
            for (int i = 0; i < s->p.n_slots; i++) {
                job *j = s->slots[i].job;
                if (!j || j->generating) continue;
                int taken = 0;
                for (int k = 0; k < ns; k++) taken |= s->step_job[k] == j;
                if (!taken && (!pick || j->t_arrive < pick->t_arrive)) pick = j;
            }
            if (!pick) break;
            int c = prompt_piece(s, pick, prompt_rows);
            /* a scored prompt keeps the rows of all but its last token (row r
             * scores token r + 1); the last goes in a pass of its own, which
             * leaves its logits in the context, as any prompt does */
            const int scored = scores_prompt(pick) && pick->n_fed < pick->n_prompt - 1;
            if (scored && c > pick->n_prompt - 1 - pick->n_fed) c = pick->n_prompt - 1 - pick->n_fed;
            if (scored && c > s->score_rows) c = s->score_rows;
            prompt_rows -= c;
            s->step_ctx[ns] = s->slots[pick->slot].ctx;
            s->step_tok[ns] = pick->prompt + pick->n_fed;
            s->step_n[ns] = c;
            s->step_rows[ns] = scored ? pick->prompt_rows : NULL;
            any_rows |= s->step_rows[ns] != NULL;
            s->step_job[ns++] = pick;
            rows += c;
        }
        pthread_mutex_unlock(&s->mu);

        /* speculative slots draft, and join the pass with their verify rows
         * (their logits equal a verify pass of their own, bit for bit) */
        double t_draft = now_s();
        for (int q = 0; q < n_spec; q++) {
            slot *sl = &s->slots[s->step_spec[q]];
            job *j = sl->job;
            const int32_t *feed = NULL;
            float *vrows = NULL;
            int n_feed = spec_draft_job(s, j, sl, &feed, &vrows);
            sl->fin = NULL;
            sl->n_emit = 0;
            if (n_feed > 0) {
                s->step_ctx[ns] = sl->ctx;
                s->step_tok[ns] = feed;
                s->step_n[ns] = n_feed;
                s->step_rows[ns] = vrows;
                s->step_job[ns++] = j;
                rows += n_feed;
                any_rows = 1;
                continue;
            }
            if (n_feed == 0) sl->fin = spec_finish_job(s, j, sl);
            s->step_extra[n_extra++] = j;
        }

        ellm_error err = {0};
        double t0 = now_s();
        ellm_status st = ELLM_OK;
        if (ns && any_rows) /* neither speculation nor prompt scoring under --mpi */
            st = ellm_decode_batch_rows(s->batch, s->step_ctx, s->step_tok, s->step_n, ns, s->step_rows, &err);
        else if (ns)
            st = sched_mpi_decode_batch(s->mpi, s->batch, s->step_ctx, s->step_tok, s->step_n, ns, &err);
        double t1 = now_s();
        if (ns && st == ELLM_OK) step_cost_add(&s->cost, rows, t1 - t0);
        /* bytes read: the weights once, each sequence's K/V once */
        s->bw_bytes += (double)s->weight_bytes;
        for (int k = 0; k < ns; k++)
            s->bw_bytes += (double)ellm_context_pos(s->step_ctx[k]) * (double)s->kv_bytes_per_token;

        /* results, outside the lock: only this thread touches these fields */
        for (int k = 0; k < ns; k++) {
            job *j = s->step_job[k];
            slot *sl = &s->slots[j->slot];
            sl->fin = NULL;
            sl->n_emit = 0;
            if (st != ELLM_OK) {
                if (s->step_rows[k] && sl->spec && j->generating) ellm_spec_cancel_step(sl->spec);
                j->failed = 1;
                j->unavailable = sched_mpi_lost(s->mpi) != NULL; /* --mpi: a rank was lost (503) */
                snprintf(j->errmsg, sizeof j->errmsg, "%s", err.msg);
                continue;
            }
            if (s->step_rows[k] && sl->spec && j->generating) {
                /* what the verify cost this sequence: its rows, and its share of reading the weights */
                double ms = s->cost.row_s > 0 ? 1e3 * (s->cost.fixed_s / ns + s->cost.row_s * s->step_n[k])
                                              : 1e3 * (t1 - t0) * s->step_n[k] / rows;
                ellm_error verr = {0};
                if (ellm_spec_verify_step(sl->spec, j->sampler, ms, sl->step_out, &sl->n_out, &verr) != ELLM_OK) {
                    j->failed = 1;
                    snprintf(j->errmsg, sizeof j->errmsg, "%s", verr.msg);
                    continue;
                }
                sl->fin = spec_finish_job(s, j, sl);
                continue;
            }
            memcpy(sl->tokens + sl->n_tokens, s->step_tok[k], (size_t)s->step_n[k] * sizeof(int32_t));
            sl->n_tokens += s->step_n[k];
            /* a scored prompt's rows: row r (position n_fed + r) gives prompt
             * token n_fed + r + 1 its log-probabilities */
            for (int r = 0; s->step_rows[k] && r < s->step_n[k]; r++)
                logprobs_compute(s->step_rows[k] + (size_t)r * (size_t)s->n_vocab, s->n_vocab, j->prompt[j->n_fed + r + 1],
                                 j->p.top_logprobs, &j->prompt_lps[j->n_fed + r + 1]);
            if (!j->generating) {
                j->n_fed += s->step_n[k];
                if (j->n_fed < j->n_prompt) continue;
                j->generating = 1;
                /* whole chunks past sparse_from (a scored prompt's last
                 * token went in a pass of its own) */
                const int m = scores_prompt(j) ? j->n_prompt - 1 : j->n_prompt;
                sl->n_exact = whole_chunks(s, m);
                if (j->p.max_tokens == 0) { /* echo of the prompt alone */
                    sl->fin = "length";
                    continue;
                }
                if (sl->spec) { /* its speculative steps draw the tokens from here on */
                    sl->n_hist = sl->n_tokens;
                    continue;
                }
            }
            const float *logits = ellm_context_logits(sl->ctx);
            int32_t tok = ellm_sampler_sample(j->sampler, j->p.json_mode ? json_masked(s, j, logits) : logits, sl->tokens,
                                              sl->n_tokens);
            if (j->p.json_mode) json_advance(s, j, tok);
            j->last = tok;
            sl->n_emit = 1;
            token_lp(s, j, logits, tok, &sl->lp[0]);
            sl->fin = on_token(s, j, sl, tok);
            sl->shows[0] = shown_after(j, sl->fin);
        }
        for (int q = 0; q < n_extra; q++) s->step_job[ns + q] = s->step_extra[q]; /* published alike */

        double t2 = now_s();
        pthread_mutex_lock(&s->mu);
        double now = now_s();
        pthread_mutex_lock(&s->metrics->mu);
        if (ns) {
            s->metrics->engine_steps_total++;
            s->metrics->engine_rows_total += (uint64_t)rows;
            s->metrics->engine_seqs_total += (uint64_t)ns;
        }
        s->metrics->step_seconds[STEP_PHASE_SCHEDULE] += t_draft - t_sched;
        s->metrics->step_seconds[STEP_PHASE_SPEC] += t0 - t_draft;
        s->metrics->step_seconds[STEP_PHASE_FORWARD] += t1 - t0;
        s->metrics->step_seconds[STEP_PHASE_SAMPLE] += t2 - t1;
        if (now - s->bw_t0 >= 1.0) {
            s->metrics->mem_bandwidth_util = s->bw_gbps > 0 ? s->bw_bytes / (now - s->bw_t0) / (s->bw_gbps * 1e9) : 0;
            s->bw_t0 = now;
            s->bw_bytes = 0;
        }
        for (int k = 0; k < ns + n_extra; k++) {
            job *j = s->step_job[k];
            const int n = s->slots[j->slot].n_emit;
            if (j->failed || (k < ns && st != ELLM_OK) || n == 0) continue;
            s->metrics->generated_tokens_total += (uint64_t)n;
            for (int t = 0; t < n; t++) {
                if (j->n_gen - n + t == 0) metrics_observe(&s->metrics->ttft, now - j->t_arrive);
                else metrics_observe(&s->metrics->inter_token, (now - j->t_last_token) / n); /* a step's tokens, evenly */
            }
            j->t_last_token = now;
        }
        pthread_mutex_unlock(&s->metrics->mu);
        for (int k = 0; k < ns + n_extra; k++) {
            job *j = s->step_job[k];
            slot *sl = &s->slots[j->slot];
            if (j->failed || (k < ns && st != ELLM_OK)) {
                finish_job(s, j, NULL);
                continue;
            }
            if (!sl->n_emit && !sl->fin) continue;
            for (int t = 0; t < sl->n_emit; t++) publish_token(j, sl->shows[t], &sl->lp[t]);
            if (sl->fin) finish_job(s, j, sl->fin);
            else pthread_cond_broadcast(&j->cv);
        }
        update_quality_metrics(s);
        pthread_mutex_lock(&s->metrics->mu);
        s->metrics->step_seconds[STEP_PHASE_PUBLISH] += now_s() - t2;
        pthread_mutex_unlock(&s->metrics->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}
