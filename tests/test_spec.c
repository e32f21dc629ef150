/* Self-speculative decoding (src/spec): drafter lists, n-gram lookup,
 * rollback (a truncated context equals a fresh one), greedy streams identical
 * to plain decoding over 1000+ tokens for every drafter and chain (dense and
 * sparse verification), and speculative sampling: a chi-square test that the
 * distribution of a verified token is the target's, which the same check must
 * reject when the acceptance step is broken on purpose; the quant drafter's
 * cache of the low-bit copy (made, reused, stale or torn files rebuilt,
 * unwritable folders falling back to the user cache folder and to memory). */
#include "ellm.h"
#include "harness.h"
#include "engine/sampler.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "model/model.h"
#include "spec/draft_map.h"
#include "spec/draft_model.h"
#include "spec/spec.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EVALMODEL "models/evalmodel.gguf"

static ellm_model *g_model;
static int g_vocab;
static const char *g_draft_map; /* generate(): the draft map of shallow drafters, or NULL */
static int g_adapt;             /* generate(): adaptive draft length */
static double g_draft_scale = 1; /* generate(): spec_set_draft_cost_scale */
/* generate(), when not NULL: for each token, the sum of the logits row it
 * was drawn from and its own logit there (speculative steps: the rows
 * ellm_spec_token_logits gives) */
static double *g_row_sum;
static float *g_tok_logit;

static void note_row(int k, const float *row, int32_t tok) {
    if (!g_row_sum) return;
    double sum = 0;
    for (int i = 0; row && i < g_vocab; i++) sum += row[i];
    g_row_sum[k] = row ? sum : NAN;
    g_tok_logit[k] = row ? row[tok] : NAN;
}
static char g_dir[256]; /* a temporary folder holding a copy of the model (its draft caches land beside it) */

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int32_t *prompt_tokens(int *n) {
    char path[512];
    snprintf(path, sizeof path, "%s/heldout-sample.txt", test_data_dir());
    char *text = test_read_file(path, NULL);
    CHECK(text != NULL, "%s", path);
    if (!text) return NULL;
    size_t len = strlen(text) < 3000 ? strlen(text) : 3000;
    int32_t *ids = malloc(4096 * sizeof *ids);
    ellm_error err;
    CHECK(ellm_tokenize(g_model, text, len, 1, 0, ids, 4096, n, &err) == ELLM_OK, "tokenize: %s", err.msg);
    free(text);
    return ids;
}

static ellm_context *make_ctx(int n_ctx, int topk) {
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 1; /* thread invariance is tests/test_batch_exact.c's */
    cp.sparse_topk = topk;
    ellm_context *ctx = NULL;
    ellm_error err;
    CHECK(ellm_context_init(g_model, &cp, &ctx, &err) == ELLM_OK, "context: %s", err.msg);
    return ctx;
}

static void test_parse(void) {
    spec_drafter d[SPEC_MAX_DRAFTERS];
    ellm_error err;
    CHECK(spec_parse_drafters("ngram", d, SPEC_MAX_DRAFTERS, &err) == 1 && d[0].kind == SPEC_DRAFT_NGRAM, "ngram");
    CHECK(spec_parse_drafters("ngram+sparse:128", d, SPEC_MAX_DRAFTERS, &err) == 2 && d[1].kind == SPEC_DRAFT_SPARSE &&
              d[1].budget == 128,
          "chain");
    CHECK(spec_parse_drafters("ngram+quant:q4_0:sparse:128", d, SPEC_MAX_DRAFTERS, &err) == 2 &&
              d[1].kind == SPEC_DRAFT_QUANT && d[1].qtype == 2 && d[1].budget == 128,
          "quant with a budget");
    CHECK(spec_parse_drafters("quant:Q4_K+shallow:2:sparse:64", d, SPEC_MAX_DRAFTERS, &err) == 2 &&
              d[0].kind == SPEC_DRAFT_QUANT && d[0].qtype == 12 && d[0].budget == 0 && d[1].kind == SPEC_DRAFT_SHALLOW &&
              d[1].n_layer == 2 && d[1].budget == 64,
          "quant:Q4_K, shallow with a budget");
    const char *bad[] = {"", "sparse", "sparse:", "sparse:0", "sparse:12x", "ngram+", "+ngram", "foo", "ngram++sparse:4",
                         "quant", "quant:", "quant:q9_9", "quant:q4_0:", "quant:q4_0:sparse", "quant:q4_0:sparse:0",
                         "quant:q4_0:dense", "shallow", "shallow:", "shallow:0", "shallow:2x", "shallow:2:sparse:"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(spec_parse_drafters(bad[i], d, SPEC_MAX_DRAFTERS, &err) == 0 && err.msg[0], "'%s' accepted", bad[i]);
    int32_t h[] = {5, 6, 7, 8, 9, 5, 6, 7}, out[8];
    int n = spec_ngram_propose(h, 8, 4, out);
    CHECK(n == 4 && out[0] == 8 && out[1] == 9 && out[2] == 5 && out[3] == 6, "ngram: continues 5 6 7 with 8 9 5 6 (got %d)", n);
    int32_t h2[] = {1, 2, 3, 4};
    CHECK(spec_ngram_propose(h2, 4, 4, out) == 0, "ngram: no repeat, no proposal");
}

/* Provisional KV (a draft at a small sparse budget) truncated away leaves a
 * context whose next logits equal a fresh context's, bit for bit. */
static void test_rollback(const int32_t *ids, int n) {
    const int keep = 300, extra = 40;
    ellm_context *a = make_ctx(1024, 0), *b = make_ctx(1024, 0);
    if (!a || !b) goto out;
    ellm_error err;
    float *la = malloc((size_t)8 * g_vocab * sizeof(float)), *lb = malloc((size_t)8 * g_vocab * sizeof(float));
    ellm_decode(a, ids, keep, NULL, &err);
    ellm_context_set_sparse(a, 48, &err);
    for (int i = 0; i < extra; i++) ellm_decode(a, ids + keep + i, 1, NULL, &err); /* provisional, sparse */
    ellm_context_set_sparse(a, 0, &err);
    CHECK(ellm_context_truncate(a, keep) == ELLM_OK && ellm_context_pos(a) == keep, "truncate");
    ellm_decode(a, ids + keep, 8, la, &err);
    ellm_decode(b, ids, keep, NULL, &err);
    ellm_decode(b, ids + keep, 8, lb, &err);
    CHECK(!memcmp(la, lb, (size_t)8 * g_vocab * sizeof(float)), "rolled-back context differs from a fresh one");
    /* and at a sparse budget, where the index's rebuilt summaries matter */
    ellm_context_set_sparse(a, 64, &err);
    ellm_context_set_sparse(b, 64, &err);
    for (int i = 0; i < 8; i++) {
        ellm_decode(a, ids + keep + 8 + i, 1, la, &err);
        ellm_decode(b, ids + keep + 8 + i, 1, lb, &err);
    }
    CHECK(!memcmp(la, lb, (size_t)g_vocab * sizeof(float)), "rolled-back sparse context differs from a fresh one");
    free(la);
    free(lb);
    (void)n;
out:
    ellm_context_free(a);
    ellm_context_free(b);
}

/* Greedy generation of n_gen tokens after the prompt, plain or speculative. */
static int generate(const int32_t *prompt, int n_prompt, int n_gen, int topk, const char *drafters, int verify_sparse,
                    int32_t *out, ellm_spec_stats *stats) {
    ellm_context *ctx = make_ctx(n_prompt + n_gen + 8, topk);
    ellm_sampler_params sp = ellm_sampler_default_params();
    sp.temperature = 0;
    ellm_sampler *smp = NULL;
    ellm_spec *spec = NULL;
    ellm_error err;
    int got = 0;
    int32_t *hist = malloc((size_t)(n_prompt + n_gen + 40) * sizeof *hist);
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    if (!ctx || ellm_sampler_init(&sp, g_vocab, &smp, &err) != ELLM_OK) goto out;
    if (drafters) {
        ellm_spec_params p = ellm_spec_default_params();
        p.drafters = drafters;
        p.verify_sparse = verify_sparse;
        p.draft_map = g_draft_map;
        p.adapt = g_adapt;
        ellm_status st = ellm_spec_init(ctx, &p, &spec, &err);
        CHECK(st == ELLM_OK, "spec init %s: %s", drafters, err.msg);
        if (st != ELLM_OK) goto out;
        if (g_row_sum) CHECK(ellm_spec_keep_logits(spec, 1, &err) == ELLM_OK, "keep logits: %s", err.msg);
        spec_set_draft_cost_scale(spec, g_draft_scale);
    }
    CHECK(ellm_decode(ctx, prompt, n_prompt, NULL, &err) == ELLM_OK, "prefill: %s", err.msg);
    while (got < n_gen) {
        int32_t t[40];
        int nt = 1;
        if (spec) {
            if (ellm_spec_step(spec, smp, hist, n_prompt + got, n_gen - got, t, &nt, &err) != ELLM_OK) {
                CHECK(0, "spec step: %s", err.msg);
                break;
            }
            for (int i = 0; i < nt && got + i < n_gen; i++) note_row(got + i, ellm_spec_token_logits(spec, i), t[i]);
        } else {
            t[0] = ellm_sampler_sample(smp, ellm_context_logits(ctx), hist, n_prompt + got);
            note_row(got, ellm_context_logits(ctx), t[0]);
            if (got + 1 < n_gen) ellm_decode(ctx, t, 1, NULL, &err);
        }
        for (int i = 0; i < nt && got < n_gen; i++) hist[n_prompt + got] = out[got] = t[i], got++;
    }
    if (spec && stats) ellm_spec_get_stats(spec, stats);
out:
    free(hist);
    ellm_spec_free(spec);
    ellm_sampler_free(smp);
    ellm_context_free(ctx);
    return got;
}

static void test_greedy_streams(const int32_t *prompt, int n_prompt, const char *map) {
    const int n_gen = 1000;
    int32_t *ref = malloc(n_gen * sizeof *ref), *got = malloc(n_gen * sizeof *got),
            *ref_sparse = malloc(n_gen * sizeof *ref);
    /* the logits rows each token came from (ellm_spec_token_logits for the
     * speculative runs): the same as plain decoding's, bit for bit */
    double *sum_ref[2], *sum_got = malloc(n_gen * sizeof *sum_got);
    float *tok_ref[2], *tok_got = malloc(n_gen * sizeof *tok_got);
    for (int v = 0; v < 2; v++) {
        sum_ref[v] = malloc(n_gen * sizeof **sum_ref);
        tok_ref[v] = malloc(n_gen * sizeof **tok_ref);
        g_row_sum = sum_ref[v];
        g_tok_logit = tok_ref[v];
        generate(prompt, n_prompt, n_gen, v ? 128 : -1, NULL, 0, v ? ref_sparse : ref, NULL);
    }
    g_row_sum = sum_got;
    g_tok_logit = tok_got;
    static const struct {
        const char *drafters;
        int topk, verify_sparse;
    } cases[] = {
        {"ngram", -1, 0},
        {"sparse:48", 0, 0},
        {"ngram+sparse:48", 0, 0},
        {"sparse:48", 128, 1}, /* sparse verification: the output of sparse decoding */
        {"quant:q4_0", -1, 0},
        {"ngram+quant:q4_0", -1, 0},
        {"quant:q8_0:sparse:48", 0, 0},
        {"shallow:2", -1, 0},
        {"quant:q4_0:sparse:48", 128, 1},
        {"quant:q3_k", -1, 0},
        {"quant:q2_k:sparse:48", 0, 0},
        {"quant:iq4_nl", -1, 0},
        {"shallow:2+map", -1, 0}, /* with the draft map of test_draft_map */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ellm_spec_stats st = {0};
        memset(got, 0xff, n_gen * sizeof *got);
        const char *drafters = cases[c].drafters;
        g_draft_map = NULL;
        if (strstr(drafters, "+map")) {
            if (!map || !*map) continue;
            g_draft_map = map;
            drafters = "shallow:2";
        }
        int n = generate(prompt, n_prompt, n_gen, cases[c].topk, drafters, cases[c].verify_sparse, got, &st);
        g_draft_map = NULL;
        const int32_t *want = cases[c].verify_sparse ? ref_sparse : ref;
        int same = 0;
        while (same < n_gen && got[same] == want[same]) same++;
        CHECK(n == n_gen && same == n_gen, "--spec %s (verify %s): stream differs from plain decoding at token %d",
              cases[c].drafters, cases[c].verify_sparse ? "sparse" : "dense", same);
        const int v = cases[c].verify_sparse;
        int rows_same = 0;
        while (rows_same < n_gen && !memcmp(&sum_got[rows_same], &sum_ref[v][rows_same], sizeof *sum_got) &&
               !memcmp(&tok_got[rows_same], &tok_ref[v][rows_same], sizeof *tok_got))
            rows_same++;
        CHECK(rows_same == n_gen, "--spec %s: the logits of token %d (ellm_spec_token_logits) differ from plain decoding's",
              cases[c].drafters, rows_same);
        CHECK(st.verify_passes > 0 && st.verify_passes < n_gen, "%s: %lld verify passes for %d tokens",
              cases[c].drafters, (long long)st.verify_passes, n_gen);
        printf("spec %-22s verify %-6s: %d tokens identical, acceptance %.3f, %.2f tokens per verify\n",
               cases[c].drafters, cases[c].verify_sparse ? "sparse" : "dense", same, st.acceptance_rate,
               st.tokens_per_verify);
    }
    g_row_sum = NULL;
    g_tok_logit = NULL;
    for (int v = 0; v < 2; v++) {
        free(sum_ref[v]);
        free(tok_ref[v]);
    }
    free(sum_got);
    free(tok_got);
    free(ref);
    free(got);
    free(ref_sparse);
}

/* The adaptive draft length's choice against costs like those measured on a
 * 2-core Zen 5 guest (SmolLM2-135M shape, Q8_0 KV, 16K: a plain step 8.36 ms,
 * a q4_0 draft token 3.2 ms, a verify pass of 4 tokens 21.3 ms, acceptance
 * for 5.35 tokens per verify at k = 8): drafting loses there, so plain steps
 * (0); with cheap drafts and a verify pass that barely grows it drafts, the
 * length ellm_spec_best_draft_length gives; a plain step not yet timed is
 * never chosen. */
static void test_choose_length(void) {
    const int K = 8;
    double est[K + 2], cheap[K + 2], unknown[K + 2];
    for (int n = 1; n <= K + 1; n++) {
        est[n] = 8.36 + 4.31 * (n - 1);
        cheap[n] = 8.36 + 0.2 * (n - 1);
        unknown[n] = n == 1 ? 0 : est[n];
    }
    double a = ellm_spec_token_acceptance(5.35, K);
    CHECK(fabs(ellm_spec_tokens_per_verify(a, K) - 5.35) < 1e-6, "acceptance for 5.35 tokens per verify: %f", a);
    CHECK(spec_choose_length(a, 3.2, est, K, NULL) == 0, "expensive drafts: %d, not a plain step",
          spec_choose_length(a, 3.2, est, K, NULL));
    int best = ellm_spec_best_draft_length(a, 0.3, cheap + 1, K, NULL);
    CHECK(best >= 4 && spec_choose_length(a, 0.3, cheap, K, NULL) == best, "cheap drafts: %d (best length %d)",
          spec_choose_length(a, 0.3, cheap, K, NULL), best);
    CHECK(spec_choose_length(a, 3.2, unknown, K, NULL) == ellm_spec_best_draft_length(a, 3.2, unknown + 1, K, NULL) &&
              spec_choose_length(a, 3.2, unknown, K, NULL) >= 1,
          "an untimed plain step is not chosen");
    /* at equal rates the drafter keeps the pass */
    double even[3] = {0, 10, 10};
    CHECK(spec_choose_length(1.0, 0, even, 1, NULL) == 1, "equal rates: %d", spec_choose_length(1.0, 0, even, 1, NULL));
}

/* Adaptive speculation where drafting costs far more than it saves (each
 * draft counted 10^6 times its time): after the first passes (draft_max, half,
 * 1, then a plain step to time it) it takes plain steps, trying to draft again
 * after 32, then 64, 128 ... plain steps, and its greedy stream stays plain
 * decoding's. */
static void test_adaptive_plain(const int32_t *prompt, int n_prompt) {
    const int n_gen = 400;
    int32_t *ref = malloc(n_gen * sizeof *ref), *got = malloc(n_gen * sizeof *got);
    generate(prompt, n_prompt, n_gen, -1, NULL, 0, ref, NULL);
    static const char *drafters[] = {"sparse:48", "ngram+quant:q4_0"};
    for (int c = 0; c < 2; c++) {
        ellm_spec_stats st = {0};
        g_adapt = 1;
        g_draft_scale = 1e6;
        int n = generate(prompt, n_prompt, n_gen, drafters[c][0] == 's' ? 0 : -1, drafters[c], 0, got, &st);
        g_adapt = 0;
        g_draft_scale = 1;
        int same = 0;
        while (same < n && same < n_gen && got[same] == ref[same]) same++;
        CHECK(n == n_gen && same == n_gen, "adaptive %s: stream differs from plain decoding at token %d", drafters[c],
              same);
        int64_t drafting = st.verify_passes - st.plain_passes;
        /* 3 first passes, then tries of drafting after 32, 64, 128 and 256 plain steps */
        CHECK(st.plain_passes > 0 && drafting <= 3 + 4, "adaptive %s with costly drafts: %lld of %lld passes plain",
              drafters[c], (long long)st.plain_passes, (long long)st.verify_passes);
        CHECK(st.draft_len == 0, "adaptive %s: next length %d, not plain", drafters[c], st.draft_len);
        printf("adaptive %-18s with costly drafts: %lld of %lld passes plain, %d tokens identical\n", drafters[c],
               (long long)st.plain_passes, (long long)st.verify_passes, same);
    }
    free(ref);
    free(got);
}

/* Chi-square statistic of counts against probabilities (bins with expected
 * count < 5 pooled); *df receives the degrees of freedom. */
static double chi_square(const int *count, const double *p, int n_bins, int total, int *df) {
    double chi = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < n_bins; i++) {
        double e = p[i] * total;
        if (e < 5) {
            pool_e += e;
            pool_o += count[i];
            continue;
        }
        chi += (count[i] - e) * (count[i] - e) / e;
        bins++;
    }
    if (pool_e > 0) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e > 1e-9 ? pool_e : 1e-9);
        bins++;
    }
    *df = bins - 1;
    return chi;
}

/* Critical value of chi-square at p = 0.001 (Wilson-Hilferty). */
static double chi_crit(int df) {
    double z = 3.0902, a = 2.0 / (9.0 * df);
    double t = 1 - a + z * sqrt(a);
    return df * t * t * t;
}

/* The token after the first sampled one: its exact distribution, summed over
 * the first token's outcomes, against many speculative runs (sparse:48 drafts
 * the model's own argmax, accepted with probability p; rejections draw from p
 * without it). With acceptance broken (every draft kept) the test must fail. */
static void test_sampling(const int32_t *prompt, int n_prompt) {
    const int n_pre = 120, trials = 1500;
    ellm_sampler_params sp = ellm_sampler_default_params();
    sp.temperature = 1.0f;
    sp.top_k = 12;
    sp.top_p = 1.0f;
    sp.min_p = 0;
    ellm_context *ctx = make_ctx(n_pre + 40, 0);
    ellm_sampler *smp = NULL;
    ellm_error err;
    if (!ctx || ellm_sampler_init(&sp, g_vocab, &smp, &err) != ELLM_OK) goto out;
    /* exact: P(t2) = sum_t1 P(t1) P(t2 | t1) */
    float *p1 = malloc((size_t)g_vocab * sizeof *p1), *p2 = malloc((size_t)g_vocab * sizeof *p2);
    double *expect = calloc((size_t)g_vocab, sizeof *expect);
    int32_t hist[256];
    memcpy(hist, prompt, (size_t)n_pre * sizeof *hist);
    ellm_decode(ctx, prompt, n_pre, NULL, &err);
    engine_sampler_probs(smp, ellm_context_logits(ctx), hist, n_pre, p1);
    for (int t1 = 0; t1 < g_vocab; t1++) {
        if (p1[t1] <= 0) continue;
        ellm_context_truncate(ctx, n_pre);
        ellm_decode(ctx, &t1, 1, NULL, &err);
        hist[n_pre] = t1;
        engine_sampler_probs(smp, ellm_context_logits(ctx), hist, n_pre + 1, p2);
        for (int i = 0; i < g_vocab; i++) expect[i] += (double)p1[t1] * p2[i];
    }
    for (int broken = 0; broken < 2; broken++) {
        int *count = calloc((size_t)g_vocab, sizeof *count);
        int64_t accepted = 0, proposed = 0;
        for (int trial = 0; trial < trials; trial++) {
            ellm_sampler *s = NULL;
            ellm_spec *spec = NULL;
            sp.seed = 1000 + (uint64_t)trial;
            ellm_sampler_init(&sp, g_vocab, &s, &err);
            ellm_spec_params p = ellm_spec_default_params();
            p.drafters = "sparse:48";
            p.draft_max = 2;
            ellm_spec_init(ctx, &p, &spec, &err);
            spec_set_accept_all(spec, broken);
            /* back to the prefix, with its logits */
            ellm_context_truncate(ctx, n_pre - 1);
            ellm_decode(ctx, prompt + n_pre - 1, 1, NULL, &err);
            int32_t t[40];
            int nt = 0;
            ellm_spec_step(spec, s, hist, n_pre, 2, t, &nt, &err);
            if (nt == 2) count[t[1]]++;
            ellm_spec_stats st;
            ellm_spec_get_stats(spec, &st);
            accepted += st.accepted;
            proposed += st.proposed;
            ellm_spec_free(spec);
            ellm_sampler_free(s);
        }
        int df;
        double chi = chi_square(count, expect, g_vocab, trials, &df);
        printf("speculative sampling%s: chi-square %.1f, df %d, critical (p=0.001) %.1f; %lld of %lld drafts accepted\n",
               broken ? " with acceptance broken" : "", chi, df, chi_crit(df), (long long)accepted,
               (long long)proposed);
        if (!broken) {
            CHECK(df >= 3 && chi < chi_crit(df), "second-token distribution differs from the target's: chi2 %.1f df %d",
                  chi, df);
            CHECK(accepted > 0 && accepted < proposed, "both acceptances and rejections exercised (%lld of %lld)",
                  (long long)accepted, (long long)proposed);
        } else {
            CHECK(chi > chi_crit(df), "the broken acceptance step went undetected: chi2 %.1f df %d", chi, df);
        }
        free(count);
    }
    free(p1);
    free(p2);
    free(expect);
out:
    ellm_sampler_free(smp);
    ellm_context_free(ctx);
}

/* Teacher-forced evaluation: a sparse drafter whose budget covers the whole
 * window is the target itself, so every draft is accepted (K + 1 tokens per
 * verify); a tiny budget and the n-gram drafter accept less, within [0, 1]. */
static void test_eval(const int32_t *ids, int n) {
    if (n > 600) n = 600;
    ellm_context *ctx = make_ctx(n, 0);
    if (!ctx) return;
    ellm_error err;
    ellm_spec_params p = ellm_spec_default_params();
    p.draft_max = 4;
    ellm_spec_stats full = {0}, tiny = {0}, ng = {0};
    p.drafters = "sparse:4096";
    CHECK(ellm_spec_eval(ctx, &p, ids, n, 256, 16, &full, &err) == ELLM_OK, "eval: %s", err.msg);
    CHECK(full.verify_passes > 10 && full.acceptance_rate == 1.0 && full.tokens_per_verify == 5.0,
          "a drafter equal to the target: acceptance %.3f, %.2f tokens per verify over %lld samples",
          full.acceptance_rate, full.tokens_per_verify, (long long)full.verify_passes);
    p.drafters = "sparse:48";
    CHECK(ellm_spec_eval(ctx, &p, ids, n, 256, 16, &tiny, &err) == ELLM_OK, "eval: %s", err.msg);
    p.drafters = "ngram";
    CHECK(ellm_spec_eval(ctx, &p, ids, n, 256, 16, &ng, &err) == ELLM_OK, "eval: %s", err.msg);
    CHECK(tiny.acceptance_rate > 0 && tiny.acceptance_rate < 1 && ng.acceptance_rate >= 0 && ng.acceptance_rate < 1,
          "sparse:48 acceptance %.3f, ngram %.3f", tiny.acceptance_rate, ng.acceptance_rate);
    printf("teacher-forced, K=4: sparse:48 %.2f tokens per verify, ngram %.2f\n", tiny.tokens_per_verify,
           ng.tokens_per_verify);
    CHECK(ellm_spec_eval(ctx, &p, ids, n, n, 16, &ng, &err) == ELLM_ERR_ARG, "nothing to score is an error");
    ellm_context_free(ctx);
}

/* One quant:q4_0 copy of the model at `path`, loaded fresh; *info says where
 * it came from and w0 gets its first requantized row (layer 0's wq). */
static ellm_status quant_copy(const char *path, draft_quant_info *info, unsigned char *w0, size_t w0_cap) {
    ellm_model *m = NULL;
    const ellm_model *q = NULL;
    ellm_error err;
    ellm_status st = ellm_model_load(path, NULL, &m, &err);
    CHECK(st == ELLM_OK, "load %s: %s", path, err.msg);
    if (st != ELLM_OK) return st;
    st = draft_model_quant(m, 2 /* q4_0 */, &q, info, &err);
    CHECK(st == ELLM_OK, "quant copy of %s: %s", path, err.msg);
    if (st == ELLM_OK) {
        const model_matrix *w = &q->layers[0].wq;
        CHECK(w->type == 2 && w->row_bytes < m->layers[0].wq.row_bytes && q->output.type == 2,
              "the copy's matrices are q4_0 and smaller");
        memcpy(w0, w->data, w->row_bytes < w0_cap ? w->row_bytes : w0_cap);
        const ellm_model *again = NULL;
        CHECK(draft_model_quant(m, 2, &again, NULL, &err) == ELLM_OK && again == q, "one copy per model and type");
    }
    ellm_model_free(m);
    return st;
}

/* The quant:q4_0 copy in the 16-row interleaved layout where the CPU has its
 * kernel, as the model's own Q4_0 matrices would be; in the plain layout when
 * the model was loaded with keep_layout. Both copies' rows read back alike,
 * whether made in memory or loaded from the cache file (which holds the plain
 * layout). */
static void test_quant_layout(void) {
    char model[300], cache[340];
    snprintf(model, sizeof model, "%s/layout-test.gguf", g_dir);
    snprintf(cache, sizeof cache, "%s.q4_0.ellm-draft", model);
    size_t n = 0;
    char *bytes = test_read_file(EVALMODEL, &n);
    CHECK(bytes && write_file(model, bytes, n) == 0, "copy the model to %s", model);
    free(bytes);
    unlink(cache);
    for (int from_cache = 0; from_cache < 2; from_cache++) {
        ellm_model *m = NULL, *k = NULL;
        const ellm_model *q = NULL, *qk = NULL;
        ellm_error err;
        ellm_model_params kp = {.keep_layout = 1};
        draft_quant_info info;
        if (ellm_model_load(model, NULL, &m, &err) != ELLM_OK || ellm_model_load(model, &kp, &k, &err) != ELLM_OK ||
            draft_model_quant(m, QTYPE_Q4_0, &q, &info, &err) != ELLM_OK ||
            draft_model_quant(k, QTYPE_Q4_0, &qk, NULL, &err) != ELLM_OK) {
            CHECK(0, "quant copies of %s: %s", model, err.msg);
            ellm_model_free(m);
            ellm_model_free(k);
            break;
        }
        CHECK(info.state == (from_cache ? DRAFT_CACHE_LOADED : DRAFT_CACHE_SAVED), "copy %d: cache state %d", from_cache,
              info.state);
        int packed = 0, kept = 0, total = 0;
        long rows_differ = 0;
        float *ra = malloc((size_t)m->cfg.n_ff * 4 + (size_t)m->cfg.n_embd * 4), *rb = malloc((size_t)m->cfg.n_ff * 4 + (size_t)m->cfg.n_embd * 4);
        for (int l = 0; l < m->cfg.n_layer; l++) {
            const model_layer *A = &q->layers[l], *B = &qk->layers[l];
            const model_matrix *a[7] = {&A->wq, &A->wk, &A->wv, &A->wo, &A->w_gate, &A->w_up, &A->w_down};
            const model_matrix *b[7] = {&B->wq, &B->wk, &B->wv, &B->wo, &B->w_gate, &B->w_up, &B->w_down};
            for (int i = 0; i < 7; i++, total++) {
                packed += a[i]->layout == MODEL_LAYOUT_R16;
                kept += b[i]->layout == MODEL_LAYOUT_ROWS && b[i]->type == QTYPE_Q4_0;
                for (int64_t r = 0; r < a[i]->rows; r++) {
                    model_matrix_row(a[i], r, ra);
                    model_matrix_row(b[i], r, rb);
                    rows_differ += memcmp(ra, rb, (size_t)a[i]->cols * 4) != 0;
                }
            }
        }
        free(ra);
        free(rb);
        CHECK(kept == total, "copy %d with keep_layout: %d of %d matrices plain Q4_0", from_cache, kept, total);
        CHECK(rows_differ == 0, "copy %d: %ld rows read back differently in the two layouts", from_cache, rows_differ);
        if (kern_r16_fast())
            CHECK(packed == total && q->output.layout == MODEL_LAYOUT_R16, "copy %d: %d of %d matrices interleaved",
                  from_cache, packed, total);
        else
            SKIP("quant copy interleaving: this CPU has neither AVX2 nor AVX-512");
        ellm_model_free(m);
        ellm_model_free(k);
    }
    unlink(cache);
    unlink(model);
}

/* The low-bit copy's cache: made beside the model, reused, rebuilt when the
 * model file changed or the cache is torn; beside an unwritable folder it goes
 * to $XDG_CACHE_HOME/ellm, and with no writable place at all to memory. */
static void test_quant_cache(void) {
    char model[300], cache[340], xdg[300], file[300], w0[64], w1[64];
    draft_quant_info info;
    snprintf(model, sizeof model, "%s/cache-test.gguf", g_dir);
    snprintf(cache, sizeof cache, "%s.q4_0.ellm-draft", model);
    snprintf(xdg, sizeof xdg, "%s/xdg", g_dir);
    size_t n = 0;
    char *bytes = test_read_file(EVALMODEL, &n);
    CHECK(bytes && write_file(model, bytes, n) == 0, "copy the model to %s", model);
    if (!bytes) return;
    setenv("XDG_CACHE_HOME", xdg, 1);
    unlink(cache);
    if (quant_copy(model, &info, (unsigned char *)w0, sizeof w0) != ELLM_OK) goto out;
    struct stat st;
    CHECK(info.state == DRAFT_CACHE_SAVED && !strcmp(info.path, cache) && stat(cache, &st) == 0 && st.st_size > 4096,
          "first load saves the copy beside the model (state %d, %s)", info.state, info.path);
    quant_copy(model, &info, (unsigned char *)w1, sizeof w1);
    CHECK(info.state == DRAFT_CACHE_LOADED && !strcmp(info.path, cache) && !memcmp(w0, w1, sizeof w0),
          "second load reuses the cache file (state %d)", info.state);

    /* the model file changed (same bytes but a new file: new inode and time) */
    unlink(model);
    CHECK(write_file(model, bytes, n) == 0, "rewrite");
    struct timespec ts[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
    utimensat(AT_FDCWD, model, ts, 0);
    quant_copy(model, &info, (unsigned char *)w1, sizeof w1);
    CHECK(info.state == DRAFT_CACHE_SAVED && strstr(info.rejected, "stale") && !memcmp(w0, w1, sizeof w0),
          "a changed model file: the stale cache is rebuilt (state %d, '%s')", info.state, info.rejected);
    /* a torn cache file (cut short) */
    CHECK(truncate(cache, 8192) == 0, "truncate the cache");
    quant_copy(model, &info, (unsigned char *)w1, sizeof w1);
    CHECK(info.state == DRAFT_CACHE_SAVED && strstr(info.rejected, "torn"), "a torn cache is rebuilt ('%s')",
          info.rejected);
    quant_copy(model, &info, (unsigned char *)w1, sizeof w1);
    CHECK(info.state == DRAFT_CACHE_LOADED, "... and then reused (state %d)", info.state);

    /* an unwritable model folder: /proc/self/fd/N names the model, and no
     * file can be made in /proc/self/fd, even by root */
    int fd = open(model, O_RDONLY);
    char via_fd[64];
    snprintf(via_fd, sizeof via_fd, "/proc/self/fd/%d", fd);
    struct stat pst;
    if (fd < 0 || stat(via_fd, &pst) != 0) {
        SKIP("no /proc/self/fd here: the unwritable-folder fallback is not tested");
    } else {
        quant_copy(via_fd, &info, (unsigned char *)w1, sizeof w1);
        CHECK(info.state == DRAFT_CACHE_SAVED && !strncmp(info.path, xdg, strlen(xdg)) &&
                  strstr(info.path, "/ellm/") && stat(info.path, &st) == 0,
              "unwritable model folder: saved in $XDG_CACHE_HOME/ellm (state %d, %s)", info.state, info.path);
        quant_copy(via_fd, &info, (unsigned char *)w1, sizeof w1);
        CHECK(info.state == DRAFT_CACHE_LOADED && !strncmp(info.path, xdg, strlen(xdg)) && !memcmp(w0, w1, sizeof w0),
              "... and reused from there (state %d)", info.state);
        if (info.path[0]) unlink(info.path);
        /* no writable place at all: $XDG_CACHE_HOME under a regular file */
        snprintf(file, sizeof file, "%s/not-a-folder", g_dir);
        write_file(file, "x", 1);
        char bad_xdg[340];
        snprintf(bad_xdg, sizeof bad_xdg, "%s/cache", file);
        setenv("XDG_CACHE_HOME", bad_xdg, 1);
        quant_copy(via_fd, &info, (unsigned char *)w1, sizeof w1);
        CHECK(info.state == DRAFT_CACHE_MEMORY && !memcmp(w0, w1, sizeof w0), "no writable folder: kept in memory (state %d)",
              info.state);
        unlink(file);
        setenv("XDG_CACHE_HOME", xdg, 1);
    }
    if (fd >= 0) close(fd);
    {
        ellm_error err;
        ellm_model *m = NULL;
        const ellm_model *q = NULL;
        if (ellm_model_load(model, NULL, &m, &err) == ELLM_OK) {
            CHECK(draft_model_quant(m, 0 /* f32: not smaller */, &q, NULL, &err) == ELLM_ERR_ARG, "quant:f32 refused");
            CHECK(draft_model_quant(m, 16 /* iq2_xxs: no quantizer */, &q, NULL, &err) == ELLM_ERR_ARG, "iq2_xxs refused");
            ellm_model_free(m);
        }
    }
out:
    unlink(cache);
    unlink(model);
    free(bytes);
}

/* The least-squares solve against a known answer; a singular system fails. */
static void test_map_solve(void) {
    enum { N = 7, C = 3 };
    double M[N * N], A[N * N], X[N * C], B[N * C];
    unsigned r = 12345;
    for (int i = 0; i < N * N; i++) M[i] = (double)((r = r * 1103515245u + 12345u) >> 16 & 1023) / 512.0 - 1.0;
    for (int i = 0; i < N * C; i++) X[i] = (double)((r = r * 1103515245u + 12345u) >> 16 & 1023) / 256.0 - 2.0;
    for (int i = 0; i < N; i++) /* A = M M^T + I: positive definite */
        for (int j = 0; j < N; j++) {
            double v = i == j;
            for (int k = 0; k < N; k++) v += M[i * N + k] * M[j * N + k];
            A[i * N + j] = v;
        }
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            double v = 0;
            for (int k = 0; k < N; k++) v += A[i * N + k] * X[k * C + c];
            B[i * C + c] = v;
        }
    /* draft_map_solve takes square right-hand sides: pad to N columns */
    double Bs[N * N] = {0};
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) Bs[i * N + c] = B[i * C + c];
    CHECK(draft_map_solve(A, Bs, N, 0) == 0, "solve");
    double worst = 0;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) worst = fmax(worst, fabs(Bs[i * N + c] - X[i * C + c]));
    CHECK(worst < 1e-9, "least-squares solve: error %g", worst);
    double Z[4] = {1, 1, 1, 1}, Zb[4] = {1, 0, 0, 1};
    CHECK(draft_map_solve(Z, Zb, 2, 0) == -1, "a singular system is refused");
}

/* A draft map fitted over the first windows of the text (layers 2 and 4):
 * written, read back for shallow:2, refused for a K it lacks and for a file
 * that is no map; greedy streams with it stay plain decoding's (in
 * test_greedy_streams). Returns the map's path in `path`, or "" on failure. */
static void test_draft_map(const int32_t *ids, int n, char *path, size_t cap) {
    ellm_context *ctx = make_ctx(512, -1);
    ellm_draft_calib *dc = NULL;
    ellm_error err;
    int layers[2] = {2, 4}, bad_layers[1] = {6};
    snprintf(path, cap, "%s/draft-map.gguf", g_dir);
    CHECK(ellm_draft_calib_init(g_model, bad_layers, 1, 1, &dc, &err) == ELLM_ERR_ARG, "K = all layers refused");
    CHECK(ellm_draft_calib_init(g_model, layers, 2, 1, &dc, &err) == ELLM_OK, "calib init: %s", err.msg);
    if (!ctx || !dc) goto out;
    CHECK(ellm_draft_calib_write(dc, path, &err) == ELLM_ERR_ARG, "a fit of no tokens is refused");
    for (int w = 0; w + 512 <= n && w < 1024; w += 512)
        CHECK(ellm_draft_calib_collect(ctx, dc, ids + w, 512, &err) == ELLM_OK, "collect: %s", err.msg);
    CHECK(ellm_draft_calib_write(dc, path, &err) == ELLM_OK, "write: %s", err.msg);
    float *W = NULL;
    int norm = 0;
    CHECK(draft_map_load(path, 192, 6, 2, &W, &norm, &err) == ELLM_OK && W && norm, "load the map for 2 layers: %s",
          err.msg);
    int finite = W != NULL, nonzero = 0;
    for (int i = 0; W && i < 192 * 192; i++) finite &= isfinite(W[i]), nonzero += W[i] != 0;
    CHECK(finite && nonzero > 192, "the map is finite and not empty (%d nonzero)", nonzero);
    free(W);
    W = NULL;
    CHECK(draft_map_load(path, 192, 6, 3, &W, &norm, &err) == ELLM_ERR_FORMAT && !W && strstr(err.msg, "no map for 3"),
          "no map for 3 layers: %s", err.msg);
    CHECK(draft_map_load(path, 256, 6, 2, &W, &norm, &err) == ELLM_ERR_FORMAT && !W, "another model's width refused");
    char model[300];
    snprintf(model, sizeof model, "%s/evalmodel.gguf", g_dir);
    CHECK(draft_map_load(model, 192, 6, 2, &W, &norm, &err) == ELLM_ERR_FORMAT && !W, "a model file is no draft map");
    ellm_spec_params p = ellm_spec_default_params();
    ellm_spec *spec = NULL;
    p.drafters = "shallow:3";
    p.draft_map = path;
    CHECK(ellm_spec_init(ctx, &p, &spec, &err) == ELLM_ERR_FORMAT && !spec, "shallow:3 with a map lacking 3 refused");
    /* teacher-forced acceptance with and without the map (reported; the map
     * was fitted on these very tokens, so this is no held-out figure) */
    ellm_context *ectx = make_ctx(600, 0);
    ellm_spec_stats with = {0}, without = {0};
    p.drafters = "shallow:2";
    p.draft_max = 4;
    if (ectx && n >= 600) {
        CHECK(ellm_spec_eval(ectx, &p, ids, 600, 256, 8, &with, &err) == ELLM_OK, "eval with map: %s", err.msg);
        p.draft_map = NULL;
        CHECK(ellm_spec_eval(ectx, &p, ids, 600, 256, 8, &without, &err) == ELLM_OK, "eval: %s", err.msg);
        printf("shallow:2, K=4, on the fitted text: acceptance %.3f with the map, %.3f without\n", with.acceptance_rate,
               without.acceptance_rate);
    }
    ellm_context_free(ectx);
out:
    ellm_draft_calib_free(dc);
    ellm_context_free(ctx);
}

static void test_errors(void) {
    ellm_context *dense = make_ctx(64, -1);
    ellm_spec *spec = NULL;
    ellm_error err;
    ellm_spec_params p = ellm_spec_default_params();
    p.drafters = "sparse:32";
    CHECK(ellm_spec_init(dense, &p, &spec, &err) == ELLM_ERR_ARG && !spec, "sparse drafter on a dense-only context");
    p.drafters = "ngram";
    p.draft_max = 0;
    CHECK(ellm_spec_init(dense, &p, &spec, &err) == ELLM_ERR_ARG, "draft_max 0");
    p.draft_max = 8;
    p.verify_sparse = 1;
    CHECK(ellm_spec_init(dense, &p, &spec, &err) == ELLM_ERR_ARG, "sparse verify without a budget");
    p.verify_sparse = 0;
    CHECK(ellm_spec_init(dense, &p, &spec, &err) == ELLM_OK, "ngram: %s", err.msg);
    ellm_sampler *smp = NULL;
    ellm_sampler_init(NULL, g_vocab, &smp, &err);
    int32_t h[1] = {1}, out[40];
    int n;
    CHECK(ellm_spec_step(spec, smp, h, 1, 4, out, &n, &err) == ELLM_ERR_ARG, "step before any logits");
    ellm_sampler_free(smp);
    ellm_spec_free(spec);
    ellm_context_free(dense);
}

int main(void) {
    ellm_error err;
    /* the model is used from a temporary copy, so that the quant drafters'
     * caches are made beside it and not in the source tree */
    if (snprintf(g_dir, sizeof g_dir, "%s", test_tmp_dir()) >= (int)sizeof g_dir) {
        fprintf(stderr, "temporary folder path too long: %s\n", test_tmp_dir());
        return 1;
    }
    char model[300];
    size_t n_bytes = 0;
    char *bytes = test_read_file(EVALMODEL, &n_bytes);
    CHECK(bytes, "read %s", EVALMODEL);
    snprintf(model, sizeof model, "%s/evalmodel.gguf", g_dir);
    CHECK(bytes && write_file(model, bytes, n_bytes) == 0, "copy the model");
    free(bytes);
    char xdg[300];
    snprintf(xdg, sizeof xdg, "%s/xdg", g_dir);
    setenv("XDG_CACHE_HOME", xdg, 1);
    if (ellm_model_load(model, NULL, &g_model, &err) != ELLM_OK) {
        CHECK(0, "load %s: %s", model, err.msg);
        return test_finish();
    }
    ellm_model_info info;
    ellm_model_get_info(g_model, &info);
    g_vocab = info.n_vocab;
    int n_prompt = 0;
    int32_t *prompt = prompt_tokens(&n_prompt);
    test_parse();
    test_choose_length();
    test_errors();
    test_quant_cache();
    test_quant_layout();
    if (prompt && n_prompt >= 200) {
        test_rollback(prompt, n_prompt);
        char map[320];
        test_map_solve();
        test_draft_map(prompt, n_prompt, map, sizeof map);
        test_greedy_streams(prompt, 200, map);
        test_adaptive_plain(prompt, 200);
        test_sampling(prompt, n_prompt);
        test_eval(prompt, n_prompt);
    }
    free(prompt);
    ellm_model_free(g_model);
    return test_finish();
}
