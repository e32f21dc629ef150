/* Encoding of `ellm run`'s part of a state file. */
#include "cli/run_state.h"
#include "core/bytebuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_STATE_MAGIC "ellm-run"
/* 2: the presence and frequency penalties at the end (version 1, without
 * them, is read with both 0); 3: then the --rope-* flags (earlier versions:
 * none, the file's RoPE) */
#define RUN_STATE_VERSION 3u

static void put_str(bb_writer *e, const char *s, size_t n) {
    bb_put_i64(e, (int64_t)n);
    bb_put(e, s, n);
}

int run_state_encode(const run_state *s, unsigned char **out, size_t *len) {
    bb_writer e = {0};
    uint32_t v = RUN_STATE_VERSION;
    bb_put(&e, RUN_STATE_MAGIC, 8);
    bb_put(&e, &v, 4);
    put_str(&e, s->model, strlen(s->model));
    bb_put_i64(&e, s->no_echo);
    bb_put_i64(&e, s->kv_f32);
    bb_put_i64(&e, s->ctx_auto);
    bb_put_i64(&e, s->n_predict);
    bb_put_i64(&e, s->threads);
    bb_put_i64(&e, s->batch);
    bb_put_i64(&e, s->n_ctx);
    bb_put_f32(&e, s->sp.temperature);
    bb_put_i64(&e, s->sp.top_k);
    bb_put_f32(&e, s->sp.top_p);
    bb_put_f32(&e, s->sp.min_p);
    bb_put_f32(&e, s->sp.repeat_penalty);
    bb_put_i64(&e, s->sp.repeat_last_n);
    bb_put(&e, &s->sp.seed, 8);
    bb_put_i64(&e, s->sparse_topk);
    bb_put_i64(&e, s->sparse_window);
    bb_put_i64(&e, s->sparse_sink);
    bb_put_i64(&e, s->sparse_dense);
    bb_put_i64(&e, s->sparse_recall);
    bb_put_i64(&e, s->sparse_adapt);
    bb_put_i64(&e, s->overflow);
    bb_put_i64(&e, s->keep);
    put_str(&e, s->prompt ? s->prompt : "", s->prompt ? s->prompt_len : 0);
    bb_put_i64(&e, s->n_prompt);
    bb_put_i64(&e, s->n_tokens);
    bb_put(&e, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
    bb_put(&e, s->rng.rng, sizeof s->rng.rng);
    bb_put_i64(&e, s->save_every);
    bb_put_f32(&e, s->sp.presence_penalty);
    bb_put_f32(&e, s->sp.frequency_penalty);
    const char *rt = s->rope.type ? s->rope.type : "";
    put_str(&e, rt, strlen(rt));
    bb_put_f32(&e, s->rope.factor);
    bb_put_f32(&e, s->rope.freq_base);
    bb_put_i64(&e, s->rope.orig_ctx);
    if (e.oom) {
        free(e.p);
        return 0;
    }
    *out = e.p;
    *len = e.n;
    return 1;
}

/* A string of at most `max` bytes, NUL-terminated copy. */
static char *get_str(bb_reader *d, size_t max, size_t *len) {
    int64_t n = bb_get_i64(d);
    if (d->bad || n < 0 || (uint64_t)n > max || (size_t)n > d->n - d->off) {
        d->bad = 1;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        d->bad = 1;
        return NULL;
    }
    bb_get(d, s, (size_t)n);
    s[n] = 0;
    if (len) *len = (size_t)n;
    return s;
}

static int in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }
/* false for NaN */
static int in_range_f(double v, double lo, double hi) { return v >= lo && v <= hi; }

void run_state_free(run_state *s) {
    free(s->model);
    free(s->prompt);
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

int run_state_decode(const unsigned char *data, size_t len, run_state *s, char *msg, size_t cap) {
    memset(s, 0, sizeof *s);
    bb_reader d = {data, len, 0, 0};
    char magic[8];
    uint32_t v = 0;
    bb_get(&d, magic, 8);
    bb_get(&d, &v, 4);
    if (d.bad || memcmp(magic, RUN_STATE_MAGIC, 8)) {
        snprintf(msg, cap, "the state was not written by `ellm run`");
        return 0;
    }
    if (v < 1 || v > RUN_STATE_VERSION) {
        snprintf(msg, cap, "the run settings have version %u; this build reads version %u", v, RUN_STATE_VERSION);
        return 0;
    }
    s->model = get_str(&d, 1 << 16, NULL);
    s->no_echo = (int)bb_get_i64(&d);
    s->kv_f32 = (int)bb_get_i64(&d);
    s->ctx_auto = (int)bb_get_i64(&d);
    s->n_predict = bb_get_i64(&d);
    s->threads = bb_get_i64(&d);
    s->batch = bb_get_i64(&d);
    s->n_ctx = bb_get_i64(&d);
    s->sp.temperature = bb_get_f32(&d);
    s->sp.top_k = (int)bb_get_i64(&d);
    s->sp.top_p = bb_get_f32(&d);
    s->sp.min_p = bb_get_f32(&d);
    s->sp.repeat_penalty = bb_get_f32(&d);
    s->sp.repeat_last_n = (int)bb_get_i64(&d);
    bb_get(&d, &s->sp.seed, 8);
    s->sparse_topk = bb_get_i64(&d);
    s->sparse_window = bb_get_i64(&d);
    s->sparse_sink = bb_get_i64(&d);
    s->sparse_dense = bb_get_i64(&d);
    s->sparse_recall = bb_get_i64(&d);
    s->sparse_adapt = (int)bb_get_i64(&d);
    s->overflow = (int)bb_get_i64(&d);
    s->keep = bb_get_i64(&d);
    s->prompt = get_str(&d, (size_t)1 << 31, &s->prompt_len);
    s->n_prompt = bb_get_i64(&d);
    s->n_tokens = bb_get_i64(&d);
    if (!d.bad && (s->n_tokens < 1 || s->n_tokens > RUN_COUNT_MAX || s->n_prompt < 1 || s->n_prompt > s->n_tokens ||
                   (size_t)s->n_tokens * 4 > d.n - d.off))
        d.bad = 1;
    if (!d.bad && (s->tokens = malloc((size_t)s->n_tokens * sizeof *s->tokens)))
        bb_get(&d, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
    else
        d.bad = 1;
    bb_get(&d, s->rng.rng, sizeof s->rng.rng);
    s->save_every = bb_get_i64(&d);
    if (v >= 2) {
        s->sp.presence_penalty = bb_get_f32(&d);
        s->sp.frequency_penalty = bb_get_f32(&d);
    }
    int rope_ok = 1;
    if (v >= 3) {
        size_t n = 0;
        char *rt = get_str(&d, sizeof s->rope_type - 1, &n);
        if (rt) memcpy(s->rope_type, rt, n + 1);
        free(rt);
        s->rope.type = s->rope_type[0] ? s->rope_type : NULL;
        s->rope.factor = bb_get_f32(&d);
        s->rope.freq_base = bb_get_f32(&d);
        const int64_t oc = bb_get_i64(&d);
        rope_ok = (!s->rope.type || !strcmp(s->rope_type, "none") || !strcmp(s->rope_type, "linear") ||
                   !strcmp(s->rope_type, "yarn")) &&
                  (s->rope.factor == 0 || in_range_f(s->rope.factor, 1e-6, 1e6)) &&
                  (s->rope.freq_base == 0 || in_range_f(s->rope.freq_base, 1e-6, 1e12)) && in_range(oc, 0, RUN_COUNT_MAX);
        s->rope.orig_ctx = (int)oc;
    }
    const ellm_sampler_params *sp = &s->sp;
    /* what `ellm run` accepts for the flags behind each setting (the checksums
     * catch damage, not a file written by something else) */
    const int settings_ok =
        s->model && in_range(s->threads, 1, RUN_THREADS_MAX) && in_range(s->batch, 1, RUN_BATCH_MAX) &&
        in_range(s->n_ctx, 1, RUN_COUNT_MAX) && in_range(s->n_predict, 0, RUN_COUNT_MAX) &&
        s->n_tokens - s->n_prompt <= s->n_predict && in_range(s->overflow, 0, 2) && in_range(s->keep, 0, RUN_COUNT_MAX) &&
        in_range(s->save_every, 1, RUN_COUNT_MAX) &&
        (s->kv_f32 == ELLM_KV_F16 || s->kv_f32 == ELLM_KV_F32 || s->kv_f32 == ELLM_KV_Q8_0) &&
        in_range(s->no_echo, 0, 1) && in_range(s->ctx_auto, 0, 1) && in_range(s->sparse_adapt, 0, 1) &&
        in_range(s->sparse_topk, -1 /* dense only */, RUN_COUNT_MAX) && in_range(s->sparse_window, 0, RUN_COUNT_MAX) &&
        in_range(s->sparse_sink, 0, RUN_SPARSE_SMALL_MAX) && in_range(s->sparse_dense, 0, RUN_SPARSE_SMALL_MAX) &&
        in_range(s->sparse_recall, 0, RUN_COUNT_MAX) && in_range(sp->top_k, 0, RUN_COUNT_MAX) &&
        in_range(sp->repeat_last_n, 0, RUN_COUNT_MAX) && in_range_f(sp->temperature, 0, RUN_TEMP_MAX) &&
        in_range_f(sp->top_p, RUN_TOP_P_MIN, 1) && in_range_f(sp->min_p, 0, RUN_MIN_P_MAX) &&
        in_range_f(sp->repeat_penalty, RUN_REPEAT_PENALTY_MIN, RUN_REPEAT_PENALTY_MAX) &&
        in_range_f(sp->presence_penalty, -RUN_PENALTY_ABS_MAX, RUN_PENALTY_ABS_MAX) &&
        in_range_f(sp->frequency_penalty, -RUN_PENALTY_ABS_MAX, RUN_PENALTY_ABS_MAX) && rope_ok;
    if (d.bad || d.off != d.n || !settings_ok) {
        run_state_free(s);
        snprintf(msg, cap, "the run settings in the state are malformed");
        return 0;
    }
    return 1;
}
