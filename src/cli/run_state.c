/* Encoding of `ellm run`'s part of a state file. */
#include "cli/run_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_STATE_MAGIC "ellm-run"
#define RUN_STATE_VERSION 1u

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int oom;
} enc;

static void put(enc *e, const void *d, size_t n) {
    if (e->oom) return;
    if (e->n + n > e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 1024;
        while (cap < e->n + n) cap *= 2;
        unsigned char *p = realloc(e->p, cap);
        if (!p) {
            e->oom = 1;
            return;
        }
        e->p = p;
        e->cap = cap;
    }
    memcpy(e->p + e->n, d, n);
    e->n += n;
}
static void put_i64(enc *e, int64_t x) { put(e, &x, 8); }
static void put_f32(enc *e, float x) { put(e, &x, 4); }
static void put_str(enc *e, const char *s, size_t n) {
    put_i64(e, (int64_t)n);
    put(e, s, n);
}

int run_state_encode(const run_state *s, unsigned char **out, size_t *len) {
    enc e = {0};
    uint32_t v = RUN_STATE_VERSION;
    put(&e, RUN_STATE_MAGIC, 8);
    put(&e, &v, 4);
    put_str(&e, s->model, strlen(s->model));
    put_i64(&e, s->no_echo);
    put_i64(&e, s->kv_f32);
    put_i64(&e, s->ctx_auto);
    put_i64(&e, s->n_predict);
    put_i64(&e, s->threads);
    put_i64(&e, s->batch);
    put_i64(&e, s->n_ctx);
    put_f32(&e, s->sp.temperature);
    put_i64(&e, s->sp.top_k);
    put_f32(&e, s->sp.top_p);
    put_f32(&e, s->sp.min_p);
    put_f32(&e, s->sp.repeat_penalty);
    put_i64(&e, s->sp.repeat_last_n);
    put(&e, &s->sp.seed, 8);
    put_i64(&e, s->sparse_topk);
    put_i64(&e, s->sparse_window);
    put_i64(&e, s->sparse_sink);
    put_i64(&e, s->sparse_dense);
    put_i64(&e, s->sparse_recall);
    put_i64(&e, s->sparse_adapt);
    put_i64(&e, s->overflow);
    put_i64(&e, s->keep);
    put_str(&e, s->prompt ? s->prompt : "", s->prompt ? s->prompt_len : 0);
    put_i64(&e, s->n_prompt);
    put_i64(&e, s->n_tokens);
    put(&e, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
    put(&e, s->rng.rng, sizeof s->rng.rng);
    put_i64(&e, s->save_every);
    if (e.oom) {
        free(e.p);
        return 0;
    }
    *out = e.p;
    *len = e.n;
    return 1;
}

typedef struct {
    const unsigned char *p;
    size_t n, off;
    int bad;
} dec;

static void get(dec *d, void *out, size_t n) {
    if (d->bad || n > d->n - d->off) {
        d->bad = 1;
        memset(out, 0, n);
        return;
    }
    memcpy(out, d->p + d->off, n);
    d->off += n;
}
static int64_t get_i64(dec *d) {
    int64_t x;
    get(d, &x, 8);
    return x;
}
static float get_f32(dec *d) {
    float x;
    get(d, &x, 4);
    return x;
}
/* A string of at most `max` bytes, NUL-terminated copy. */
static char *get_str(dec *d, size_t max, size_t *len) {
    int64_t n = get_i64(d);
    if (d->bad || n < 0 || (uint64_t)n > max || (size_t)n > d->n - d->off) {
        d->bad = 1;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        d->bad = 1;
        return NULL;
    }
    get(d, s, (size_t)n);
    s[n] = 0;
    if (len) *len = (size_t)n;
    return s;
}

void run_state_free(run_state *s) {
    free(s->model);
    free(s->prompt);
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

int run_state_decode(const unsigned char *data, size_t len, run_state *s, char *msg, size_t cap) {
    memset(s, 0, sizeof *s);
    dec d = {data, len, 0, 0};
    char magic[8];
    uint32_t v = 0;
    get(&d, magic, 8);
    get(&d, &v, 4);
    if (d.bad || memcmp(magic, RUN_STATE_MAGIC, 8)) {
        snprintf(msg, cap, "the state was not written by `ellm run`");
        return 0;
    }
    if (v != RUN_STATE_VERSION) {
        snprintf(msg, cap, "the run settings have version %u; this build reads version %u", v, RUN_STATE_VERSION);
        return 0;
    }
    s->model = get_str(&d, 1 << 16, NULL);
    s->no_echo = (int)get_i64(&d);
    s->kv_f32 = (int)get_i64(&d);
    s->ctx_auto = (int)get_i64(&d);
    s->n_predict = get_i64(&d);
    s->threads = get_i64(&d);
    s->batch = get_i64(&d);
    s->n_ctx = get_i64(&d);
    s->sp.temperature = get_f32(&d);
    s->sp.top_k = (int)get_i64(&d);
    s->sp.top_p = get_f32(&d);
    s->sp.min_p = get_f32(&d);
    s->sp.repeat_penalty = get_f32(&d);
    s->sp.repeat_last_n = (int)get_i64(&d);
    get(&d, &s->sp.seed, 8);
    s->sparse_topk = get_i64(&d);
    s->sparse_window = get_i64(&d);
    s->sparse_sink = get_i64(&d);
    s->sparse_dense = get_i64(&d);
    s->sparse_recall = get_i64(&d);
    s->sparse_adapt = (int)get_i64(&d);
    s->overflow = (int)get_i64(&d);
    s->keep = get_i64(&d);
    s->prompt = get_str(&d, (size_t)1 << 31, &s->prompt_len);
    s->n_prompt = get_i64(&d);
    s->n_tokens = get_i64(&d);
    const int64_t max_tok = 1 << 30;
    if (!d.bad && (s->n_tokens < 1 || s->n_tokens > max_tok || s->n_prompt < 1 || s->n_prompt > s->n_tokens ||
                   (size_t)s->n_tokens * 4 > d.n - d.off))
        d.bad = 1;
    if (!d.bad && (s->tokens = malloc((size_t)s->n_tokens * sizeof *s->tokens)))
        get(&d, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
    else
        d.bad = 1;
    get(&d, s->rng.rng, sizeof s->rng.rng);
    s->save_every = get_i64(&d);
    if (d.bad || d.off != d.n || !s->model || s->threads < 1 || s->threads > 1024 || s->batch < 1 ||
        s->n_ctx < 1 || s->n_ctx > max_tok || s->n_predict < 0 || s->n_predict > max_tok ||
        s->n_tokens - s->n_prompt > s->n_predict || (s->overflow < 0 || s->overflow > 2) || s->keep < 0 ||
        s->save_every < 1) {
        run_state_free(s);
        snprintf(msg, cap, "the run settings in the state are malformed");
        return 0;
    }
    return 1;
}
