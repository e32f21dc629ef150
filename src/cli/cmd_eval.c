/* `ellm eval`: perplexity of dense and sparse attention on a text, with top-1
 * agreement and KL divergence against dense; `ellm calibrate`: per-head sparse
 * budgets from the attention mass selection captures. */
#include "cli/args.h"
#include "cli/commands.h"
#include "core/timer.h"
#include "ellm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_MODES 16

typedef struct {
    char name[64];
    int budget;   /* 0: dense */
    int profile;  /* use --sparse-profile */
    int adapt;    /* --sparse-adapt on */
    int prefill;  /* whole window through ellm_decode in chunks, as `ellm run` prefills */
    double nll, kl;
    int64_t n, agree;
    double recall_sum;
    int64_t recall_n;
    double share_sum; /* tokens attended / keys visible, summed over sparse selections */
    int64_t share_n;
    double seconds;
} eval_mode;

/* "dense" | "sparse:N[:profile][:adapt][:prefill]" */
static int parse_mode(const char *s, eval_mode *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", s);
    if (!strcmp(s, "dense")) return 1;
    if (strncmp(s, "sparse:", 7)) return 0;
    char *end;
    long b = strtol(s + 7, &end, 10);
    if (end == s + 7 || b < 1 || b > (1L << 30)) return 0;
    m->budget = (int)b;
    while (*end == ':') {
        if (!strncmp(end, ":profile", 8)) m->profile = 1, end += 8;
        else if (!strncmp(end, ":adapt", 6)) m->adapt = 1, end += 6;
        else if (!strncmp(end, ":prefill", 8)) m->prefill = 1, end += 8;
        else return 0;
    }
    return *end == 0;
}

/* log(sum(exp(x))) of n floats (double for stable sums). */
static double log_sum_exp(const float *x, int n) {
    double mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    return mx + log(s);
}

static int argmax_f(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

typedef struct {
    const char *model, *file, *profile;
    long ctx, score_from, windows, threads, window_tokens, sink, dense_layers, sample_every, target, n_dense;
    long recall_every, batch;
    const char *spec;     /* --spec: drafter lists, comma-separated */
    const char *draft_map; /* --draft-map: maps for shallow:K drafters */
    long draft_max, spec_every;
    int json, adapt;
    int kv_type; /* ellm_kv_type of every mode's cache (--kv-type) */
    ellm_rope_params rope; /* --rope-scaling, --rope-scale, ... */
    char compare[512];
    char budgets[256];
    const char *out;
} eval_opts;

static int parse_common(int argc, char **argv, eval_opts *o, int calibrate) {
    memset(o, 0, sizeof *o);
    o->ctx = 2048;
    o->score_from = 256;
    o->windows = 8;
    o->window_tokens = 64;
    o->sink = 1;
    o->sample_every = 8;
    o->target = 256;
    o->recall_every = ELLM_SPARSE_RECALL_EVERY;
    o->batch = 256; /* ellm run's default prefill chunk */
    o->draft_max = 8;
    o->spec_every = 8;
    snprintf(o->compare, sizeof o->compare, "dense,sparse:256,sparse:512");
    snprintf(o->budgets, sizeof o->budgets, "128,192,256,384,512,768,1024");
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (calibrate)
                printf("usage: ellm calibrate [-m MODEL] -f TEXT -o PROFILE [--ctx N] [--windows N]\n"
                       "       [--budgets LIST] [--target TOKENS] [--dense-layers N] [--sample-every N]\n"
                       "Measures per layer/head how much attention mass block selection captures at each\n"
                       "budget and writes per-head budgets (mean --target, default 256) for --sparse-profile.\n");
            else
                printf("usage: ellm eval [-m MODEL] -f TEXT [--ctx 2048] [--compare dense,sparse:256,...]\n"
                       "       [--score-from 256] [--windows 8] [--sparse-profile P] [--json]\n"
                       "       [--sparse-recall-every N] [--batch N]\n"
                       "Teacher-forced over TEXT in windows of --ctx tokens: perplexity per mode, and for\n"
                       "sparse modes top-1 agreement and mean KL divergence against dense. Modes: dense,\n"
                       "sparse:N (uniform budget N), sparse:N:profile (budgets from --sparse-profile),\n"
                       "sparse:N:adapt (online adaptation from sampled recall); suffixes combine.\n"
                       "Sparse modes decode every position alone (each selects its own blocks), as\n"
                       "`ellm run` generates; with :prefill the window goes through in chunks of --batch\n"
                       "tokens (default 256, run's default), one selection per chunk, as `ellm run`\n"
                       "prefills a prompt. Recall is sampled every --sparse-recall-every decode steps\n"
                       "(default 64, as ellm run --stats; it also paces :adapt). --kv-type f16|f32|q8_0\n"
                       "sets the KV cache type of every mode (compare two runs for KV fidelity).\n"
                       "--rope-scaling T, --rope-scale N, --rope-freq-base N, --yarn-orig-ctx N: RoPE\n"
                       "scaling instead of the file's (perplexity beyond the training context).\n"
                       "With --spec LIST[,LIST...] [--draft-max K] [--spec-every S] [--draft-map DRAFT]:\n"
                       "drafters instead of modes, teacher-forced: every S positions from --score-from on, the full model's\n"
                       "greedy continuation from the true prefix is the target and a drafter's K\n"
                       "proposals are accepted up to the first mismatch; reports acceptance_rate and\n"
                       "tokens_per_verify (accepted + 1) per drafter.\n");
            exit(0);
        } else if (!strcmp(a, "--json")) o->json = 1;
        else if (arg_rope_parse(argc, argv, &i, &o->rope, &bad)) {
            /* parsed into o->rope, the model's RoPE parameters */
        }
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) o->model = v;
        else if (arg_value(argc, argv, &i, "--file", "-f", &v, &bad)) o->file = v;
        else if (arg_value(argc, argv, &i, "--kv-type", NULL, &v, &bad))
            bad = !v || !arg_kv_type(a, v, &o->kv_type);
        else if (arg_value(argc, argv, &i, "--output", "-o", &v, &bad)) o->out = v;
        else if (arg_value(argc, argv, &i, "--sparse-profile", NULL, &v, &bad)) o->profile = v;
        else if (arg_value(argc, argv, &i, "--compare", NULL, &v, &bad)) {
            if (v) snprintf(o->compare, sizeof o->compare, "%s", v);
        } else if (arg_value(argc, argv, &i, "--budgets", NULL, &v, &bad)) {
            if (v) snprintf(o->budgets, sizeof o->budgets, "%s", v);
        } else if (arg_value(argc, argv, &i, "--ctx", "-c", &v, &bad))
            bad = !v || !arg_int(a, v, 16, 1 << 24, &o->ctx);
        else if (arg_value(argc, argv, &i, "--score-from", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1 << 24, &o->score_from);
        else if (arg_value(argc, argv, &i, "--windows", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1 << 20, &o->windows);
        else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1024, &o->threads);
        else if (arg_value(argc, argv, &i, "--sparse-window", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1 << 24, &o->window_tokens);
        else if (arg_value(argc, argv, &i, "--sparse-sink", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1 << 20, &o->sink);
        else if (arg_value(argc, argv, &i, "--sparse-dense-layers", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1 << 20, &o->dense_layers);
        else if (arg_value(argc, argv, &i, "--sparse-recall-every", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1 << 30, &o->recall_every);
        else if (arg_value(argc, argv, &i, "--batch", "-b", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1 << 20, &o->batch);
        else if (!calibrate && arg_value(argc, argv, &i, "--spec", NULL, &v, &bad)) o->spec = v;
        else if (!calibrate && arg_value(argc, argv, &i, "--draft-map", NULL, &v, &bad)) o->draft_map = v;
        else if (!calibrate && arg_value(argc, argv, &i, "--draft-max", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 31, &o->draft_max);
        else if (!calibrate && arg_value(argc, argv, &i, "--spec-every", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1 << 20, &o->spec_every);
        else if (arg_value(argc, argv, &i, "--sample-every", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1 << 20, &o->sample_every);
        else if (arg_value(argc, argv, &i, "--target", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1 << 24, &o->target);
        else if (arg_value(argc, argv, &i, "--dense-layers", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1 << 20, &o->n_dense);
        else {
            fprintf(stderr, "error: unknown option '%s' (see --help)\n", a);
            bad = 1;
        }
    }
    if (!bad && !o->file) {
        fprintf(stderr, "error: -f TEXT is required\n");
        bad = 1;
    }
    if (!bad && calibrate && !o->out) {
        fprintf(stderr, "error: -o PROFILE is required\n");
        bad = 1;
    }
    if (!o->model) o->model = cli_default_model();
    return !bad;
}

/* Loads the model, tokenizes the text (no BOS) and makes a context of ctx tokens. */
static int setup(const eval_opts *o, ellm_model **model, ellm_context **ctx, int32_t **ids, int *n_ids,
                 int n_ctx) {
    ellm_error err = {0};
    ellm_model_params mp = {.n_threads = (int)o->threads, .pin_threads = 1, .rope = o->rope};
    if (ellm_model_load(o->model, &mp, model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 0;
    }
    if (!(*ids = cli_tokenize_file(*model, o->file, 0, n_ids))) return 0;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = (int)o->batch;
    cp.kv_type = (ellm_kv_type)o->kv_type;
    cp.sparse_window = (int)o->window_tokens;
    cp.sparse_sink_blocks = (int)o->sink;
    cp.sparse_dense_layers = (int)o->dense_layers;
    cp.sparse_recall_every = (int)o->recall_every; /* sampled recall, reported per mode */
    if (ellm_context_init(*model, &cp, ctx, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 0;
    }
    return 1;
}

/* ellm eval --spec: teacher-forced drafter acceptance (ellm_spec_eval) for each
 * comma-separated drafter list, over the same windows as the modes. */
static int eval_spec(const eval_opts *o) {
    ellm_model *model = NULL;
    ellm_context *ctx = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    ellm_error err = {0};
    if (o->score_from >= o->ctx - 1) {
        fprintf(stderr, "error: --score-from %ld leaves nothing to score in windows of %ld\n", o->score_from, o->ctx);
        return 2;
    }
    if (!setup(o, &model, &ctx, &ids, &n_ids, (int)o->ctx)) goto done;
    int T = (int)o->ctx, n_win = n_ids / T;
    if (n_win > o->windows) n_win = (int)o->windows;
    if (n_win < 1) {
        fprintf(stderr, "error: '%s' has %d tokens, fewer than one window of %d\n", o->file, n_ids, T);
        goto done;
    }
    if (o->json) printf("{\"model\": \"%s\", \"file\": \"%s\", \"ctx\": %d, \"windows\": %d, \"score_from\": %ld, \"spec\": [",
                        o->model, o->file, T, n_win, o->score_from);
    else printf("%s on %s: %d windows of %d tokens, drafts every %ld positions >= %ld, K = %ld\n", o->model, o->file,
                n_win, T, o->spec_every, o->score_from, o->draft_max);
    char buf[512], *save = NULL;
    snprintf(buf, sizeof buf, "%s", o->spec);
    int first = 1;
    for (char *list = strtok_r(buf, ",", &save); list; list = strtok_r(NULL, ",", &save)) {
        ellm_spec_params sp = ellm_spec_default_params();
        sp.drafters = list;
        sp.draft_max = (int)o->draft_max;
        sp.draft_map = o->draft_map;
        ellm_spec_stats st = {0};
        for (int w = 0; w < n_win; w++)
            if (ellm_spec_eval(ctx, &sp, ids + (size_t)w * T, T, (int)o->score_from, (int)o->spec_every, &st, &err) !=
                ELLM_OK) {
                fprintf(stderr, "error: --spec %s: %s\n", list, err.msg);
                goto done;
            }
        if (o->json)
            printf("%s{\"drafter\": \"%s\", \"draft_max\": %ld, \"acceptance_rate\": %.4f, \"tokens_per_verify\": %.3f, "
                   "\"samples\": %lld, \"draft_ms_per_token\": %.4f}",
                   first ? "" : ", ", list, o->draft_max, st.acceptance_rate, st.tokens_per_verify,
                   (long long)st.verify_passes, st.proposed ? st.draft_ms / (double)st.proposed : 0);
        else
            printf("  %-28s acceptance_rate %.4f  tokens_per_verify %.3f  (%lld samples, %.3f ms per drafted token)\n",
                   list, st.acceptance_rate, st.tokens_per_verify, (long long)st.verify_passes,
                   st.proposed ? st.draft_ms / (double)st.proposed : 0);
        fflush(stdout);
        first = 0;
    }
    if (o->json) printf("]}\n");
    rc = 0;
done:
    ellm_context_free(ctx);
    ellm_model_free(model);
    free(ids);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    eval_opts o;
    if (!parse_common(argc, argv, &o, 0)) return 2;
    if (o.spec) return eval_spec(&o);
    eval_mode modes[MAX_MODES];
    int n_modes = 0;
    {
        char buf[512], *save = NULL;
        snprintf(buf, sizeof buf, "%s", o.compare);
        for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
            if (n_modes == MAX_MODES || !parse_mode(p, &modes[n_modes])) {
                fprintf(stderr, "error: --compare: bad mode '%s' (dense, sparse:N[:profile][:adapt])\n", p);
                return 2;
            }
            if (modes[n_modes].profile && !o.profile) {
                fprintf(stderr, "error: mode '%s' needs --sparse-profile\n", p);
                return 2;
            }
            n_modes++;
        }
    }
    int has_dense = 0;
    for (int i = 0; i < n_modes; i++) has_dense |= modes[i].budget == 0;
    if (!has_dense) {
        fprintf(stderr, "error: --compare must include dense (the reference for agreement and KL)\n");
        return 2;
    }
    if (o.score_from >= o.ctx - 1) {
        fprintf(stderr, "error: --score-from %ld leaves nothing to score in windows of %ld\n", o.score_from, o.ctx);
        return 2;
    }
    ellm_model *model = NULL;
    ellm_context *ctx = NULL;
    int32_t *ids = NULL;
    float *dense_logits = NULL, *logits = NULL;
    double *dense_lse = NULL; /* (T) log-sum-exp of each dense row, once per window */
    int *dense_top = NULL;    /* (T) argmax of each dense row */
    int rc = 1, n_ids = 0;
    ellm_error err = {0};
    if (!setup(&o, &model, &ctx, &ids, &n_ids, (int)o.ctx)) goto done;
    ellm_model_info info;
    ellm_model_get_info(model, &info);
    int V = info.n_vocab, T = (int)o.ctx;
    int n_win = n_ids / T;
    if (n_win > o.windows) n_win = (int)o.windows;
    if (n_win < 1) {
        fprintf(stderr, "error: '%s' has %d tokens, fewer than one window of %d\n", o.file, n_ids, T);
        goto done;
    }
    dense_logits = malloc((size_t)T * V * sizeof *dense_logits);
    logits = malloc((size_t)T * V * sizeof *logits);
    dense_lse = malloc((size_t)T * sizeof *dense_lse);
    dense_top = malloc((size_t)T * sizeof *dense_top);
    if (!dense_logits || !logits || !dense_lse || !dense_top) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    if (o.profile && ellm_context_load_sparse_profile(ctx, o.profile, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg); /* checked once up front */
        goto done;
    }
    for (int w = 0; w < n_win; w++) {
        const int32_t *win = ids + (size_t)w * T;
        /* dense reference: one batched pass */
        ellm_context_truncate(ctx, 0);
        ellm_context_set_sparse(ctx, 0, NULL);
        double t0 = ellm_time_ms();
        if (ellm_decode(ctx, win, T, dense_logits, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
        double t_dense = (ellm_time_ms() - t0) / 1000;
        for (int i = (int)o.score_from; i < T - 1; i++) {
            dense_lse[i] = log_sum_exp(dense_logits + (size_t)i * V, V);
            dense_top[i] = argmax_f(dense_logits + (size_t)i * V, V);
        }
        for (int mi = 0; mi < n_modes; mi++) {
            eval_mode *m = &modes[mi];
            if (isatty(2)) fprintf(stderr, "\r\033[Kwindow %d/%d, %s", w + 1, n_win, m->name);
            const float *L = dense_logits;
            if (m->budget) {
                /* Each position decoded alone so that it selects its own blocks;
                 * the first 32 tokens fit any budget, so they go in one pass. */
                ellm_context_truncate(ctx, 0);
                if (ellm_context_set_sparse(ctx, m->budget, &err) != ELLM_OK ||
                    ellm_context_load_sparse_profile(ctx, m->profile ? o.profile : NULL, &err) != ELLM_OK) {
                    fprintf(stderr, "error: %s\n", err.msg);
                    goto done;
                }
                ellm_context_set_sparse_adapt(ctx, m->adapt);
                ellm_context_stats before;
                ellm_context_get_stats(ctx, &before);
                t0 = ellm_time_ms();
                int pre = m->prefill ? T : 32 < T ? 32 : T;
                if (ellm_decode(ctx, win, pre, logits, &err) != ELLM_OK) goto decode_fail;
                for (int i = pre; i < T; i++)
                    if (ellm_decode(ctx, win + i, 1, logits + (size_t)i * V, &err) != ELLM_OK) goto decode_fail;
                m->seconds += (ellm_time_ms() - t0) / 1000;
                ellm_context_stats after;
                ellm_context_get_stats(ctx, &after);
                if (after.recall_samples > before.recall_samples) {
                    double s = after.sparse_recall * after.recall_samples - before.sparse_recall * before.recall_samples;
                    m->recall_sum += s;
                    m->recall_n += after.recall_samples - before.recall_samples;
                }
                m->share_sum += after.attended_share * (double)after.sparse_selections -
                                before.attended_share * (double)before.sparse_selections;
                m->share_n += after.sparse_selections - before.sparse_selections;
                L = logits;
            } else {
                m->seconds += t_dense;
            }
            for (int i = (int)o.score_from; i < T - 1; i++) {
                const float *row = L + (size_t)i * V;
                double lse = m->budget ? log_sum_exp(row, V) : dense_lse[i];
                m->nll -= row[win[i + 1]] - lse;
                m->n++;
                if (m->budget) {
                    /* KL(dense || sparse) = sum p_d (log p_d - log p_s) */
                    const float *drow = dense_logits + (size_t)i * V;
                    double kl = 0;
                    for (int jv = 0; jv < V; jv++) {
                        double ld = drow[jv] - dense_lse[i];
                        kl += exp(ld) * (ld - (row[jv] - lse));
                    }
                    m->kl += kl;
                    m->agree += argmax_f(row, V) == dense_top[i];
                }
            }
        }
    }
    if (isatty(2)) fprintf(stderr, "\r\033[K");
    double base = 0;
    for (int i = 0; i < n_modes; i++)
        if (!modes[i].budget) base = exp(modes[i].nll / modes[i].n);
    if (o.json) {
        printf("{\"model\": \"%s\", \"file\": \"%s\", \"ctx\": %d, \"windows\": %d, \"score_from\": %ld, \"modes\": [",
               o.model, o.file, T, n_win, o.score_from);
        for (int i = 0; i < n_modes; i++) {
            eval_mode *m = &modes[i];
            double ppl = exp(m->nll / m->n);
            printf("%s{\"mode\": \"%s\", \"ppl\": %.5f, \"ppl_ratio\": %.5f, \"positions\": %lld, \"seconds\": %.2f",
                   i ? ", " : "", m->name, ppl, ppl / base, (long long)m->n, m->seconds);
            if (m->budget) {
                printf(", \"budget\": %d, \"budget_fraction\": %.4f, \"prefill\": %s, \"top1_agreement\": %.5f, "
                       "\"kl\": %.6f", m->budget, (double)m->budget / T, m->prefill ? "true" : "false",
                       (double)m->agree / m->n, m->kl / m->n);
                if (m->recall_n) printf(", \"sparse_recall\": %.5f", m->recall_sum / m->recall_n);
                if (m->share_n) printf(", \"attended_share\": %.5f", m->share_sum / m->share_n);
            }
            printf("}");
        }
        printf("]}\n");
    } else {
        printf("%s on %s: %d windows of %d tokens, positions >= %ld scored\n", o.model, o.file, n_win, T, o.score_from);
        printf("%-28s %9s %8s %8s %9s %8s %8s %8s\n", "mode", "ppl", "ratio", "top1", "KL", "recall", "read", "s");
        for (int i = 0; i < n_modes; i++) {
            eval_mode *m = &modes[i];
            double ppl = exp(m->nll / m->n);
            if (m->budget)
                printf("%-28s %9.4f %8.4f %8.4f %9.5f %8.4f %8.4f %8.1f\n", m->name, ppl, ppl / base,
                       (double)m->agree / m->n, m->kl / m->n, m->recall_n ? m->recall_sum / m->recall_n : NAN,
                       m->share_n ? m->share_sum / m->share_n : NAN, m->seconds);
            else
                printf("%-28s %9.4f %8.4f %8s %9s %8s %8s %8.1f\n", m->name, ppl, 1.0, "-", "-", "-", "-", m->seconds);
        }
        printf("read: mean share of the visible keys a sparse selection reads (sink + window + blocks)\n");
    }
    rc = 0;
    goto done;
decode_fail:
    fprintf(stderr, "error: %s\n", err.msg);
done:
    free(dense_logits);
    free(logits);
    free(dense_lse);
    free(dense_top);
    free(ids);
    ellm_context_free(ctx);
    ellm_model_free(model);
    return rc;
}

int cmd_calibrate(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--imatrix")) return cmd_calibrate_imatrix(argc, argv);
        else if (!strcmp(argv[i], "--draft")) return cmd_calibrate_draft(argc, argv);
    eval_opts o;
    if (!parse_common(argc, argv, &o, 1)) return 2;
    int budgets[32];
    int nb = arg_int_list("--budgets", o.budgets, 1, 1 << 24, budgets, 32);
    if (nb < 1) return 2;
    for (int b = 1; b < nb; b++)
        if (budgets[b] <= budgets[b - 1]) {
            fprintf(stderr, "error: --budgets must be increasing\n");
            return 2;
        }
    ellm_model *model = NULL;
    ellm_context *ctx = NULL;
    int32_t *ids = NULL;
    double *sum = NULL;
    int rc = 1, n_ids = 0;
    ellm_error err = {0};
    if (!setup(&o, &model, &ctx, &ids, &n_ids, (int)o.ctx)) goto done;
    ellm_model_info info;
    ellm_model_get_info(model, &info);
    int T = (int)o.ctx, n_win = n_ids / T;
    if (n_win > o.windows) n_win = (int)o.windows;
    if (n_win < 1) {
        fprintf(stderr, "error: '%s' has %d tokens, fewer than one window of %d\n", o.file, n_ids, T);
        goto done;
    }
    size_t nlh = (size_t)info.n_layer * info.n_head_kv;
    sum = calloc(nlh * nb, sizeof *sum);
    int64_t n_samples = 0;
    for (int w = 0; w < n_win; w++) {
        if (isatty(2)) fprintf(stderr, "\r\033[Kcalibrating: window %d/%d", w + 1, n_win);
        if (ellm_sparse_calibrate(ctx, ids + (size_t)w * T, T, budgets, nb, (int)o.sample_every, sum, &n_samples,
                                  &err) != ELLM_OK) {
            fprintf(stderr, "\nerror: %s\n", err.msg);
            goto done;
        }
    }
    if (isatty(2)) fprintf(stderr, "\r\033[K");
    for (size_t i = 0; i < nlh * nb; i++) sum[i] /= (double)n_samples;
    printf("mean attention recall of block selection (%lld samples), per layer/KV head:\n", (long long)n_samples);
    printf("%-12s", "layer.head");
    for (int b = 0; b < nb; b++) printf(" %7d", budgets[b]);
    printf("\n");
    for (int l = 0; l < info.n_layer; l++)
        for (int h = 0; h < info.n_head_kv; h++) {
            printf("%5d.%-6d", l, h);
            for (int b = 0; b < nb; b++) printf(" %7.4f", sum[((size_t)l * info.n_head_kv + h) * nb + b]);
            printf("\n");
        }
    if (ellm_sparse_profile_write(o.out, info.n_layer, info.n_head_kv, budgets, nb, sum, (int)o.target,
                                  (int)o.n_dense, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    printf("wrote %s (per-head budgets for a mean of %ld tokens)\n", o.out, o.target);
    rc = 0;
done:
    free(sum);
    free(ids);
    ellm_context_free(ctx);
    ellm_model_free(model);
    return rc;
}
