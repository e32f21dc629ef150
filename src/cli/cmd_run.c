/* `ellm run`: generate text from a prompt, streaming it to stdout. */
#include "cli/args.h"
#include "cli/cli_mpi.h"
#include "cli/commands.h"
#include "cli/run_state.h"
#include "core/timer.h"
#include "topology/probe.h"
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
            "  --kv-cache-gb G        KV memory ceiling in gigabytes (the context size too without -c);\n"
            "                         KV pages are taken as the sequence grows\n"
            "  --kv-type f16|f32|q8_0 KV cache element type (default f16; llama.cpp's -ctk/-ctv\n"
            "                         --cache-type-k/-v are taken when equal)\n"
            "  -b, --batch-size N     tokens per prefill pass (default 256)\n"
            "  --temp T               temperature; 0 = greedy (default 0.8)\n"
            "  --top-k K              (default 40; 0 = off)\n"
            "  --top-p P              (default 0.95; 1 = off)\n"
            "  --min-p P              (default 0.05; 0 = off)\n"
            "  --repeat-penalty R     (default 1.0 = off)\n"
            "  --repeat-last-n N      tokens the penalties look back (default 64; 0 = all)\n"
            "  --presence-penalty P   lowers a token's logit by P if it is there (default 0 = off)\n"
            "  --frequency-penalty F  lowers it by F per occurrence there (default 0 = off)\n"
            "  --seed S               RNG seed (default: random; same seed, same output)\n"
            "  --no-bos               do not add BOS to the prompt\n"
            "  --no-display-prompt    do not echo the prompt\n"
            "  --stats                print load time and prompt/decode speed at the end\n"
            "memory placement (see `ellm probe`):\n"
            "  --numa-aware           same as --numa distribute\n"
            "  --numa MODE            off (default), distribute (rows and KV heads on the node whose\n"
            "                         threads read them), replicate (weights copied to every node),\n"
            "                         interleave (pages spread over the nodes)\n"
            "  --mlock                lock the weights in memory\n"
            "  --keep-layout          read the weights in the file's layout, shared with the page\n"
            "                         cache (default: Q8_0, Q4_0 matrices interleaved at load on CPUs\n"
            "                         with AVX2 or AVX-512, for faster decode and batches)\n"
            "RoPE scaling (default: the file's; with --resume, the saved run's):\n" ARG_ROPE_HELP
            "long generations:\n"
            "  --ctx-overflow stop|shift  at the end of the context (-c / --kv-cache-gb):\n"
            "                         stop with a message, or shift: keep the first --keep\n"
            "                         tokens and the newer half of the rest, re-rotating the\n"
            "                         kept keys to their new positions, and go on. Without\n"
            "                         it a prompt + -n beyond the context is refused up front\n"
            "  --keep N               tokens kept at the start by a shift (default 4)\n"
            "  --log-every N          every N generated tokens, a line on stderr: position,\n"
            "                         tokens/s over the last N, resident memory, sparse recall,\n"
            "                         and the GB/s decode read over them (weights + KV attended;\n"
            "                         with --spec, the verify passes' reads, not the drafts')\n"
            "  --log-bandwidth        with --log-every: measure the machine's read bandwidth\n"
            "                         (the bench self-test: 256 MB, all threads) at the start\n"
            "                         and at every log line, so decode's GB/s is compared with\n"
            "                         what the machine reads at that time; the samples' time\n"
            "                         is left out of the speeds\n"
            "resumable generation:\n"
            "  --save-state FILE      save the run to FILE every --save-every tokens (atomic\n"
            "                         replace) and on Ctrl-C\n"
            "  --save-every N         tokens between saves (default 256)\n"
            "  --resume FILE          continue a saved run: model, sampling, seed and context\n"
            "                         come from FILE; prints the text generated so far and\n"
            "                         goes on exactly as the uninterrupted run would. Only -n\n"
            "                         (the total to generate), -t, --stats, --save-state,\n"
            "                         --save-every, --log-every, --log-bandwidth and the\n"
            "                         placement flags (--numa-aware, --numa, --mlock) may be\n"
            "                         given with it\n"
            "beyond one machine (launch with mpirun -np R):\n"
            "  --mpi                  KV cache sharded over the MPI ranks, attention merged exactly\n"
            "                         (same output as one process; dense attention; rank 0 prints)\n"
            "  --mpi-timeout S        seconds a rank waits for the others in one exchange before\n"
            "                         the job is stopped (default 300)\n"
            "chat (the model's chat template, or a built-in one):\n"
            "  --chat                 interactive multi-turn chat on stdin/stdout\n"
            "  --system TEXT          system message; with -p, one chat turn is generated\n"
            "  --chat-template NAME   use a built-in template: llama2, llama3, chatml, mistral,\n"
            "                         phi3, deepseek, deepseek-coder, deepseek3, gemma, zephyr\n"
            "sparse attention (query-aware KV block selection):\n"
            "  --sparse-topk K        attend to at most K tokens per KV head per step\n"
            "  --sparse-profile FILE  per-layer/per-head budgets from `ellm calibrate`\n"
            "  --sparse-window N      recent tokens always attended (default 64)\n"
            "  --sparse-sink N        leading blocks always attended (default 1)\n"
            "  --sparse-dense-layers N  keep the first N layers dense (default 0)\n"
            "  --sparse-recall-every N  sample recall on a dense pass every N steps (default\n"
            "                         64 with --stats or --sparse-adapt, else off)\n"
            "  --sparse-adapt         move budget between heads by sampled recall\n"
            "self-speculative decoding (same output as without, faster):\n"
            "  --spec LIST            drafters: ngram, sparse:N, quant:TYPE (a low-bit copy of\n"
            "                         the weights, cached beside the model), shallow:K (first K\n"
            "                         layers); quant/shallow take :sparse:N; '+' chains them\n"
            "                         (the cheaper proposes for the next), e.g. ngram+quant:q4_0\n"
            "  --draft-max K          tokens drafted per verify pass at most (default 8, at most 31);\n"
            "                         each pass drafts the length that the running acceptance and\n"
            "                         the measured draft and verify costs make fastest\n"
            "  --draft-fixed          always draft --draft-max tokens\n"
            "  --draft-p-min P        a model drafter stops below this top probability (default 0)\n"
            "  --draft-map DRAFT      maps for shallow:K drafters (ellm calibrate --draft)\n"
            "  --spec-verify MODE     dense (exact dense output) or sparse (exact sparse output;\n"
            "                         default with --sparse-topk)\n");
}

typedef struct {
    const char *model, *prompt, *prompt_file;
    long n_predict, threads, ctx, batch;
    double kv_gb;
    int kv_f32;
    ellm_sampler_params sp;
    int seed_given, no_bos, no_echo, stats;
    long sparse_topk, sparse_window, sparse_sink, sparse_dense, sparse_recall;
    const char *spec;       /* --spec drafter list, or NULL */
    const char *draft_map;  /* --draft-map: maps for shallow:K drafters, or NULL */
    int draft_fixed;        /* --draft-fixed: no adaptive draft length */
    long draft_max;
    double draft_p_min;
    int spec_verify;        /* -1: default, 0: dense, 1: sparse */
    const char *sparse_profile;
    int sparse_adapt;
    int chat;
    const char *system, *chat_template;
    int numa, mlock, keep_layout;
    ellm_rope_params rope;      /* --rope-scaling, --rope-scale, ... */
    const char *save_state, *resume;
    int overflow;               /* 0: refuse up front, 1: stop, 2: shift */
    long keep;
    long log_every;
    int log_bandwidth;
    long save_every;
    int n_given;                /* -n was given */
    const char *gen_flag;       /* the first flag that --resume refuses, or NULL */
    int mpi;
    double mpi_timeout;
} run_opts;

static int parse(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 256;
    o->sp = ellm_sampler_default_params();
    o->sparse_window = 64;
    o->sparse_sink = 1;
    o->sparse_recall = -1;
    o->draft_max = 8;
    o->spec_verify = -1;
    o->keep = 4;
    o->mpi_timeout = CLI_MPI_TIMEOUT_S;
    int bad = 0;
    arg_kv_types kvt = ARG_KV_TYPES_NONE;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        double d;
        long n;
        const char *a = argv[i];
        /* Everything but these comes from the state file with --resume. */
        static const char *const resume_ok[] = {"--stats", "--save-state", "--save-every", "--resume", "--numa-aware",
                                                "--numa", "--mlock", "--keep-layout", "--log-every", "--log-bandwidth",
                                                "-n", "--n-predict", "-t", "--threads", NULL};
        int ok = 0;
        for (int k = 0; resume_ok[k]; k++) {
            size_t fl = strlen(resume_ok[k]);
            ok |= !strncmp(a, resume_ok[k], fl) && (a[fl] == 0 || a[fl] == '=');
        }
        if (!ok && !o->gen_flag) o->gen_flag = a;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            run_usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--stats")) o->stats = 1;
        else if (!strcmp(a, "--no-bos")) o->no_bos = 1;
        else if (!strcmp(a, "--sparse-adapt")) o->sparse_adapt = 1;
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--numa-aware")) o->numa = ELLM_NUMA_DISTRIBUTE;
        else if (!strcmp(a, "--mlock")) o->mlock = 1;
        else if (!strcmp(a, "--keep-layout")) o->keep_layout = 1;
        else if (!strcmp(a, "--mpi")) o->mpi = 1;
        else if (arg_rope_parse(argc, argv, &i, &o->rope, &bad)) {
            /* parsed into o->rope, the model's RoPE parameters */
        }
        else if (arg_value(argc, argv, &i, "--mpi-timeout", NULL, &v, &bad))
            bad = !v || !arg_double(a, v, 0.001, 1e6, &o->mpi_timeout);
        else if (arg_value(argc, argv, &i, "--numa", NULL, &v, &bad))
            bad = !v || !arg_numa(a, v, &o->numa);
        else if (arg_value(argc, argv, &i, "--system", NULL, &v, &bad)) o->system = v;
        else if (arg_value(argc, argv, &i, "--chat-template", NULL, &v, &bad)) o->chat_template = v;
        else if (arg_value(argc, argv, &i, "--sparse-topk", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, RUN_COUNT_MAX, &o->sparse_topk);
        else if (arg_value(argc, argv, &i, "--sparse-window", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, RUN_COUNT_MAX, &o->sparse_window);
        else if (arg_value(argc, argv, &i, "--sparse-sink", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, RUN_SPARSE_SMALL_MAX, &o->sparse_sink);
        else if (arg_value(argc, argv, &i, "--sparse-dense-layers", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, RUN_SPARSE_SMALL_MAX, &o->sparse_dense);
        else if (arg_value(argc, argv, &i, "--sparse-recall-every", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, RUN_COUNT_MAX, &o->sparse_recall);
        else if (arg_value(argc, argv, &i, "--sparse-profile", NULL, &v, &bad)) o->sparse_profile = v;
        else if (arg_value(argc, argv, &i, "--spec", NULL, &v, &bad)) o->spec = v;
        else if (arg_value(argc, argv, &i, "--draft-map", NULL, &v, &bad)) o->draft_map = v;
        else if (!strcmp(a, "--draft-fixed")) o->draft_fixed = 1;
        else if (arg_value(argc, argv, &i, "--draft-max", "--n-draft", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 31, &o->draft_max);
        else if (arg_value(argc, argv, &i, "--draft-p-min", NULL, &v, &bad))
            bad = !v || !arg_double(a, v, 0, 0.999999, &o->draft_p_min);
        else if (arg_value(argc, argv, &i, "--spec-verify", NULL, &v, &bad)) {
            if (v && !strcmp(v, "dense")) o->spec_verify = 0;
            else if (v && !strcmp(v, "sparse")) o->spec_verify = 1;
            else {
                fprintf(stderr, "error: --spec-verify takes dense or sparse\n");
                bad = 1;
            }
        }
        else if (!strcmp(a, "--no-display-prompt")) o->no_echo = 1;
        else if (arg_value(argc, argv, &i, "--save-state", NULL, &v, &bad)) o->save_state = v;
        else if (arg_value(argc, argv, &i, "--ctx-overflow", NULL, &v, &bad)) {
            if (v && !strcmp(v, "stop")) o->overflow = 1;
            else if (v && !strcmp(v, "shift")) o->overflow = 2;
            else if (v) {
                fprintf(stderr, "error: --ctx-overflow expects stop or shift, got '%s'\n", v);
                bad = 1;
            }
        } else if (!strcmp(a, "--log-bandwidth"))
            o->log_bandwidth = 1;
        else if (arg_value(argc, argv, &i, "--log-every", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1L << 30, &o->log_every);
        else if (arg_value(argc, argv, &i, "--keep", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, RUN_COUNT_MAX, &o->keep);
        else if (arg_value(argc, argv, &i, "--resume", NULL, &v, &bad)) o->resume = v;
        else if (arg_value(argc, argv, &i, "--save-every", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 1, RUN_COUNT_MAX, &o->save_every);
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) o->model = v;
        else if (arg_value(argc, argv, &i, "--prompt", "-p", &v, &bad)) o->prompt = v;
        else if (arg_value(argc, argv, &i, "--file", "-f", &v, &bad)) o->prompt_file = v;
        else if (arg_value(argc, argv, &i, "--n-predict", "-n", &v, &bad)) {
            bad = !v || !arg_int(a, v, 0, RUN_COUNT_MAX, &o->n_predict);
            o->n_given = 1;
        }
        else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad))
            bad = !v || !arg_int(a, v, 1, RUN_THREADS_MAX, &o->threads);
        else if (arg_value(argc, argv, &i, "--ctx-size", "-c", &v, &bad))
            bad = !v || !arg_int(a, v, 1, RUN_COUNT_MAX, &o->ctx);
        else if (arg_value(argc, argv, &i, "--batch-size", "-b", &v, &bad))
            bad = !v || !arg_int(a, v, 1, RUN_BATCH_MAX, &o->batch);
        else if (arg_value(argc, argv, &i, "--kv-cache-gb", NULL, &v, &bad))
            bad = !v || !arg_double(a, v, 1e-6, 1e6, &o->kv_gb);
        else if (arg_kv_types_parse(argc, argv, &i, &kvt, &bad)) {
            /* --kv-type, -ctk, -ctv: resolved into one type after the loop */
        } else if (arg_value(argc, argv, &i, "--temp", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 0, RUN_TEMP_MAX, &d))) o->sp.temperature = (float)d;
        } else if (arg_value(argc, argv, &i, "--top-k", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 0, RUN_COUNT_MAX, &n))) o->sp.top_k = (int)n;
        } else if (arg_value(argc, argv, &i, "--top-p", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, RUN_TOP_P_MIN, 1, &d))) o->sp.top_p = (float)d;
        } else if (arg_value(argc, argv, &i, "--min-p", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 0, RUN_MIN_P_MAX, &d))) o->sp.min_p = (float)d;
        } else if (arg_value(argc, argv, &i, "--repeat-penalty", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, RUN_REPEAT_PENALTY_MIN, RUN_REPEAT_PENALTY_MAX, &d))) o->sp.repeat_penalty = (float)d;
        } else if (arg_value(argc, argv, &i, "--repeat-last-n", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 0, RUN_COUNT_MAX, &n))) o->sp.repeat_last_n = (int)n;
        } else if (arg_value(argc, argv, &i, "--presence-penalty", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, -RUN_PENALTY_ABS_MAX, RUN_PENALTY_ABS_MAX, &d))) o->sp.presence_penalty = (float)d;
        } else if (arg_value(argc, argv, &i, "--frequency-penalty", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, -RUN_PENALTY_ABS_MAX, RUN_PENALTY_ABS_MAX, &d))) o->sp.frequency_penalty = (float)d;
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
    if (!bad && o->spec_verify == 1 && !o->sparse_topk) {
        fprintf(stderr, "error: --spec-verify sparse needs --sparse-topk (the budget it verifies with)\n");
        bad = 1;
    }
    if (!bad && o->spec_verify < 0) o->spec_verify = o->sparse_topk > 0;
    if (!bad && !arg_kv_types_resolve(&kvt, &o->kv_f32)) bad = 1;
    if (!bad && o->spec && o->chat) {
        fprintf(stderr, "error: --spec is not supported with --chat\n");
        bad = 1;
    }
    if (!bad && o->resume && o->gen_flag) {
        fprintf(stderr,
                "error: %s cannot be given with --resume: the model, sampling settings, seed and context "
                "come from the state file (only -n, -t, --stats, --save-state, --save-every, --log-every, --log-bandwidth, "
                "--numa-aware, --numa and --mlock may be given)\n",
                o->gen_flag);
        bad = 1;
    }
    if (!bad && o->mpi && o->save_state) {
        /* every rank would write its own shard of the cache to the same path */
        fprintf(stderr, "error: --save-state is not available with --mpi: each rank holds only its part of the KV "
                        "cache\n");
        bad = 1;
    }
    if (!bad && o->log_bandwidth && !o->log_every) {
        fprintf(stderr, "error: --log-bandwidth needs --log-every N (it samples the bandwidth at each log line)\n");
        bad = 1;
    }
    if (!bad && o->save_every && !o->save_state && !o->resume) {
        fprintf(stderr, "error: --save-every needs --save-state FILE\n");
        bad = 1;
    }
    if (!bad && o->chat && o->save_state) {
        fprintf(stderr, "error: --save-state is for single generations, not --chat\n");
        bad = 1;
    }
    if (!bad && (o->sparse_profile || o->sparse_adapt) && !o->sparse_topk) {
        fprintf(stderr, "error: --sparse-profile and --sparse-adapt need --sparse-topk\n");
        bad = 1;
    }
    return !bad;
}

/* Context parameters from the options; n_ctx stays 0 unless -c was given (and
 * kv_cache_gb unless --kv-cache-gb), for the caller to choose. */
static ellm_context_params run_context_params(const run_opts *o) {
    ellm_context_params cp = ellm_context_default_params();
    cp.kv_type = (ellm_kv_type)o->kv_f32;
    cp.n_threads = (int)o->threads;
    if (o->batch) cp.n_batch = (int)o->batch;
    cp.n_ctx = (int)o->ctx;
    cp.kv_cache_gb = o->kv_gb;
    /* Without --sparse-topk the context is dense-only: no sparse index is
     * kept, so a dense run does per token exactly what `ellm bench` times. */
    cp.sparse_topk = o->sparse_topk > 0 ? (int)o->sparse_topk : -1;
    /* Dense verification: the target is the dense model (a sparse drafter
     * still needs the index kept, at budget 0). */
    if (o->spec && !o->spec_verify) cp.sparse_topk = strstr(o->spec, "sparse") ? 0 : -1;
    if (o->spec && o->draft_max + 1 > cp.n_batch) cp.n_batch = (int)o->draft_max + 1;
    cp.sparse_window = (int)o->sparse_window;
    cp.sparse_sink_blocks = (int)o->sparse_sink;
    cp.sparse_dense_layers = (int)o->sparse_dense;
    cp.sparse_recall_every = (int)(o->sparse_recall >= 0 ? o->sparse_recall : (o->stats || o->sparse_adapt) ? ELLM_SPARSE_RECALL_EVERY : 0);
    cp.sparse_adapt = o->sparse_adapt;
    return cp;
}

/* Makes the context and loads the sparse profile if one was given; prints why on failure. */
static ellm_context *run_context_init(ellm_model *model, const run_opts *o, const ellm_context_params *cp) {
    ellm_error err = {0};
    ellm_context *ctx = NULL;
    if (ellm_context_init(model, cp, &ctx, &err) != ELLM_OK ||
        (o->sparse_profile && ellm_context_load_sparse_profile(ctx, o->sparse_profile, &err) != ELLM_OK)) {
        fprintf(stderr, "error: %s\n", err.msg);
        ellm_context_free(ctx);
        return NULL;
    }
    return ctx;
}

/* Status line on stderr: tokens, tokens/s, context used. */
static void status_line(int generated, int n_predict, double tps, int pos, int n_ctx) {
    fprintf(stderr, "\r\033[K[%d/%d tokens | %.1f tok/s | ctx %d/%d]", generated, n_predict, tps,
            pos, n_ctx);
}

/* 1 if the rendered text starts with the model's BOS text (the template added it). */
static int starts_with_bos(const ellm_model *model, const char *text) {
    int32_t bos = ellm_token_bos(model);
    if (bos < 0) return 0;
    int n = 0;
    ellm_error err;
    /* tokenize a prefix with special parsing and see whether BOS comes first */
    size_t len = strnlen(text, 64);
    int32_t buf[128];
    if (ellm_tokenize(model, text, len, 0, 1, buf, 128, &n, &err) != ELLM_OK || n == 0) return 0;
    return buf[0] == bos;
}

/* Interactive chat: each turn re-renders the whole conversation with the chat
 * template, keeps the KV cache for the longest prefix of tokens already fed
 * (truncation is O(1)) and feeds only the rest. */
static int run_chat(ellm_model *model, const run_opts *o) {
    ellm_error err = {0};
    ellm_model_info info;
    ellm_model_get_info(model, &info);
    ellm_context_params cp = run_context_params(o); /* n_ctx 0: the model's usable context */
    ellm_context *ctx = run_context_init(model, o, &cp);
    ellm_sampler *sampler = NULL;
    ellm_chat_message *msgs = NULL;
    int32_t *fed = NULL, *ids = NULL;
    int n_msgs = 0, n_fed = 0, rc = 1;
    char line[16384];
    if (!ctx) goto out;
    if (ellm_sampler_init(&o->sp, info.n_vocab, &sampler, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto out;
    }
    int n_ctx = ellm_context_n_ctx(ctx);
    fed = malloc((size_t)n_ctx * sizeof *fed);
    ids = malloc((size_t)(n_ctx + 1) * sizeof *ids);
    msgs = calloc(2 * 1024 + 2, sizeof *msgs);
    if (!fed || !ids || !msgs) {
        fprintf(stderr, "error: out of memory\n");
        goto out;
    }
    if (o->system) msgs[n_msgs++] = (ellm_chat_message){.role = "system", .content = strdup(o->system)};
    int tty_in = isatty(0);
    for (;;) {
        if (tty_in) fputs("> ", stderr);
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!*line) continue;
        if (n_msgs >= 2 * 1024) {
            fprintf(stderr, "error: too many turns\n");
            break;
        }
        msgs[n_msgs++] = (ellm_chat_message){.role = "user", .content = strdup(line)};
        char *text = NULL;
        size_t len;
        if (ellm_chat_render(model, o->chat_template, msgs, n_msgs, 1, &text, &len, &err) != ELLM_OK) {
            fprintf(stderr, "error: chat template: %s\n", err.msg);
            goto out;
        }
        int n = 0;
        ellm_status st = ellm_tokenize(model, text, len, !o->no_bos && !starts_with_bos(model, text), 1, ids,
                                       n_ctx + 1, &n, &err);
        ellm_free(text);
        if (st != ELLM_OK || n >= n_ctx) {
            fprintf(stderr, "error: %s\n", st != ELLM_OK ? err.msg : "the conversation no longer fits the context (-c)");
            goto out;
        }
        int keep = 0;
        while (keep < n_fed && keep < n - 1 && fed[keep] == ids[keep]) keep++;
        ellm_context_truncate(ctx, keep);
        if (ellm_decode(ctx, ids + keep, n - keep, NULL, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto out;
        }
        memcpy(fed, ids, (size_t)n * sizeof *fed);
        n_fed = n;
        /* generate the reply */
        size_t rcap = 4096, rlen = 0;
        char *reply = malloc(rcap);
        ellm_detok dt = {0};
        char piece[2048];
        for (long g = 0; g < o->n_predict && reply; g++) {
            int32_t tok = ellm_sampler_sample(sampler, ellm_context_logits(ctx), fed, n_fed);
            if (ellm_token_is_eog(model, tok)) break;
            int nb = ellm_detok_push(model, &dt, tok, piece, sizeof piece);
            fwrite(piece, 1, (size_t)nb, stdout);
            fflush(stdout);
            if (rlen + (size_t)nb + 1 > rcap) reply = realloc(reply, rcap = 2 * rcap + (size_t)nb);
            if (!reply) break;
            memcpy(reply + rlen, piece, (size_t)nb);
            rlen += (size_t)nb;
            if (n_fed >= n_ctx - 1 || ellm_decode(ctx, &tok, 1, NULL, &err) != ELLM_OK) {
                fprintf(stderr, "\nerror: context full (%d tokens); raise -c\n", n_ctx);
                free(reply);
                goto out;
            }
            fed[n_fed++] = tok;
        }
        if (!reply) {
            fprintf(stderr, "error: out of memory\n");
            goto out;
        }
        reply[rlen] = 0;
        fputc('\n', stdout);
        fflush(stdout);
        msgs[n_msgs++] = (ellm_chat_message){.role = "assistant", .content = reply};
    }
    rc = 0;
out:
    for (int i = 0; i < n_msgs; i++) free((char *)msgs[i].content);
    free(msgs);
    free(fed);
    free(ids);
    ellm_sampler_free(sampler);
    ellm_context_free(ctx);
    return rc;
}

/* The bandwidth decode used (`read_bytes` over t_gen_ms, counted by
 * gen_bytes_between) as a share of the all-node read bandwidth `ellm probe`
 * measured (its saved result, else measured now the same way). */
static void print_bandwidth_share(double read_bytes, int n_dec, double t_gen_ms) {
    if (!(read_bytes > 0 && n_dec > 0 && t_gen_ms > 0)) return;
    double age_s;
    int saved;
    const double probe = probe_reference_gbps(0, 3, &saved, &age_s);
    char source[128] = "measured now as ellm probe does (run `ellm probe` once to keep it)";
    if (saved) {
        char age[64];
        probe_age_text(age_s, age, sizeof age);
        snprintf(source, sizeof source, "ellm probe %s", age);
    }
    const double bytes = read_bytes / n_dec, gbps = read_bytes / t_gen_ms / 1e6;
    if (probe > 0) {
        fprintf(stderr, "bandwidth: %.2f GB/s (%.2f MB read per token) = %.0f%% of the %.2f GB/s %s%s\n", gbps,
                bytes / 1e6, 100 * gbps / probe, probe, source,
                gbps > probe ? "; above 100%: the bytes of a token are served partly from the CPU caches, or the"
                               " probe ran on a busy machine (run `ellm probe` again)"
                             : "");
        /* the name and unit of the server's /metrics gauge */
        fprintf(stderr, "mem_bandwidth_util: %.3f\n", gbps / probe);
    }
    else
        fprintf(stderr, "bandwidth: %.2f GB/s (%.2f MB read per token); no probe bandwidth to compare with\n", gbps,
                bytes / 1e6);
}

/* The context's counters at one moment of a generation: the start of the
 * generation and of each --log-every interval. */
typedef struct {
    double t_ms;
    int generated, pos;
    int64_t recall_samples, decode_steps, sparse_steps;
    double recall_sum, attended_sum, index_bytes;
} gen_mark;

/* --log-every: the interval in progress, and with --log-bandwidth the
 * machine's read bandwidth sampled between intervals. */
typedef struct {
    gen_mark at;         /* the interval's start */
    int sample;          /* --log-bandwidth */
    size_t sample_bytes; /* its buffer (probe_test_bytes; 0 until the first sample) */
    double bw_gbps;      /* the sample at the interval's start (0: none) */
    int n_bw;
    double bw_min, bw_max, bw_sum;
    double sample_ms;    /* time spent sampling, left out of the speeds */
    double read_bytes;   /* over the intervals with a sample at both ends ... */
    double read_ms;      /* ... the decode time they took ... */
    double roofline_ms;  /* ... and the time at the sampled bandwidth */
} log_window;

/* One generation in progress: what the loop needs and what a save writes. */
typedef struct {
    ellm_model *model;
    ellm_context *ctx;
    ellm_sampler *sampler;
    int32_t *ids;       /* prompt then generated tokens; room for n_prompt + n_predict */
    int n_hist;         /* tokens in ids */
    int generated;      /* of them generated */
    run_state rs;       /* settings saved with the state (tokens set at save time) */
    const char *save_path;
    long save_every;
    int overflow;       /* as run_opts.overflow */
    int keep;
    int n_shifts;
    ellm_spec *spec;    /* --spec: tokens come from speculative steps */
    long log_every;
    /* What the bytes read are counted with (log lines, --stats): */
    double weight_bytes;   /* weights one forward pass reads */
    double kv_bytes_token; /* KV bytes of one token (every layer and head) */
    int n_threads;         /* for --log-bandwidth's self-test */
    gen_mark start;        /* the generation's start (gen_loop) */
    double read_bytes;     /* bytes its forward passes read (gen_loop, at the end) */
    log_window lw;
} gen_run;

/* Resident set size of this process in MB (0 if unknown). */
static double rss_mb(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return (double)rss * (double)sysconf(_SC_PAGESIZE) / 1e6;
}

/* The read bandwidth the machine gives now (GB/s), the bench self-test;
 * counts its time as sampling time. */
static double sample_bandwidth(gen_run *g) {
    double t0 = ellm_time_ms();
    if (!g->lw.sample_bytes) g->lw.sample_bytes = probe_test_bytes(NULL);
    double gbps = ellm_measure_read_gbps(g->n_threads, g->lw.sample_bytes, 3);
    g->lw.sample_ms += ellm_time_ms() - t0;
    if (gbps > 0) {
        if (!g->lw.n_bw || gbps < g->lw.bw_min) g->lw.bw_min = gbps;
        if (!g->lw.n_bw || gbps > g->lw.bw_max) g->lw.bw_max = gbps;
        g->lw.n_bw++;
        g->lw.bw_sum += gbps;
    }
    return gbps;
}

static gen_mark gen_mark_now(const gen_run *g) {
    ellm_context_stats cs;
    ellm_context_get_stats(g->ctx, &cs);
    return (gen_mark){.t_ms = ellm_time_ms(),
                      .generated = g->generated,
                      .pos = ellm_context_pos(g->ctx),
                      .recall_samples = cs.recall_samples,
                      .decode_steps = cs.decode_steps,
                      .sparse_steps = cs.sparse_steps,
                      .recall_sum = cs.sparse_recall * (double)cs.recall_samples,
                      .attended_sum = cs.attended_tokens * (double)cs.sparse_steps,
                      .index_bytes = cs.index_bytes_read};
}

/* Bytes the forward passes between marks a and b read: the weights per
 * pass, the KV of the tokens each pass attended, and the index bytes
 * selection read. A sparse pass attends its mean per KV head; a dense pass
 * its whole context. Dense passes are taken as the first of the span (a
 * context runs dense until it outgrows the sparse budget), at positions
 * spread evenly over their share of it. */
static double gen_bytes_between(const gen_run *g, const gen_mark *a, const gen_mark *b) {
    const int64_t steps = b->decode_steps - a->decode_steps, dense = steps - (b->sparse_steps - a->sparse_steps);
    const double dense_pos = steps > 0 ? a->pos + (double)(b->pos - a->pos) * (double)dense / (double)steps / 2 : 0;
    return (double)steps * g->weight_bytes +
           g->kv_bytes_token * ((b->attended_sum - a->attended_sum) + (double)dense * dense_pos) +
           (b->index_bytes - a->index_bytes);
}

/* One --log-every line: speed over the last interval, memory, the sparse
 * recall sampled over it (-1 if none was sampled), and the GB/s its passes
 * read (gen_bytes_between). With --log-bandwidth, also the bandwidth
 * sampled now; the interval is compared with the mean of the samples at its
 * two ends. */
static void log_line(gen_run *g) {
    log_window *w = &g->lw;
    const gen_mark now = gen_mark_now(g);
    const int64_t dn = now.recall_samples - w->at.recall_samples;
    const double bytes = gen_bytes_between(g, &w->at, &now), ms = now.t_ms - w->at.t_ms;
    char bw[96] = "";
    double bw_now = 0;
    if (w->sample) {
        bw_now = sample_bandwidth(g);
        snprintf(bw, sizeof bw, " bw_gbps=%.3f", bw_now);
        if (w->bw_gbps > 0 && bw_now > 0 && ms > 0) {
            w->read_bytes += bytes;
            w->read_ms += ms;
            w->roofline_ms += bytes / ((w->bw_gbps + bw_now) / 2) / 1e6;
        }
    }
    fprintf(stderr, "log: generated=%d pos=%d tok_s=%.3f rss_mb=%.1f recall=%.4f read_gbps=%.3f%s\n", now.generated,
            now.pos, (now.generated - w->at.generated) / (ms / 1000.0), rss_mb(),
            dn > 0 ? (now.recall_sum - w->at.recall_sum) / (double)dn : -1.0, ms > 0 ? bytes / ms / 1e6 : 0.0, bw);
    w->bw_gbps = bw_now;
    w->at = now;
    w->at.t_ms = ellm_time_ms(); /* after the sample: its time is no interval's */
}

/* Whether generation has passed the next multiple of --log-every since the
 * last line (a speculative step adds several tokens at once). */
static int log_due(const gen_run *g) {
    return g->log_every && g->generated / g->log_every > g->lw.at.generated / g->log_every;
}

/* With --log-bandwidth: the samples, and decode's read rate over the logged
 * intervals against the bandwidth sampled around each. */
static void log_bandwidth_summary(const gen_run *g) {
    const log_window *w = &g->lw;
    if (!w->sample) return;
    if (!w->n_bw) {
        fprintf(stderr, "bandwidth samples: none succeeded\n");
        return;
    }
    fprintf(stderr, "bandwidth samples: %d of the read self-test, mean %.2f GB/s (%.2f-%.2f), %.0f ms left out of "
            "the speeds\n", w->n_bw, w->bw_sum / w->n_bw, w->bw_min, w->bw_max, w->sample_ms);
    if (w->read_ms > 0)
        fprintf(stderr, "sampled_bandwidth_util: %.3f (decode read %.2f GB/s over %.2f s of logged intervals; "
                "the bandwidth sampled at each interval's ends would read the same bytes in %.2f s)\n",
                w->roofline_ms / w->read_ms, w->read_bytes / w->read_ms / 1e6, w->read_ms / 1000,
                w->roofline_ms / 1000);
}

/* Writes the state file; a failure is reported and generation goes on. */
static void gen_save(gen_run *g) {
    unsigned char *app = NULL;
    size_t len = 0;
    ellm_error err = {0};
    g->rs.tokens = g->ids;
    g->rs.n_tokens = g->n_hist;
    g->rs.save_every = g->save_every;
    ellm_sampler_get_state(g->sampler, &g->rs.rng);
    if (!run_state_encode(&g->rs, &app, &len)) {
        fprintf(stderr, "\nwarning: cannot save the state: out of memory\n");
        return;
    }
    if (ellm_context_state_save(g->ctx, g->save_path, app, len, &err) != ELLM_OK)
        fprintf(stderr, "\nwarning: cannot save the state: %s\n", err.msg);
    free(app);
}

/* Samples and decodes until n_predict tokens are generated, an end-of-generation
 * token, or Ctrl-C, streaming the text. `dt` holds the detokenizer state of
 * the text already printed. Returns 0 on success. */
static int gen_loop(gen_run *g, long n_predict, ellm_detok *dt, double *t_gen_ms) {
    ellm_error err = {0};
    char text[2048]; /* longest vocabulary pieces are ~512 bytes */
    /* the end of the context: -c, or the KV memory ceiling (--kv-cache-gb) if lower */
    int tty = isatty(2), n_ctx = ellm_context_capacity(g->ctx), start = g->generated;
    double t_last_status = 0;
    g->start = gen_mark_now(g);
    if (g->lw.sample) g->lw.bw_gbps = sample_bandwidth(g); /* sampling time, left out below */
    g->lw.at = gen_mark_now(g);
    int rc = 0;
    signal(SIGINT, on_sigint);
    int eog = 0, last_pending = 0; /* the run reached -n with its last token not decoded */
    while (g->generated < n_predict && !g_interrupted && !eog) {
        int32_t toks[32];
        int n_new = 1;
        if (g->spec) {
            if (ellm_spec_step(g->spec, g->sampler, g->ids, g->n_hist, (int)(n_predict - g->generated), toks, &n_new,
                               &err) != ELLM_OK) {
                fprintf(stderr, "\nerror: %s\n", err.msg);
                rc = 1;
                break;
            }
        } else {
            toks[0] = ellm_sampler_sample(g->sampler, ellm_context_logits(g->ctx), g->ids, g->n_hist);
        }
        for (int i = 0; i < n_new && !eog; i++) {
            int32_t t = toks[i];
            g->ids[g->n_hist++] = t;
            g->generated++;
            if (ellm_token_is_eog(g->model, t)) {
                eog = 1;
                break;
            }
            int nb = ellm_detok_push(g->model, dt, t, text, sizeof text);
            if (nb > 0) {
                if (tty) fputs("\r\033[K", stderr);
                fwrite(text, 1, (size_t)nb, stdout);
                fflush(stdout);
            }
        }
        if (eog || g->generated == n_predict) {
            last_pending = !eog && !g->spec;
            break;
        }
        if (g->spec) { /* the speculative step fed its tokens */
            if (log_due(g)) log_line(g);
            continue;
        }
        int32_t tok = toks[0];
        if (ellm_context_pos(g->ctx) == n_ctx) {
            if (g->overflow != 2) {
                if (n_ctx < ellm_context_n_ctx(g->ctx))
                    fprintf(stderr, "\nKV memory full (--kv-cache-gb): %d tokens held, stopping after %d generated "
                            "tokens (--ctx-overflow shift goes on past it)\n", n_ctx, g->generated);
                else
                    fprintf(stderr, "\ncontext full: %d tokens held, stopping after %d generated tokens "
                            "(--ctx-overflow shift goes on past the context)\n", n_ctx, g->generated);
                break;
            }
            /* keep the sink tokens and the newer half of the rest */
            int keep = g->keep < n_ctx - 1 ? g->keep : n_ctx - 1, n_discard = (n_ctx - keep) / 2;
            if (ellm_context_shift(g->ctx, keep, n_discard, &err) != ELLM_OK) {
                fprintf(stderr, "\nerror: %s\n", err.msg);
                rc = 1;
                break;
            }
            g->n_shifts++;
        }
        if (ellm_decode(g->ctx, &tok, 1, NULL, &err) != ELLM_OK) {
            fprintf(stderr, "\nerror: %s\n", err.msg);
            rc = 1;
            break;
        }
        if (g->save_path && g->generated % g->save_every == 0) gen_save(g);
        if (log_due(g)) log_line(g);
        double now = ellm_time_ms();
        if (tty && now - t_last_status > 200) {
            status_line(g->generated, (int)n_predict, (g->generated - start) / ((now - g->start.t_ms) / 1000.0),
                        ellm_context_pos(g->ctx), n_ctx);
            t_last_status = now;
        }
    }
    *t_gen_ms = ellm_time_ms() - g->start.t_ms - g->lw.sample_ms;
    const gen_mark end = gen_mark_now(g);
    g->read_bytes = gen_bytes_between(g, &g->start, &end);
    log_bandwidth_summary(g);
    int nb = ellm_detok_flush(dt, text, sizeof text);
    fwrite(text, 1, (size_t)nb, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (tty) fputs("\r\033[K", stderr);
    /* A run that reached -n keeps its final state, so that `--resume FILE -n
     * MORE` continues it as a longer run would have gone on; the state holds
     * decoded tokens only, so the last one is decoded first (after the timing
     * above). Not after an end-of-generation token, where a longer run stops
     * too, nor with the context full. */
    if (g->save_path && last_pending && rc == 0 && !g_interrupted && ellm_context_pos(g->ctx) < n_ctx) {
        int32_t last = g->ids[g->n_hist - 1];
        if (ellm_decode(g->ctx, &last, 1, NULL, &err) == ELLM_OK) gen_save(g);
        else fprintf(stderr, "warning: cannot save the final state: %s\n", err.msg);
    }
    if (g_interrupted) {
        /* every token in ids has been decoded: the state is consistent */
        if (g->save_path) gen_save(g);
        fprintf(stderr, "interrupted after %d tokens%s%s\n", g->generated, g->save_path ? "; state saved to " : "",
                g->save_path ? g->save_path : "");
    }
    return rc;
}

static void print_stats(const run_opts *o, const ellm_model_info *info, const char *model_path, long threads,
                        int n_ctx, int kv_f32, int n_prompt, double t_prompt, int generated, double t_gen,
                        uint64_t seed, const ellm_context *ctx, long sparse_topk, double read_bytes) {
    /* decode speed counts the forward passes after the first sampled token */
    int n_dec = generated > 1 ? generated - 1 : 0;
    fprintf(stderr,
            "model_load_ms: %.2f\n"
            "model: %s, %s, %d layers, d=%d, %.1f M params, %.1f MB of weights\n"
            "isa: %s, threads: %ld, context: %d tokens, kv: %s\n"
            "prompt: %d tokens in %.1f ms (%.1f tokens/s)\n"
            "decode: %d tokens in %.1f ms (%.2f tokens/s)\n"
            "seed: %llu\n",
            info->load_ms, model_path, info->arch, info->n_layer, info->n_embd, info->n_params / 1e6,
            info->weight_bytes / 1e6, ellm_isa_name(), threads, n_ctx, ellm_kv_type_name((ellm_kv_type)kv_f32),
            n_prompt, t_prompt,
            t_prompt > 0 ? n_prompt / (t_prompt / 1000.0) : 0, generated, t_gen, n_dec / (t_gen / 1000.0),
            (unsigned long long)seed);
    fprintf(stderr, "placement: %s\n", info->placement);
    if (info->rope_scaling[0]) fprintf(stderr, "rope scaling: %s\n", info->rope_scaling);
    print_bandwidth_share(read_bytes, n_dec, t_gen);
    (void)o;
    ellm_context_stats cs;
    ellm_context_get_stats(ctx, &cs);
    if (cs.forward_ms > 0)
        fprintf(stderr,
                "time split: %lld forward passes (prompt and decode) in %.1f ms: layers' matmuls %.0f%%, "
                "attention %.0f%%, output matrix %.0f%%\n",
                (long long)cs.decode_steps, cs.forward_ms, 100 * cs.matmul_ms / cs.forward_ms,
                100 * cs.attention_ms / cs.forward_ms, 100 * cs.output_ms / cs.forward_ms);
    if (sparse_topk) {
        fprintf(stderr,
                "sparse: budget %ld tokens, %lld of %lld passes sparse, %.0f tokens attended per head, "
                "block selection %.1f ms (%.1f%% of decode), index bytes read %.0f%% of a flat scan\n",
                sparse_topk, (long long)cs.sparse_steps, (long long)cs.decode_steps, cs.attended_tokens,
                cs.select_ms, t_gen > 0 ? 100 * cs.select_ms / t_gen : 0,
                cs.index_flat_bytes > 0 ? 100 * cs.index_bytes_read / cs.index_flat_bytes : 0);
        if (cs.recall_samples)
            fprintf(stderr, "sparse_recall: %.4f (%lld samples)\n", cs.sparse_recall, (long long)cs.recall_samples);
    }
}

/* --resume FILE: settings, tokens and sampler from the state's run section,
 * the KV cache from its context sections; prints what was generated before
 * the save and continues. */
static int run_resume(const run_opts *o) {
    ellm_error err = {0};
    void *app = NULL;
    size_t app_len = 0;
    gen_run g;
    memset(&g, 0, sizeof g);
    int rc = 1;
    char msg[256];
    if (ellm_state_read_app(o->resume, &app, &app_len, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    int ok = run_state_decode(app, app_len, &g.rs, msg, sizeof msg);
    ellm_free(app);
    if (!ok) {
        fprintf(stderr, "error: state file '%s': %s\n", o->resume, msg);
        return 1;
    }
    run_state *rs = &g.rs;
    const int generated = (int)(rs->n_tokens - rs->n_prompt);
    long n_predict = o->n_given ? o->n_predict : (long)rs->n_predict;
    if (o->threads && o->threads != rs->threads) {
        fprintf(stderr,
                "error: the run was saved with %lld threads; -t %ld would change the rounding of attention "
                "and with it the output (omit -t)\n",
                (long long)rs->threads, o->threads);
        goto done;
    }
    if (n_predict < generated) {
        fprintf(stderr, "error: -n %ld is less than the %d tokens already generated (-n is the total)\n", n_predict,
                generated);
        goto done;
    }
    ellm_model_params mp = {.n_threads = (int)rs->threads, .pin_threads = 1, .numa = (ellm_numa_mode)o->numa,
                            .mlock = o->mlock, .keep_layout = o->keep_layout, .rope = rs->rope};
    if (ellm_model_load(rs->model, &mp, &g.model, &err) != ELLM_OK) {
        fprintf(stderr, "error: the state's model: %s\n", err.msg);
        goto done;
    }
    ellm_model_info info;
    ellm_model_get_info(g.model, &info);
    ellm_context_params cp = ellm_context_default_params();
    cp.kv_type = (ellm_kv_type)rs->kv_f32;
    cp.n_threads = (int)rs->threads;
    cp.n_batch = (int)rs->batch;
    cp.n_ctx = (int)rs->n_ctx;
    long need = (long)rs->n_prompt + n_predict;
    if (rs->ctx_auto && need > cp.n_ctx) cp.n_ctx = (int)need; /* a larger -n grows an auto-sized context */
    cp.sparse_topk = (int)rs->sparse_topk;
    cp.sparse_window = (int)rs->sparse_window;
    cp.sparse_sink_blocks = (int)rs->sparse_sink;
    cp.sparse_dense_layers = (int)rs->sparse_dense;
    cp.sparse_recall_every = (int)rs->sparse_recall;
    cp.sparse_adapt = rs->sparse_adapt;
    if (ellm_context_init(g.model, &cp, &g.ctx, &err) != ELLM_OK ||
        ellm_context_state_load(g.ctx, o->resume, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    if (ellm_context_pos(g.ctx) > rs->n_tokens || (rs->overflow != 2 && ellm_context_pos(g.ctx) != rs->n_tokens) ||
        !ellm_context_logits(g.ctx)) {
        fprintf(stderr, "error: state file '%s': the context holds %d tokens but the run has %lld\n", o->resume,
                ellm_context_pos(g.ctx), (long long)rs->n_tokens);
        goto done;
    }
    if (need > ellm_context_n_ctx(g.ctx) && !rs->overflow) {
        fprintf(stderr, "error: the prompt (%lld tokens) plus -n %ld exceeds the saved context of %d tokens\n",
                (long long)rs->n_prompt, n_predict, ellm_context_n_ctx(g.ctx));
        goto done;
    }
    for (int64_t i = 0; i < rs->n_tokens; i++)
        if (rs->tokens[i] < 0 || rs->tokens[i] >= info.n_vocab) {
            fprintf(stderr, "error: state file '%s': token %d is outside the vocabulary\n", o->resume, rs->tokens[i]);
            goto done;
        }
    if (ellm_sampler_init(&rs->sp, info.n_vocab, &g.sampler, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    ellm_sampler_set_state(g.sampler, &rs->rng);
    g.ids = malloc((size_t)(rs->n_prompt + n_predict + 1) * sizeof *g.ids);
    if (!g.ids) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    memcpy(g.ids, rs->tokens, (size_t)rs->n_tokens * sizeof *g.ids);
    free(rs->tokens);
    rs->tokens = NULL; /* from here on the tokens live in g.ids */
    g.n_hist = (int)rs->n_tokens;
    g.generated = generated;
    g.save_path = o->save_state ? o->save_state : o->resume;
    g.save_every = o->save_every ? o->save_every : (long)rs->save_every;
    g.overflow = rs->overflow;
    g.log_every = o->log_every;
    g.lw.sample = o->log_bandwidth;
    g.n_threads = rs->threads > 0 ? (int)rs->threads : ellm_default_threads();
    g.weight_bytes = (double)info.decode_weight_bytes;
    g.kv_bytes_token = (double)ellm_context_kv_bytes_per_token(g.ctx);
    g.keep = (int)rs->keep;
    rs->n_predict = n_predict;

    /* The text so far, as the uninterrupted run printed it. */
    if (!rs->no_echo && rs->prompt) fwrite(rs->prompt, 1, rs->prompt_len, stdout);
    ellm_detok dt = {0};
    dt.n_emitted = 1;
    char text[2048];
    for (int64_t i = rs->n_prompt; i < rs->n_tokens; i++) {
        int nb = ellm_detok_push(g.model, &dt, g.ids[i], text, sizeof text);
        fwrite(text, 1, (size_t)nb, stdout);
    }
    fflush(stdout);
    double t_gen = 0;
    rc = gen_loop(&g, n_predict, &dt, &t_gen);
    if (o->stats && g.n_shifts) fprintf(stderr, "context shifts: %d\n", g.n_shifts);
    if (o->stats)
        print_stats(o, &info, rs->model, (long)rs->threads, ellm_context_n_ctx(g.ctx), rs->kv_f32, 0, 0,
                    g.generated - generated, t_gen, rs->sp.seed, g.ctx, (long)rs->sparse_topk, g.read_bytes);
done:
    if (g.rs.tokens == g.ids) g.rs.tokens = NULL;
    ellm_sampler_free(g.sampler);
    ellm_context_free(g.ctx);
    ellm_model_free(g.model);
    free(g.ids);
    run_state_free(&g.rs);
    return rc;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    if (!parse(argc, argv, &o)) return 2;
    if (o.resume) return run_resume(&o);
    if (!o.model) o.model = cli_default_model();
    if (!o.seed_given) o.sp.seed = ellm_time_ns() ^ ((uint64_t)getpid() << 32);
    ellm_mpi *mpi = NULL;
    int mpi_agreed = 0; /* every rank knows of the failure */
    if (o.mpi) {
        if (o.chat) {
            fprintf(stderr, "error: --mpi does not take --chat (stdin reaches rank 0 only); use -p or -f\n");
            return 2;
        }
        if (!(mpi = cli_mpi_start(o.mpi_timeout, 0))) return 1;
        /* every rank samples the same tokens from the same logits: one seed */
        ellm_error e = {0};
        if (ellm_mpi_bcast(mpi, &o.sp.seed, sizeof o.sp.seed, &e) != ELLM_OK) {
            fprintf(stderr, "error: --mpi: %s\n", e.msg);
            return cli_mpi_end(mpi, 1, 0);
        }
    }

    char *file_prompt = NULL, *rendered = NULL;
    const char *prompt = o.prompt ? o.prompt : "";
    size_t prompt_len = strlen(prompt);
    if (o.prompt_file) {
        if (!(file_prompt = cli_read_file(o.prompt_file, &prompt_len))) return cli_mpi_end(mpi, 1, 0);
        prompt = file_prompt;
    } else if (!o.prompt && !o.chat && !o.system && !strcmp(o.model, cli_default_model())) {
        prompt = "import os\n\n\ndef main():\n";
        prompt_len = strlen(prompt);
    }

    ellm_error err = {0};
    gen_run g;
    memset(&g, 0, sizeof g);
    ellm_spec *spec = NULL;
    int rc = 1;
    /* ranks sharing a machine would pin their threads to the same cores */
    ellm_model_params mp = {.n_threads = (int)o.threads, .pin_threads = ellm_mpi_local_size(mpi) <= 1,
                            .numa = (ellm_numa_mode)o.numa,
                            .mlock = o.mlock, .keep_layout = o.keep_layout, .rope = o.rope};
    if (ellm_model_load(o.model, &mp, &g.model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    ellm_model *model = g.model;
    ellm_model_info info;
    ellm_model_get_info(model, &info);

    int chat_turn = !o.chat && (o.system || o.chat_template);
    int parse_special = 0, add_bos = !o.no_bos;
    if (o.chat) {
        rc = run_chat(model, &o);
        goto done;
    }
    if (chat_turn) {
        ellm_chat_message msgs[2];
        int n_msgs = 0;
        if (o.system) msgs[n_msgs++] = (ellm_chat_message){.role = "system", .content = o.system};
        msgs[n_msgs++] = (ellm_chat_message){.role = "user", .content = prompt};
        size_t n_rendered;
        if (ellm_chat_render(model, o.chat_template, msgs, n_msgs, 1, &rendered, &n_rendered, &err) != ELLM_OK) {
            fprintf(stderr, "error: chat template: %s\n", err.msg);
            goto done;
        }
        prompt = rendered;
        prompt_len = n_rendered;
        parse_special = 1;
        add_bos = add_bos && !starts_with_bos(model, rendered);
        o.no_echo = 1;
    }
    int n_prompt = 0;
    int cap = (int)(prompt_len + 16 < (1u << 30) ? prompt_len + 16 : (1u << 30));
    g.ids = malloc((size_t)(cap + o.n_predict + 1) * sizeof *g.ids);
    if (!g.ids) {
        fprintf(stderr, "error: out of memory for %d prompt tokens\n", cap);
        goto done;
    }
    if (ellm_tokenize(model, prompt, prompt_len, add_bos, parse_special, g.ids, cap, &n_prompt, &err) != ELLM_OK) {
        fprintf(stderr, "error: cannot tokenize the prompt: %s\n", err.msg);
        goto done;
    }
    if (n_prompt == 0) {
        if (ellm_token_bos(model) < 0) {
            fprintf(stderr, "error: the prompt is empty and the model has no BOS token to start from\n");
            goto done;
        }
        g.ids[n_prompt++] = ellm_token_bos(model);
    }
    long need = n_prompt + o.n_predict;
    ellm_context_params cp = run_context_params(&o);
    cp.mpi = mpi;
    if (mpi && o.sparse_recall < 0) cp.sparse_recall_every = 0; /* a shard cannot scan every key */
    int ctx_auto = !o.ctx && !(o.kv_gb > 0);
    if (ctx_auto) {
        if (need > info.n_ctx_train && o.overflow) {
            need = info.n_ctx_train; /* run up to the training length, then stop or shift */
        } else if (need > info.n_ctx_train) {
            fprintf(stderr,
                    "error: the prompt (%d tokens) plus -n %ld is %ld tokens, more than the model's "
                    "training context of %d; shorten them, or pass -c to run beyond it\n",
                    n_prompt, o.n_predict, need, info.n_ctx_train);
            goto done;
        }
        cp.n_ctx = (int)need;
    }
    g.ctx = run_context_init(model, &o, &cp);
    if (mpi && !cli_mpi_setup_ok(mpi, g.ctx != NULL)) {
        mpi_agreed = 1;
        goto done;
    }
    if (!g.ctx) goto done;
    int n_ctx = ellm_context_capacity(g.ctx); /* -c, or less under --kv-cache-gb */
    if (n_prompt > n_ctx || (need > n_ctx && !o.overflow)) {
        fprintf(stderr,
                "error: the prompt (%d tokens) plus -n %ld is %ld tokens, more than the context "
                "size of %d tokens; raise -c / --kv-cache-gb, lower -n, or use --ctx-overflow stop|shift\n",
                n_prompt, o.n_predict, need, n_ctx);
        goto done;
    }
    char advice[320];
    if (ellm_model_context_advice(g.model, n_ctx, advice, sizeof advice) && (!mpi || ellm_mpi_rank(mpi) == 0))
        fprintf(stderr, "note: %s\n", advice);
    if (ellm_sampler_init(&o.sp, info.n_vocab, &g.sampler, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    long threads = o.threads ? o.threads : (long)ellm_default_threads();
    if (o.save_state) {
        run_state *rs = &g.rs;
        rs->model = (char *)o.model;
        rs->no_echo = o.no_echo;
        rs->kv_f32 = o.kv_f32;
        rs->ctx_auto = ctx_auto;
        rs->n_predict = o.n_predict;
        rs->threads = threads;
        rs->batch = cp.n_batch;
        rs->n_ctx = n_ctx;
        rs->sp = o.sp;
        rs->sparse_topk = cp.sparse_topk;
        rs->sparse_window = cp.sparse_window;
        rs->sparse_sink = cp.sparse_sink_blocks;
        rs->sparse_dense = cp.sparse_dense_layers;
        rs->sparse_recall = cp.sparse_recall_every;
        rs->sparse_adapt = cp.sparse_adapt;
        rs->prompt = o.no_echo ? NULL : (char *)prompt;
        rs->prompt_len = o.no_echo ? 0 : prompt_len;
        rs->n_prompt = n_prompt;
        rs->overflow = o.overflow;
        rs->keep = o.keep;
        rs->rope = o.rope;
        g.save_path = o.save_state;
        g.save_every = o.save_every ? o.save_every : 256;
    }
    if (o.spec && (o.save_state || o.overflow)) {
        fprintf(stderr, "error: --spec cannot be combined with --save-state or --ctx-overflow yet\n");
        goto done;
    }
    if (o.spec) {
        ellm_spec_params spp = ellm_spec_default_params();
        spp.drafters = o.spec;
        spp.draft_map = o.draft_map;
        spp.adapt = !o.draft_fixed;
        spp.draft_max = (int)o.draft_max;
        spp.draft_p_min = (float)o.draft_p_min;
        spp.verify_sparse = o.spec_verify;
        if (ellm_spec_init(g.ctx, &spp, &spec, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
    }

    if (!o.no_echo) {
        fwrite(prompt, 1, prompt_len, stdout);
        fflush(stdout);
    }
    double t0 = ellm_time_ms();
    if (ellm_decode(g.ctx, g.ids, n_prompt, NULL, &err) != ELLM_OK) {
        fprintf(stderr, "\nerror: %s\n", err.msg);
        goto done;
    }
    double t_prompt = ellm_time_ms() - t0;
    g.n_hist = n_prompt;
    g.overflow = o.overflow;
    g.keep = (int)o.keep;
    g.log_every = o.log_every;
    g.lw.sample = o.log_bandwidth;
    g.n_threads = (int)threads;
    g.weight_bytes = (double)info.decode_weight_bytes;
    g.kv_bytes_token = (double)ellm_context_kv_bytes_per_token(g.ctx);
    ellm_detok dt = {0};
    dt.n_emitted = 1; /* continuing the prompt: keep the leading space of the first piece */
    double t_gen = 0;
    g.spec = spec;
    if (gen_loop(&g, o.n_predict, &dt, &t_gen)) goto done;
    if (o.stats && g.n_shifts) fprintf(stderr, "context shifts: %d\n", g.n_shifts);
    if (o.stats)
        print_stats(&o, &info, o.model, threads, n_ctx, o.kv_f32, n_prompt, t_prompt, g.generated, t_gen, o.sp.seed,
                    g.ctx, o.sparse_topk, g.read_bytes);
    if (o.stats && spec) {
        ellm_spec_stats ss;
        ellm_spec_get_stats(spec, &ss);
        fprintf(stderr,
                "spec: %s, draft-max %ld, verify %s\n"
                "acceptance_rate: %.4f (%lld of %lld drafted tokens)\n"
                "tokens_per_verify: %.3f (%lld passes)\n"
                "spec_time: draft %.1f ms, verify %.1f ms, rollback %.1f ms\n",
                o.spec, o.draft_max, o.spec_verify ? "sparse" : "dense", ss.acceptance_rate,
                (long long)ss.accepted, (long long)ss.proposed, ss.tokens_per_verify,
                (long long)ss.verify_passes, ss.draft_ms, ss.verify_ms, ss.rollback_ms);
        fprintf(stderr, "draft_length: %s, mean %.2f per pass, next %d; per-token acceptance %.3f; "
                "%lld of %lld passes plain (drafting measured slower)\n",
                o.draft_fixed ? "fixed" : "adaptive", ss.mean_draft_len, ss.draft_len, ss.token_accept,
                (long long)ss.plain_passes, (long long)ss.verify_passes);
        for (int i = 0; i < 4; i++) /* at most 4 drafters in a chain */
            if (*ellm_spec_drafter_note(spec, i)) fprintf(stderr, "spec_drafter %d: %s\n", i, ellm_spec_drafter_note(spec, i));
    }
    if (o.stats && mpi) {
        ellm_context_stats cs;
        ellm_context_get_stats(g.ctx, &cs);
        fprintf(stderr,
                "mpi: %d ranks, rank 0 stores %lld of %d positions; %lld exchanges, %.1f KB sent and "
                "%.1f KB received per exchange, %.3f ms in exchanges + %.3f ms merging per exchange\n",
                cs.mpi_ranks, (long long)cs.mpi_local_tokens, ellm_context_pos(g.ctx), (long long)cs.mpi_exchanges,
                cs.mpi_exchanges ? cs.mpi_bytes_sent / cs.mpi_exchanges / 1e3 : 0,
                cs.mpi_exchanges ? cs.mpi_bytes_recv / cs.mpi_exchanges / 1e3 : 0,
                cs.mpi_exchanges ? cs.mpi_exchange_ms / cs.mpi_exchanges : 0,
                cs.mpi_exchanges ? cs.mpi_merge_ms / cs.mpi_exchanges : 0);
    }
    rc = 0;
done:
    ellm_spec_free(spec);
    ellm_sampler_free(g.sampler);
    ellm_context_free(g.ctx);
    ellm_model_free(g.model);
    free(g.ids);
    free(file_prompt);
    ellm_free(rendered);
    return cli_mpi_end(mpi, rc, mpi_agreed);
}
