/* The speculative loop: draft, verify in one batched pass, accept, roll back.
 * See spec.h for the scheme and the drafters. */
#include "spec/spec.h"
#include "spec/draft_model.h"
#include "kernels/quant.h"
#include "core/status.h"
#include "core/timer.h"
#include "engine/engine_impl.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <strings.h>
#include <stdlib.h>
#include <string.h>

struct ellm_spec {
    ellm_context *ctx;
    ellm_spec_params p;
    spec_drafter drafters[SPEC_MAX_DRAFTERS];
    int n_drafters;
    /* model drafters with weights of their own (quant, shallow): the derived
     * model (kept with the target model) and a scratch sized for it; the
     * context runs on them while such a drafter drafts */
    const ellm_model *dmodel[SPEC_MAX_DRAFTERS];
    engine_scratch dscratch[SPEC_MAX_DRAFTERS];
    char note[SPEC_MAX_DRAFTERS][1200];
    ellm_model *target_model;
    engine_scratch target_scratch;
    int target_topk; /* the context's sparse budget when the state was made (verify --spec-verify sparse) */
    int n_vocab;
    float *rows;      /* (SPEC_MAX_DRAFT + 1) x n_vocab: logits of a verify or draft batch */
    float *probs;     /* n_vocab: target distribution of one row (sampling) */
    int32_t *hist;    /* history + the step's tokens, for n-gram lookup and the sampler */
    int hist_cap;
    int accept_all;   /* test hook: accept every draft (breaks exactness on purpose) */
    double draft_cost_scale; /* test hook: the adaptive length counts draft time this many times (1) */
    int32_t pending;  /* sampling: a token drawn on rejection, returned already and fed by the next step (-1: none) */
    ellm_spec_stats st;
    /* Adaptive draft length: running (exponentially weighted) figures */
    double acc_n, miss_n;  /* accepted drafts, and passes that ended on a rejected draft */
    double draft_tok_ms;   /* one drafted token's cost */
    int draft_seen;
    double verify_ms[SPEC_MAX_DRAFT + 2]; /* [n]: a verify pass of n tokens (0: not measured) */
    int k_next;            /* draft length of the next pass (0: a plain step) */
    int plain_left;        /* plain steps before drafting is tried again (-1: not in a run of them) */
    int explore_gap;       /* plain steps between tries of drafting: SPEC_EXPLORE_EVERY, doubling while they lose */
    int64_t k_sum;         /* sum of draft lengths asked */
    /* A step between ellm_spec_draft_step and ellm_spec_verify_step: the
     * verify batch (x, then nd drafts) and what the acceptance needs. */
    int v_open;
    int v_pos, v_n_hist, v_n0, v_nd, v_k, v_k_asked, v_max;
    int32_t v_batch[SPEC_MAX_DRAFT + 1];
    double v_t0, v_t1, v_t2;
    /* ellm_spec_keep_logits: the logits the last step drew its own first
     * token from (n_vocab floats), kept while `rows` holds the others'. */
    int keep_logits;
    float *x_logits;
    int last_n0;  /* tokens of the last step's out drawn from x_logits (0 or 1) */
};

#define SPEC_EMA 0.9          /* weight of the past in the running figures (about 10 passes) */
#define SPEC_EXPLORE_EVERY 32 /* passes between tries of a neighbouring draft length */
#define SPEC_EXPLORE_MAX 256  /* plain steps at most between tries of drafting again */

double ellm_spec_tokens_per_verify(double a, int k) {
    if (a >= 1) return k + 1;
    if (a <= 0) return 1;
    return (1 - pow(a, k + 1)) / (1 - a);
}

double ellm_spec_token_acceptance(double t, int k) {
    if (t >= k + 1) return 1;
    if (t <= 1) return 0;
    double lo = 0, hi = 1;
    for (int i = 0; i < 60; i++) {
        double mid = (lo + hi) / 2;
        if (ellm_spec_tokens_per_verify(mid, k) < t) lo = mid;
        else hi = mid;
    }
    return lo;
}

int ellm_spec_best_draft_length(double a, double draft_ms, const double *verify_ms, int kmax, double *tokens_per_s) {
    int best = 1;
    double best_tps = -1;
    for (int k = 1; k <= kmax; k++) {
        double t = k * draft_ms + verify_ms[k];
        double tps = t > 0 ? ellm_spec_tokens_per_verify(a, k) / (t / 1000.0) : 0;
        if (tps > best_tps) best_tps = tps, best = k;
    }
    if (tokens_per_s) *tokens_per_s = best_tps > 0 ? best_tps : 0;
    return best;
}

/* Verify time of n tokens from the measured sizes: the nearest measured
 * sizes around n interpolated linearly, or extrapolated with the slope of the
 * two largest (constant if only one size was measured). */
static double verify_estimate(const ellm_spec *s, int n) {
    if (s->verify_ms[n] > 0) return s->verify_ms[n];
    int lo = 0, hi = 0, top = 0, top2 = 0;
    for (int i = 1; i <= SPEC_MAX_DRAFT + 1; i++) {
        if (s->verify_ms[i] <= 0) continue;
        if (i < n) lo = i;
        if (i > n && !hi) hi = i;
        top2 = top, top = i;
    }
    if (lo && hi) return s->verify_ms[lo] + (s->verify_ms[hi] - s->verify_ms[lo]) * (n - lo) / (hi - lo);
    if (!top) return 0;
    if (!top2) return s->verify_ms[top];
    if (hi) { /* n below every measured size: extrapolate down from the two smallest */
        int a = 0, b = 0;
        for (int i = 1; i <= SPEC_MAX_DRAFT + 1 && !b; i++)
            if (s->verify_ms[i] > 0) {
                if (!a) a = i;
                else b = i;
            }
        double v = s->verify_ms[a] + (s->verify_ms[b] - s->verify_ms[a]) * (n - a) / (b - a);
        return v > 0 ? v : s->verify_ms[a] * n / a;
    }
    double slope = (s->verify_ms[top] - s->verify_ms[top2]) / (top - top2);
    return s->verify_ms[top] + (slope > 0 ? slope : 0) * (n - top);
}

int spec_choose_length(double a, double draft_tok_ms, const double *est, int kmax, int *best) {
    double tps;
    int k = ellm_spec_best_draft_length(a, draft_tok_ms, est + 1, kmax, &tps);
    if (best) *best = k;
    return est[1] > 0 && 1000.0 / est[1] > tps ? 0 : k;
}

/* After a pass that asked for k drafts, got nd, kept m and verified in
 * verify_ms (nd + 1 tokens) after drafting for draft_ms: updates the running
 * figures and chooses the next draft length (spec_choose_length; 0 is a
 * plain step). The first passes try draft_max, half of it, 1 and 0 so that
 * the verify cost is known at several sizes and a plain step's is known;
 * while drafting, every SPEC_EXPLORE_EVERY passes a neighbour of the current
 * length is tried; after a run of plain steps (SPEC_EXPLORE_EVERY, doubling
 * each time drafting still loses, up to SPEC_EXPLORE_MAX) the best draft
 * length is, so that the draft and verify costs and the acceptance are
 * measured again as the context grows. */
static void adapt_update(ellm_spec *s, int nd, int m, double draft_ms, double verify_ms) {
    const int K = s->p.draft_max;
    s->acc_n = SPEC_EMA * s->acc_n + m;
    s->miss_n = SPEC_EMA * s->miss_n + (m < nd);
    if (nd > 0) {
        double per = draft_ms * s->draft_cost_scale / nd;
        s->draft_tok_ms = s->draft_seen ? SPEC_EMA * s->draft_tok_ms + (1 - SPEC_EMA) * per : per;
        s->draft_seen = 1;
    }
    double *v = &s->verify_ms[nd + 1];
    *v = *v > 0 ? SPEC_EMA * *v + (1 - SPEC_EMA) * verify_ms : verify_ms;
    if (!s->p.adapt) {
        s->k_next = K;
        return;
    }
    int64_t pass = s->st.verify_passes; /* passes done, this one included */
    if (pass <= 3) {
        s->k_next = pass == 1 ? (K / 2 > 1 ? K / 2 : 1) : pass == 2 ? 1 : 0;
        return;
    }
    double a = s->acc_n + s->miss_n > 0 ? s->acc_n / (s->acc_n + s->miss_n) : 0;
    double est[SPEC_MAX_DRAFT + 2];
    for (int n = 1; n <= K + 1; n++) est[n] = verify_estimate(s, n);
    int best, k = spec_choose_length(a, s->draft_tok_ms, est, K, &best);
    if (k == 0) {
        if (s->plain_left < 0) { /* a run of plain steps begins */
            s->plain_left = s->explore_gap;
        } else if (s->plain_left > 0) {
            s->plain_left--;
        } else { /* try drafting again; if it still loses, wait twice as long */
            k = best;
            s->explore_gap = 2 * s->explore_gap < SPEC_EXPLORE_MAX ? 2 * s->explore_gap : SPEC_EXPLORE_MAX;
            s->plain_left = -1;
        }
    } else {
        s->plain_left = -1;
        s->explore_gap = SPEC_EXPLORE_EVERY;
        if (pass % SPEC_EXPLORE_EVERY == 0) k += (pass / SPEC_EXPLORE_EVERY) % 2 ? 1 : -1;
    }
    s->k_next = k < 0 ? 0 : k > K ? K : k;
}

ellm_spec_params ellm_spec_default_params(void) {
    ellm_spec_params p;
    memset(&p, 0, sizeof p);
    p.drafters = "ngram";
    p.draft_max = 8;
    return p;
}

/* Parses ":sparse:N" (or "") after a model drafter's own argument at `rest`.
 * Returns 0, or -1 with err. */
static int parse_budget(const char *item, const char *rest, spec_drafter *d, ellm_error *err) {
    char *end;
    if (!*rest) return 0;
    if (strncmp(rest, ":sparse:", 8)) {
        ellm_fail(err, ELLM_ERR_ARG, "spec: '%s': expected nothing or ':sparse:N' after the drafter", item);
        return -1;
    }
    long b = strtol(rest + 8, &end, 10);
    if (end == rest + 8 || *end || b < 1 || b > (1L << 30)) {
        ellm_fail(err, ELLM_ERR_ARG, "spec: '%s': expected sparse:N with N >= 1 KV tokens", item);
        return -1;
    }
    d->budget = (int)b;
    return 0;
}

/* Parses one drafter of a list. Returns 0, or -1 with err. */
static int parse_item(const char *item, spec_drafter *d, ellm_error *err) {
    char *end;
    if (!strcmp(item, "ngram")) {
        d->kind = SPEC_DRAFT_NGRAM;
        return 0;
    }
    if (!strncmp(item, "sparse:", 7)) {
        char rest[80];
        snprintf(rest, sizeof rest, ":%s", item);
        d->kind = SPEC_DRAFT_SPARSE;
        return parse_budget(item, rest, d, err);
    }
    if (!strncmp(item, "quant:", 6)) {
        const char *t = item + 6, *colon = strchr(t, ':');
        size_t len = colon ? (size_t)(colon - t) : strlen(t);
        d->kind = SPEC_DRAFT_QUANT;
        d->qtype = -1;
        for (int i = 0; i < QTYPE_COUNT && len; i++) {
            const qtype_info *qi = qtype_get(i);
            if (qi && qi->supported && strlen(qi->name) == len && !strncasecmp(qi->name, t, len)) d->qtype = i;
        }
        if (d->qtype < 0) {
            ellm_fail(err, ELLM_ERR_ARG, "spec: '%s': unknown weight type (e.g. quant:q4_0, quant:q4_K)", item);
            return -1;
        }
        return parse_budget(item, t + len, d, err);
    }
    if (!strncmp(item, "shallow:", 8)) {
        long k = strtol(item + 8, &end, 10);
        if (end == item + 8 || k < 1 || k > 4096) {
            ellm_fail(err, ELLM_ERR_ARG, "spec: '%s': expected shallow:K with K >= 1 layers", item);
            return -1;
        }
        d->kind = SPEC_DRAFT_SHALLOW;
        d->n_layer = (int)k;
        return parse_budget(item, end, d, err);
    }
    ellm_fail(err, ELLM_ERR_ARG, "spec: unknown drafter '%s' (known: ngram, sparse:N, quant:TYPE, shallow:K)", item);
    return -1;
}

int spec_parse_drafters(const char *list, spec_drafter *out, int cap, ellm_error *err) {
    int n = 0;
    const char *s = list;
    if (!s || !*s) {
        ellm_fail(err, ELLM_ERR_ARG, "spec: empty drafter list");
        return 0;
    }
    while (*s) {
        const char *e = strchr(s, '+');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        char item[64];
        if (len == 0 || len >= sizeof item) {
            ellm_fail(err, ELLM_ERR_ARG, "spec: bad drafter in '%s'", list);
            return 0;
        }
        memcpy(item, s, len);
        item[len] = 0;
        if (n == cap) {
            ellm_fail(err, ELLM_ERR_ARG, "spec: more than %d drafters in '%s'", cap, list);
            return 0;
        }
        spec_drafter d = {0};
        if (parse_item(item, &d, err)) return 0;
        out[n++] = d;
        s += len;
        if (*s == '+') {
            s++;
            if (!*s) {
                ellm_fail(err, ELLM_ERR_ARG, "spec: drafter list '%s' ends with '+'", list);
                return 0;
            }
        }
    }
    return n;
}

ellm_status ellm_spec_init(ellm_context *ctx, const ellm_spec_params *params, ellm_spec **out, ellm_error *err) {
    *out = NULL;
    if (!ctx) return ellm_fail(err, ELLM_ERR_ARG, "spec: no context");
    ellm_spec_params p = params ? *params : ellm_spec_default_params();
    if (p.draft_max < 1 || p.draft_max > SPEC_MAX_DRAFT)
        return ellm_fail(err, ELLM_ERR_ARG, "spec: draft length %d outside [1, %d]", p.draft_max, SPEC_MAX_DRAFT);
    if (!(p.draft_p_min >= 0 && p.draft_p_min < 1))
        return ellm_fail(err, ELLM_ERR_ARG, "spec: draft probability threshold %g outside [0, 1)", p.draft_p_min);
    if (ctx->n_batch < p.draft_max + 1)
        return ellm_fail(err, ELLM_ERR_ARG, "spec: the context's batch (%d) is below draft length + 1 (%d)",
                         ctx->n_batch, p.draft_max + 1);
    ellm_spec *s = calloc(1, sizeof *s);
    if (!s) return ellm_fail(err, ELLM_ERR_NOMEM, "spec: out of memory");
    s->n_drafters = spec_parse_drafters(p.drafters, s->drafters, SPEC_MAX_DRAFTERS, err);
    if (!s->n_drafters) {
        free(s);
        return err ? err->status : ELLM_ERR_ARG;
    }
    for (int i = 0; i < s->n_drafters; i++) {
        if (s->drafters[i].budget > 0 && !ctx->sidx) {
            free(s);
            return ellm_fail(err, ELLM_ERR_ARG,
                             "spec: a drafter with a sparse:N budget needs a context that keeps the sparse index "
                             "(sparse_topk >= 0 at init)");
        }
        if (s->drafters[i].kind == SPEC_DRAFT_NGRAM && i > 0) {
            free(s);
            return ellm_fail(err, ELLM_ERR_ARG, "spec: ngram can only lead a chain (it reads no model)");
        }
    }
    if (p.verify_sparse && (!ctx->sidx || ctx->sparse_topk <= 0)) {
        free(s);
        return ellm_fail(err, ELLM_ERR_ARG, "spec: sparse verification needs a context with a sparse budget");
    }
    s->ctx = ctx;
    s->target_model = ctx->model;
    for (int i = 0; i < s->n_drafters; i++) {
        const spec_drafter *d = &s->drafters[i];
        ellm_status st = ELLM_OK;
        if (d->kind == SPEC_DRAFT_QUANT) {
            draft_quant_info qi;
            st = draft_model_quant(ctx->model, d->qtype, &s->dmodel[i], &qi, err);
            if (st == ELLM_OK) {
                static const char *how[] = {"", "loaded from", "saved to", "kept in memory (no writable cache folder)"};
                snprintf(s->note[i], sizeof s->note[i], "%s copy of %d matrices (%.1f MB a step) %s%s%.1000s%s%.150s",
                         qtype_get(d->qtype)->name, qi.n_requantized, qi.draft_weight_bytes / 1e6, how[qi.state],
                         qi.state != DRAFT_CACHE_MEMORY ? " " : "", qi.state != DRAFT_CACHE_MEMORY ? qi.path : "",
                         qi.rejected[0] ? "; not used: " : "", qi.rejected);
            }
        } else if (d->kind == SPEC_DRAFT_SHALLOW) {
            st = draft_model_shallow(ctx->model, d->n_layer, p.draft_map, &s->dmodel[i], err);
            if (st == ELLM_OK)
                snprintf(s->note[i], sizeof s->note[i], "first %d of %d layers (%.1f MB a step)%s%.1000s", d->n_layer,
                         ctx->model->cfg.n_layer, s->dmodel[i]->weight_bytes / 1e6, p.draft_map ? ", map " : "",
                         p.draft_map ? p.draft_map : "");
        }
        if (st == ELLM_OK && s->dmodel[i] && ctx->dist)
            st = ellm_fail(err, ELLM_ERR_ARG, "spec: quant and shallow drafters do not run over MPI-sharded KV");
        if (st == ELLM_OK && s->dmodel[i] && engine_scratch_init(s->dmodel[i], SPEC_MAX_DRAFT + 1, &s->dscratch[i]))
            st = ellm_fail(err, ELLM_ERR_NOMEM, "spec: out of memory for a draft scratch");
        if (st != ELLM_OK) {
            ellm_spec_free(s);
            return st;
        }
    }
    s->p = p;
    s->p.drafters = NULL; /* not kept: the caller's strings */
    s->p.draft_map = NULL;
    s->target_topk = ctx->sparse_topk;
    s->pending = -1;
    s->k_next = p.draft_max;
    s->draft_cost_scale = 1;
    s->plain_left = -1;
    s->explore_gap = SPEC_EXPLORE_EVERY;
    s->n_vocab = ctx->model->cfg.n_vocab;
    s->rows = malloc((size_t)(SPEC_MAX_DRAFT + 1) * s->n_vocab * sizeof *s->rows);
    s->probs = malloc((size_t)s->n_vocab * sizeof *s->probs);
    if (!s->rows || !s->probs) {
        ellm_spec_free(s);
        return ellm_fail(err, ELLM_ERR_NOMEM, "spec: out of memory for %d logit rows", SPEC_MAX_DRAFT + 1);
    }
    *out = s;
    return ELLM_OK;
}

void ellm_spec_free(ellm_spec *s) {
    if (!s) return;
    for (int i = 0; i < SPEC_MAX_DRAFTERS; i++)
        if (s->dmodel[i]) engine_scratch_free(&s->dscratch[i]);
    free(s->rows);
    free(s->probs);
    free(s->hist);
    free(s->x_logits);
    free(s);
}

void spec_set_accept_all(ellm_spec *s, int on) { s->accept_all = on; }

void spec_set_draft_cost_scale(ellm_spec *s, double f) { s->draft_cost_scale = f; }

void ellm_spec_reset(ellm_spec *s) { s->pending = -1; }

ellm_status ellm_spec_keep_logits(ellm_spec *s, int on, ellm_error *err) {
    if (on && !s->x_logits && !(s->x_logits = malloc((size_t)s->n_vocab * sizeof *s->x_logits)))
        return ellm_fail(err, ELLM_ERR_NOMEM, "spec: out of memory");
    s->keep_logits = on != 0;
    return ELLM_OK;
}

const float *ellm_spec_token_logits(const ellm_spec *s, int i) {
    if (!s->keep_logits || i < 0 || i > s->last_n0 + SPEC_MAX_DRAFT) return NULL;
    return i < s->last_n0 ? s->x_logits : s->rows + (size_t)(i - s->last_n0) * s->n_vocab;
}

ellm_status ellm_spec_sync(ellm_spec *s, ellm_error *err) {
    if (s->pending < 0) return ELLM_OK;
    int32_t t = s->pending;
    s->pending = -1;
    return ellm_decode(s->ctx, &t, 1, NULL, err);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Largest softmax probability of logits x (n): 1 / sum exp(x - max). */
static float top_prob(const float *x, int n) {
    float mx = x[argmax(x, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return (float)(1.0 / sum);
}

/* The sparse budget of the context's forward passes: 0 for dense. */
static void set_budget(ellm_spec *s, int topk) {
    if (s->ctx->sidx) s->ctx->sparse_topk = topk;
}

/* Runs the context's passes as drafter `lvl` drafts: its budget, and its
 * derived model with a scratch sized for it (or the target's own). */
static void use_drafter(ellm_spec *s, int lvl) {
    ellm_context *ctx = s->ctx;
    set_budget(s, s->drafters[lvl].budget);
    if (ctx->model != s->target_model) ctx->s = s->target_scratch; /* leave the last drafter's */
    ctx->model = s->target_model;
    if (s->dmodel[lvl]) {
        s->target_scratch = ctx->s;
        ctx->s = s->dscratch[lvl];
        ctx->model = (ellm_model *)s->dmodel[lvl];
    }
}

/* Back to the target model for verification, at sparse budget topk. */
static void use_target(ellm_spec *s, int topk) {
    ellm_context *ctx = s->ctx;
    if (ctx->model != s->target_model) {
        ctx->s = s->target_scratch;
        ctx->model = s->target_model;
    }
    set_budget(s, topk);
}

const char *ellm_spec_drafter_note(const ellm_spec *s, int i) { return i >= 0 && i < s->n_drafters ? s->note[i] : ""; }

/* Drafts up to `max` tokens after hist[0 .. n) with drafter chain level
 * `lvl` (and the cheaper ones before it as its proposers). The context holds
 * hist[0 .. n - 1) in its KV cache; hist[n - 1] is the token just chosen,
 * not yet fed. Model drafters write provisional KV beyond that; the caller
 * truncates back. Returns the number drafted into out. */
static int draft(ellm_spec *s, int lvl, int32_t *hist, int n, int max, int32_t *out, ellm_error *err) {
    const spec_drafter *d = &s->drafters[lvl];
    if (max <= 0) return 0;
    if (d->kind == SPEC_DRAFT_NGRAM) return spec_ngram_propose(hist, n, max, out);
    /* A model drafter: the same model at a small sparse budget, fed one token
     * a step; with a cheaper drafter before it in the chain, that one's
     * proposal is checked in one batched pass first and its agreeing prefix
     * (plus this drafter's own next token) taken at once. */
    ellm_context *ctx = s->ctx;
    use_drafter(s, lvl);
    int got = 0;
    int32_t feed[SPEC_MAX_DRAFT + 1];
    while (got < max) {
        int base = ellm_context_pos(ctx); /* = n + got - 1: tokens before the one to feed */
        int np = 0;
        if (lvl > 0) {
            np = draft(s, lvl - 1, hist, n + got, max - got, feed + 1, err);
            use_drafter(s, lvl);
            if (np < 0) return -1;
        }
        if (base + 1 + np > ctx->n_ctx) np = ctx->n_ctx - base - 1;
        if (np < 0) break;
        feed[0] = hist[n + got - 1];
        if (ellm_decode(ctx, feed, np + 1, s->rows, err) != ELLM_OK) return -1;
        int m = 0;
        while (m < np && argmax(s->rows + (size_t)m * s->n_vocab, s->n_vocab) == feed[1 + m]) m++;
        /* accepted proposals, then this drafter's own token after them */
        for (int i = 0; i < m && got < max; i++) hist[n + got] = out[got] = feed[1 + i], got++;
        if (got >= max) break;
        const float *row = s->rows + (size_t)m * s->n_vocab;
        if (m < np) ellm_context_truncate(ctx, base + 1 + m);
        if (s->p.draft_p_min > 0 && top_prob(row, s->n_vocab) < s->p.draft_p_min) break;
        hist[n + got] = out[got] = argmax(row, s->n_vocab);
        got++;
        if (ellm_context_pos(ctx) >= ctx->n_ctx) break;
    }
    return got;
}

/* Makes sure s->hist holds n + extra tokens. */
static int hist_reserve(ellm_spec *s, int n) {
    if (n <= s->hist_cap) return 1;
    int cap = n + n / 2 + 64;
    int32_t *h = realloc(s->hist, (size_t)cap * sizeof *h);
    if (!h) return 0;
    s->hist = h;
    s->hist_cap = cap;
    return 1;
}

ellm_status ellm_spec_draft_step(ellm_spec *s, ellm_sampler *smp, const int32_t *hist, int n_hist, int max_tokens,
                                 int32_t *out, int *n_out, const int32_t **feed, int *n_feed, float **rows,
                                 ellm_error *err) {
    ellm_context *ctx = s->ctx;
    *n_out = 0;
    *n_feed = 0;
    *feed = NULL;
    *rows = NULL;
    s->v_open = 0;
    const float *logits = ellm_context_logits(ctx);
    if (!logits) return ellm_fail(err, ELLM_ERR_ARG, "spec: the context has no logits (decode the prompt first)");
    if (max_tokens < 1) return ellm_fail(err, ELLM_ERR_ARG, "spec: max_tokens %d < 1", max_tokens);
    if (n_hist < 1 || !hist) return ellm_fail(err, ELLM_ERR_ARG, "spec: empty history");
    const int pos = ellm_context_pos(ctx);
    if (s->pending >= 0 && n_hist < 2) s->pending = -1;
    if (!hist_reserve(s, n_hist + SPEC_MAX_DRAFT + 2)) return ellm_fail(err, ELLM_ERR_NOMEM, "spec: out of memory");
    memcpy(s->hist, hist, (size_t)n_hist * sizeof *hist);
    int32_t *h = s->hist;

    /* The target's next token x: drawn as plain decoding draws it, or the
     * token the last step drew on a rejection (returned then, not yet fed). */
    int32_t x;
    int n0 = 0; /* tokens of this step already in out */
    if (s->pending >= 0 && hist[n_hist - 1] == s->pending) {
        x = s->pending;
        n_hist--;
    } else {
        x = ellm_sampler_sample(smp, logits, h, n_hist);
        out[n0++] = x;
        if (s->keep_logits) memcpy(s->x_logits, logits, (size_t)s->n_vocab * sizeof *logits);
    }
    s->last_n0 = n0;
    s->pending = -1;
    *n_out = n0;
    h[n_hist] = x;
    if (max_tokens == n0 || ellm_token_is_eog(ctx->model, x)) return ELLM_OK;

    int k = s->k_next, k_asked = k;
    if (k > max_tokens - n0) k = max_tokens - n0;
    if (k > ctx->n_ctx - pos - 1) k = ctx->n_ctx - pos - 1;
    int32_t *batch = s->v_batch;
    batch[0] = x;
    int nd = 0;
    double t0 = ellm_time_ms();
    if (k > 0) {
        nd = draft(s, s->n_drafters - 1, h, n_hist + 1, k, batch + 1, err);
        if (nd < 0) {
            use_target(s, s->target_topk);
            ellm_context_truncate(ctx, pos);
            return err ? err->status : ELLM_ERR_ARG;
        }
    }
    double t1 = ellm_time_ms();
    use_target(s, s->p.verify_sparse ? s->target_topk : 0);
    if (ellm_context_pos(ctx) != pos) ellm_context_truncate(ctx, pos);
    s->v_open = 1;
    s->v_pos = pos;
    s->v_n_hist = n_hist;
    s->v_n0 = n0;
    s->v_nd = nd;
    s->v_k = k;
    s->v_k_asked = k_asked;
    s->v_max = max_tokens;
    s->v_t0 = t0;
    s->v_t1 = t1;
    s->v_t2 = ellm_time_ms();
    *feed = batch;
    *n_feed = nd + 1;
    *rows = s->rows;
    return ELLM_OK;
}

void ellm_spec_cancel_step(ellm_spec *s) {
    if (!s->v_open) return;
    s->v_open = 0;
    set_budget(s, s->target_topk);
    ellm_context_truncate(s->ctx, s->v_pos);
}

ellm_status ellm_spec_verify_step(ellm_spec *s, ellm_sampler *smp, double verify_ms, int32_t *out, int *n_out,
                                  ellm_error *err) {
    if (!s->v_open) return ellm_fail(err, ELLM_ERR_ARG, "spec: no drafted step waits for its verify pass");
    s->v_open = 0;
    ellm_context *ctx = s->ctx;
    set_budget(s, s->target_topk);
    const double t3 = ellm_time_ms();
    const int V = s->n_vocab, pos = s->v_pos, n_hist = s->v_n_hist, n0 = s->v_n0, nd = s->v_nd;
    const int32_t *batch = s->v_batch;
    int32_t *h = s->hist;

    /* Accept drafts in order: greedy keeps those equal to the target's pick;
     * sampling accepts d with probability p(d) (the proposal is one-hot) and
     * on rejection draws from p without d, renormalized. */
    int m = 0;
    int32_t fix = -1; /* a token drawn on rejection, which ends the step */
    const int greedy = engine_sampler_greedy(smp);
    while (m < nd) {
        const float *row = s->rows + (size_t)m * V;
        int32_t dtok = batch[1 + m];
        int nh = n_hist + 1 + m;
        if (s->accept_all) {
            m++;
        } else if (greedy) {
            if (ellm_sampler_sample(smp, row, h, nh) != dtok) break;
            m++;
        } else {
            engine_sampler_probs(smp, row, h, nh, s->probs);
            double u = engine_sampler_uniform(smp);
            if (u < s->probs[dtok]) {
                m++;
            } else {
                double rest = 1.0 - s->probs[dtok], r = engine_sampler_uniform(smp) * rest, acc = 0;
                s->probs[dtok] = 0;
                int last = -1;
                for (int i = 0; i < V; i++) {
                    if (s->probs[i] <= 0) continue;
                    last = i;
                    acc += s->probs[i];
                    if (r < acc) break;
                }
                fix = last;
                break;
            }
        }
        h[n_hist + m] = dtok;
        if (ellm_token_is_eog(ctx->model, dtok)) break;
    }
    for (int i = 0; i < m; i++) out[n0 + i] = batch[1 + i];
    *n_out = n0 + m;
    /* Keep x and the m accepted drafts; the logits after the last of them
     * become the context's. */
    ellm_context_truncate(ctx, pos + 1 + m);
    memcpy(ctx->logits, s->rows + (size_t)m * V, (size_t)V * sizeof(float));
    ctx->has_logits = 1;
    if (fix >= 0 && *n_out < s->v_max) {
        /* The target's draw at the next position: returned now, fed as the
         * next step's x (so it costs no pass of its own). */
        out[(*n_out)++] = fix;
        if (!ellm_token_is_eog(ctx->model, fix)) s->pending = fix;
    }
    double t4 = ellm_time_ms();
    if (verify_ms < 0) verify_ms = t3 - s->v_t2;
    s->st.verify_passes++;
    s->st.proposed += nd;
    s->st.accepted += m;
    s->st.tokens += *n_out;
    s->st.draft_ms += s->v_t1 - s->v_t0;
    s->st.rollback_ms += (s->v_t2 - s->v_t1) + (t4 - t3);
    s->st.verify_ms += verify_ms;
    s->k_sum += s->v_k_asked;
    s->st.plain_passes += s->v_k_asked == 0;
    if (s->v_k == s->v_k_asked) adapt_update(s, nd, m, s->v_t1 - s->v_t0, verify_ms); /* a pass cut short by the end says little */
    return ELLM_OK;
}

ellm_status ellm_spec_step(ellm_spec *s, ellm_sampler *smp, const int32_t *hist, int n_hist, int max_tokens,
                           int32_t *out, int *n_out, ellm_error *err) {
    const int32_t *feed;
    int n_feed;
    float *rows;
    ellm_status st = ellm_spec_draft_step(s, smp, hist, n_hist, max_tokens, out, n_out, &feed, &n_feed, &rows, err);
    if (st != ELLM_OK || n_feed == 0) return st;
    st = ellm_decode(s->ctx, feed, n_feed, rows, err);
    if (st != ELLM_OK) {
        ellm_spec_cancel_step(s);
        return st;
    }
    return ellm_spec_verify_step(s, smp, -1, out, n_out, err);
}

static void stats_rates(ellm_spec_stats *st);

void ellm_spec_get_stats(const ellm_spec *s, ellm_spec_stats *out) {
    *out = s->st;
    stats_rates(out);
    out->mean_draft_len = s->st.verify_passes ? (double)s->k_sum / (double)s->st.verify_passes : 0;
    out->draft_len = s->k_next;
    out->token_accept = s->acc_n + s->miss_n > 0 ? s->acc_n / (s->acc_n + s->miss_n) : 0;
}

int spec_draft(ellm_spec *s, int32_t *hist, int n, int max, int32_t *out, ellm_error *err) {
    int nd = draft(s, s->n_drafters - 1, hist, n, max, out, err);
    use_target(s, s->target_topk);
    return nd;
}

/* Recomputes the rates of a stats record from its counts. */
static void stats_rates(ellm_spec_stats *st) {
    st->acceptance_rate = st->proposed ? (double)st->accepted / (double)st->proposed : 0;
    st->tokens_per_verify =
        st->verify_passes ? (double)(st->accepted + st->verify_passes) / (double)st->verify_passes : 0;
}

ellm_status ellm_spec_eval(ellm_context *ctx, const ellm_spec_params *params, const int32_t *tokens, int n,
                           int score_from, int every, ellm_spec_stats *acc, ellm_error *err) {
    if (n < 2 || score_from < 1 || score_from >= n - 1 || every < 1)
        return ellm_fail(err, ELLM_ERR_ARG, "spec eval: %d tokens, scoring from %d every %d: nothing to score", n,
                         score_from, every);
    if (n > ctx->n_ctx) return ellm_fail(err, ELLM_ERR_CONTEXT_FULL, "spec eval: %d tokens exceed the context", n);
    ellm_spec *s = NULL;
    ellm_status st = ellm_spec_init(ctx, params, &s, err);
    if (st != ELLM_OK) return st;
    const int K = s->p.draft_max, V = s->n_vocab;
    int32_t *h = malloc((size_t)(n + K + 2) * sizeof *h);
    int32_t g[SPEC_MAX_DRAFT + 1], d[SPEC_MAX_DRAFT + 1];
    if (!h) {
        ellm_spec_free(s);
        return ellm_fail(err, ELLM_ERR_NOMEM, "spec eval: out of memory");
    }
    ellm_context_truncate(ctx, 0);
    int pos = 0;
    for (int i = score_from; i + 1 < n && st == ELLM_OK; i += every) {
        /* the true prefix tokens[0 .. i), with its logits */
        if ((st = ellm_decode(ctx, tokens + pos, i - pos, NULL, err)) != ELLM_OK) break;
        pos = i;
        /* the target: the full model's greedy continuation g[0 .. K] */
        double t0 = ellm_time_ms();
        int kk = K;
        if (i + kk + 1 > ctx->n_ctx) kk = ctx->n_ctx - i - 1;
        g[0] = argmax(ellm_context_logits(ctx), V);
        for (int j = 1; j <= kk && st == ELLM_OK; j++) {
            st = ellm_decode(ctx, &g[j - 1], 1, NULL, err);
            if (st == ELLM_OK) g[j] = argmax(ellm_context_logits(ctx), V);
        }
        if (st != ELLM_OK) break;
        double t1 = ellm_time_ms();
        ellm_context_truncate(ctx, i);
        /* the drafters' proposal after [prefix, g0], accepted up to the first mismatch */
        memcpy(h, tokens, (size_t)i * sizeof *h);
        h[i] = g[0];
        int nd = spec_draft(s, h, i + 1, kk, d, err);
        if (nd < 0) {
            st = err ? err->status : ELLM_ERR_ARG;
            break;
        }
        double t2 = ellm_time_ms();
        ellm_context_truncate(ctx, i);
        int m = 0;
        while (m < nd && d[m] == g[m + 1]) m++;
        s->st.verify_passes++;
        s->st.proposed += nd;
        s->st.accepted += m;
        s->st.tokens += m + 1;
        s->st.verify_ms += t1 - t0;
        s->st.draft_ms += t2 - t1;
    }
    acc->verify_passes += s->st.verify_passes;
    acc->proposed += s->st.proposed;
    acc->accepted += s->st.accepted;
    acc->tokens += s->st.tokens;
    acc->draft_ms += s->st.draft_ms;
    acc->verify_ms += s->st.verify_ms;
    acc->rollback_ms += s->st.rollback_ms;
    stats_rates(acc);
    free(h);
    ellm_spec_free(s);
    return st;
}
