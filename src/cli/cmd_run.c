/* `ellm run`: generate text from a prompt, streaming it to stdout. */
#include "cli/args.h"
#include "cli/commands.h"
#include "core/timer.h"
#include "ellm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: ellm run [-m MODEL.gguf] [-p PROMPT | -f FILE] [options]\n"
            "  -m, --model FILE       GGUF model (default: the embedded evaluation model)\n"
            "  -p, --prompt TEXT      prompt text\n"
            "  -f, --file FILE        read the prompt from FILE\n"
            "  -n, --n-predict N      tokens to generate (default 256)\n"
            "  -t, --threads N        compute threads (default: one per physical core)\n"
            "  -c, --ctx-size N       context size in tokens (default: prompt + n, at most\n"
            "                         the model's training length)\n"
            "  --kv-cache-gb G        size the KV cache to G gigabytes instead of -c\n"
            "  --kv-type f16|f32      KV cache element type (default f16)\n"
            "  -b, --batch-size N     tokens per prefill pass (default 256)\n"
            "  --temp T               temperature; 0 = greedy (default 0.8)\n"
            "  --top-k K              (default 40; 0 = off)\n"
            "  --top-p P              (default 0.95; 1 = off)\n"
            "  --min-p P              (default 0.05; 0 = off)\n"
            "  --repeat-penalty R     (default 1.0 = off)\n"
            "  --repeat-last-n N      tokens the penalty looks back (default 64)\n"
            "  --seed S               RNG seed (default: random; same seed, same output)\n"
            "  --no-bos               do not add BOS to the prompt\n"
            "  --no-display-prompt    do not echo the prompt\n"
            "  --stats                print load time and prompt/decode speed at the end\n"
            "sparse attention (query-aware KV block selection):\n"
            "  --sparse-topk K        attend to at most K tokens per KV head per step\n"
            "  --sparse-profile FILE  per-layer/per-head budgets from `ellm calibrate`\n"
            "  --sparse-window N      recent tokens always attended (default 64)\n"
            "  --sparse-sink N        leading blocks always attended (default 1)\n"
            "  --sparse-dense-layers N  keep the first N layers dense (default 0)\n"
            "  --sparse-recall-every N  sample recall on a dense pass every N steps (default\n"
            "                         64 with --stats, else off)\n"
            "  --sparse-adapt         move budget between heads by sampled recall\n");
}

typedef struct {
    const char *model, *prompt, *prompt_file;
    long n_predict, threads, ctx, batch;
    double kv_gb;
    int kv_f32;
    ellm_sampler_params sp;
    int seed_given, no_bos, no_echo, stats;
    long sparse_topk, sparse_window, sparse_sink, sparse_dense, sparse_recall;
    const char *sparse_profile;
    int sparse_adapt;
} run_opts;

static int parse(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 256;
    o->sp = ellm_sampler_default_params();
    o->sparse_window = 64;
    o->sparse_sink = 1;
    o->sparse_recall = -1;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        double d;
        long n;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--stats")) o->stats = 1;
        else if (!strcmp(a, "--no-bos")) o->no_bos = 1;
        else if (!strcmp(a, "--sparse-adapt")) o->sparse_adapt = 1;
        else if (arg_value(argc, argv, &i, "--sparse-topk", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &o->sparse_topk);
        else if (arg_value(argc, argv, &i, "--sparse-window", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &o->sparse_window);
        else if (arg_value(argc, argv, &i, "--sparse-sink", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 20, &o->sparse_sink);
        else if (arg_value(argc, argv, &i, "--sparse-dense-layers", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 20, &o->sparse_dense);
        else if (arg_value(argc, argv, &i, "--sparse-recall-every", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &o->sparse_recall);
        else if (arg_value(argc, argv, &i, "--sparse-profile", NULL, &v, &bad)) o->sparse_profile = v;
        else if (!strcmp(a, "--no-display-prompt")) o->no_echo = 1;
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) o->model = v;
        else if (arg_value(argc, argv, &i, "--prompt", "-p", &v, &bad)) o->prompt = v;
        else if (arg_value(argc, argv, &i, "--file", "-f", &v, &bad)) o->prompt_file = v;
        else if (arg_value(argc, argv, &i, "--n-predict", "-n", &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &o->n_predict);
        else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1024, &o->threads);
        else if (arg_value(argc, argv, &i, "--ctx-size", "-c", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1L << 30, &o->ctx);
        else if (arg_value(argc, argv, &i, "--batch-size", "-b", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1 << 16, &o->batch);
        else if (arg_value(argc, argv, &i, "--kv-cache-gb", NULL, &v, &bad))
            bad = !v || !arg_double(a, v, 1e-6, 1e6, &o->kv_gb);
        else if (arg_value(argc, argv, &i, "--kv-type", NULL, &v, &bad)) {
            if (v && !strcmp(v, "f32")) o->kv_f32 = 1;
            else if (v && !strcmp(v, "f16")) o->kv_f32 = 0;
            else if (v) {
                fprintf(stderr, "error: --kv-type expects f16 or f32, got '%s'\n", v);
                bad = 1;
            }
        } else if (arg_value(argc, argv, &i, "--temp", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 0, 100, &d))) o->sp.temperature = (float)d;
        } else if (arg_value(argc, argv, &i, "--top-k", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 0, 1 << 30, &n))) o->sp.top_k = (int)n;
        } else if (arg_value(argc, argv, &i, "--top-p", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 1e-6, 1, &d))) o->sp.top_p = (float)d;
        } else if (arg_value(argc, argv, &i, "--min-p", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 0, 0.999999, &d))) o->sp.min_p = (float)d;
        } else if (arg_value(argc, argv, &i, "--repeat-penalty", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 1e-3, 100, &d))) o->sp.repeat_penalty = (float)d;
        } else if (arg_value(argc, argv, &i, "--repeat-last-n", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 0, 1 << 30, &n))) o->sp.repeat_last_n = (int)n;
        } else if (arg_value(argc, argv, &i, "--seed", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_u64(a, v, &o->sp.seed))) o->seed_given = 1;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see ellm run --help)\n", a);
            bad = 1;
        }
    }
    if (!bad && o->prompt && o->prompt_file) {
        fprintf(stderr, "error: give either -p or -f, not both\n");
        bad = 1;
    }
    if (!bad && o->ctx && o->kv_gb > 0) {
        fprintf(stderr, "error: give either -c or --kv-cache-gb, not both\n");
        bad = 1;
    }
    return !bad;
}

/* Status line on stderr: tokens, tokens/s, context used. */
static void status_line(int generated, int n_predict, double tps, int pos, int n_ctx) {
    fprintf(stderr, "\r\033[K[%d/%d tokens | %.1f tok/s | ctx %d/%d]", generated, n_predict, tps,
            pos, n_ctx);
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    if (!parse(argc, argv, &o)) return 2;
    if (!o.model) o.model = cli_default_model();
    if (!o.seed_given) o.sp.seed = ellm_time_ns() ^ ((uint64_t)getpid() << 32);

    char *file_prompt = NULL;
    const char *prompt = o.prompt ? o.prompt : "";
    size_t prompt_len = strlen(prompt);
    if (o.prompt_file) {
        if (!(file_prompt = cli_read_file(o.prompt_file, &prompt_len))) return 1;
        prompt = file_prompt;
    } else if (!o.prompt && !strcmp(o.model, cli_default_model())) {
        prompt = "import os\n\n\ndef main():\n";
        prompt_len = strlen(prompt);
    }

    ellm_error err = {0};
    ellm_model *model = NULL;
    ellm_context *ctx = NULL;
    ellm_sampler *sampler = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    ellm_model_params mp = {.n_threads = (int)o.threads, .pin_threads = 1};
    if (ellm_model_load(o.model, &mp, &model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    ellm_model_info info;
    ellm_model_get_info(model, &info);

    int n_prompt = 0;
    int cap = (int)(prompt_len + 16 < (1u << 30) ? prompt_len + 16 : (1u << 30));
    ids = malloc((size_t)(cap + o.n_predict + 1) * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "error: out of memory for %d prompt tokens\n", cap);
        goto done;
    }
    if (ellm_tokenize(model, prompt, prompt_len, !o.no_bos, 0, ids, cap, &n_prompt, &err) != ELLM_OK) {
        fprintf(stderr, "error: cannot tokenize the prompt: %s\n", err.msg);
        goto done;
    }
    if (n_prompt == 0) {
        if (ellm_token_bos(model) < 0) {
            fprintf(stderr, "error: the prompt is empty and the model has no BOS token to start from\n");
            goto done;
        }
        ids[n_prompt++] = ellm_token_bos(model);
    }
    long need = n_prompt + o.n_predict;
    ellm_context_params cp = ellm_context_default_params();
    cp.kv_type = o.kv_f32 ? ELLM_KV_F32 : ELLM_KV_F16;
    cp.n_threads = (int)o.threads;
    if (o.batch) cp.n_batch = (int)o.batch;
    cp.sparse_topk = (int)o.sparse_topk;
    cp.sparse_window = (int)o.sparse_window;
    cp.sparse_sink_blocks = (int)o.sparse_sink;
    cp.sparse_dense_layers = (int)o.sparse_dense;
    cp.sparse_recall_every = (int)(o.sparse_recall >= 0 ? o.sparse_recall : (o.stats || o.sparse_adapt) ? 64 : 0);
    cp.sparse_adapt = o.sparse_adapt;
    if ((o.sparse_profile || o.sparse_adapt) && !o.sparse_topk) {
        fprintf(stderr, "error: --sparse-profile and --sparse-adapt need --sparse-topk\n");
        goto done;
    }
    if (o.ctx) {
        cp.n_ctx = (int)o.ctx;
    } else if (o.kv_gb > 0) {
        cp.kv_cache_gb = o.kv_gb;
    } else {
        if (need > info.n_ctx_train) {
            fprintf(stderr,
                    "error: the prompt (%d tokens) plus -n %ld is %ld tokens, more than the model's "
                    "training context of %d; shorten them, or pass -c to run beyond it\n",
                    n_prompt, o.n_predict, need, info.n_ctx_train);
            goto done;
        }
        cp.n_ctx = (int)need;
    }
    if (ellm_context_init(model, &cp, &ctx, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (o.sparse_profile && ellm_context_load_sparse_profile(ctx, o.sparse_profile, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    int n_ctx = ellm_context_n_ctx(ctx);
    if (need > n_ctx) {
        fprintf(stderr,
                "error: the prompt (%d tokens) plus -n %ld is %ld tokens, more than the context "
                "size of %d tokens; raise -c / --kv-cache-gb or lower -n\n",
                n_prompt, o.n_predict, need, n_ctx);
        goto done;
    }
    if (ellm_sampler_init(&o.sp, info.n_vocab, &sampler, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }

    if (!o.no_echo) {
        fwrite(prompt, 1, prompt_len, stdout);
        fflush(stdout);
    }
    signal(SIGINT, on_sigint);
    int tty = isatty(2);
    double t0 = ellm_time_ms();
    if (ellm_decode(ctx, ids, n_prompt, NULL, &err) != ELLM_OK) {
        fprintf(stderr, "\nerror: %s\n", err.msg);
        goto done;
    }
    double t_prompt = ellm_time_ms() - t0;

    ellm_detok dt = {0};
    dt.n_emitted = 1; /* continuing the prompt: keep the leading space of the first piece */
    char text[256];
    int n_hist = n_prompt, generated = 0;
    double t_gen0 = ellm_time_ms(), t_last_status = 0;
    while (generated < o.n_predict && !g_interrupted) {
        int32_t tok = ellm_sampler_sample(sampler, ellm_context_logits(ctx), ids, n_hist);
        ids[n_hist++] = tok;
        generated++;
        if (ellm_token_is_eog(model, tok)) break;
        int nb = ellm_detok_push(model, &dt, tok, text, sizeof text);
        if (nb > 0) {
            if (tty) fputs("\r\033[K", stderr);
            fwrite(text, 1, (size_t)nb, stdout);
            fflush(stdout);
        }
        if (generated == o.n_predict) break;
        if (ellm_decode(ctx, &tok, 1, NULL, &err) != ELLM_OK) {
            fprintf(stderr, "\nerror: %s\n", err.msg);
            goto done;
        }
        double now = ellm_time_ms();
        if (tty && now - t_last_status > 200) {
            status_line(generated, (int)o.n_predict, generated / ((now - t_gen0) / 1000.0),
                        ellm_context_pos(ctx), n_ctx);
            t_last_status = now;
        }
    }
    double t_gen = ellm_time_ms() - t_gen0;
    int nb = ellm_detok_flush(&dt, text, sizeof text);
    fwrite(text, 1, (size_t)nb, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (tty) fputs("\r\033[K", stderr);
    if (g_interrupted) fprintf(stderr, "interrupted after %d tokens\n", generated);
    if (o.stats) {
        /* decode speed counts the forward passes after the first sampled token */
        int n_dec = generated > 1 ? generated - 1 : 0;
        fprintf(stderr,
                "model_load_ms: %.2f\n"
                "model: %s, %s, %d layers, d=%d, %.1f M params, %.1f MB of weights\n"
                "isa: %s, threads: %ld, context: %d tokens, kv: %s\n"
                "prompt: %d tokens in %.1f ms (%.1f tokens/s)\n"
                "decode: %d tokens in %.1f ms (%.2f tokens/s)\n"
                "seed: %llu\n",
                info.load_ms, o.model, info.arch, info.n_layer, info.n_embd, info.n_params / 1e6,
                info.weight_bytes / 1e6, ellm_isa_name(), o.threads, n_ctx, o.kv_f32 ? "f32" : "f16",
                n_prompt, t_prompt, n_prompt / (t_prompt / 1000.0), generated, t_gen,
                n_dec / (t_gen / 1000.0), (unsigned long long)o.sp.seed);
        if (o.sparse_topk) {
            ellm_context_stats cs;
            ellm_context_get_stats(ctx, &cs);
            fprintf(stderr,
                    "sparse: budget %ld tokens, %lld of %lld passes sparse, %.0f tokens attended per head, "
                    "block selection %.1f ms (%.1f%% of decode), index bytes read %.0f%% of a flat scan\n",
                    o.sparse_topk, (long long)cs.sparse_steps, (long long)cs.decode_steps, cs.attended_tokens,
                    cs.select_ms, t_gen > 0 ? 100 * cs.select_ms / t_gen : 0,
                    cs.index_flat_bytes > 0 ? 100 * cs.index_bytes_read / cs.index_flat_bytes : 0);
            if (cs.recall_samples)
                fprintf(stderr, "sparse_recall: %.4f (%lld samples)\n", cs.sparse_recall, (long long)cs.recall_samples);
        }
    }
    rc = 0;
done:
    ellm_sampler_free(sampler);
    ellm_context_free(ctx);
    ellm_model_free(model);
    free(ids);
    free(file_prompt);
    return rc;
}
