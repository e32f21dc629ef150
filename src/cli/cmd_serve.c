/* `ellm serve` (and build/ellm_server): the OpenAI-compatible HTTP server. */
#include "cli/args.h"
#include "cli/cli_mpi.h"
#include "cli/commands.h"
#include "server/sched_mpi.h"
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Default --mpi-timeout of a server: a lost rank shows on /health within it. */
#define SERVE_MPI_TIMEOUT_S 30.0

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: ellm serve [-m MODEL.gguf] [options]\n"
            "  -m, --model FILE       GGUF model (default: the embedded evaluation model)\n"
            "  --host ADDR            address to listen on (default 127.0.0.1)\n"
            "  --port N               port (default 8080; 0: any free port, printed at start)\n"
            "  -np, --parallel N      sequences served at once, one slot each (default 4)\n"
            "  --n-batch N            sequences per engine step (default: --parallel)\n"
            "  -b, --batch-size N     prompt tokens per prefill pass (default 128)\n"
            "  -t, --threads N        compute threads (default: one per physical core)\n"
            "  -c, --ctx-size N       context per sequence in tokens (default: the model's training length)\n"
            "  --kv-cache-gb G        KV cache memory shared by all slots (a pool of pages taken as\n"
            "                         sequences grow; default: every slot's full context, at most\n"
            "                         80%% of the memory available at start)\n"
            "  --kv-type f16|f32|q8_0 KV cache element type of every slot (default f16; q8_0: int8 with\n"
            "                         an F16 scale per token and 32 dims, 0.53x the bytes, so the\n"
            "                         same --kv-cache-gb holds ~1.9x the tokens); llama.cpp's\n"
            "                         -ctk/--cache-type-k and -ctv/--cache-type-v are taken when equal\n"
            "  --sparse-topk K        sparse attention: at most K tokens per KV head per step\n"
            "  --sparse-profile FILE  per-layer/per-head budgets from `ellm calibrate`\n"
            "  --spec LIST            self-speculative decoding per slot (drafters as `ellm run\n"
            "                         --spec`: ngram, sparse:N, quant:TYPE, shallow:K, '+' chains);\n"
            "                         greedy output is the same as without\n"
            "  --draft-max K          tokens drafted per verify pass at most (default 8; the\n"
            "                         length adapts to acceptance and measured costs)\n"
            "  --draft-map DRAFT      maps for shallow:K drafters (ellm calibrate --draft)\n"
            "  --chat-template NAME   built-in chat template instead of the model's (llama2, llama3,\n"
            "                         chatml, mistral, phi3, deepseek, gemma, zephyr, ...)\n"
            "  --api-key KEY          require `Authorization: Bearer KEY` on the API endpoints\n"
            "  --alias NAME           model id reported by /v1/models (default: the file name)\n"
            "  --max-queue N          requests waiting beyond the slots before 503 (default 64)\n"
            "  --max-body-mb M        largest request body (default 4)\n"
            "  --timeout S            close connections idle for S seconds (default 30)\n"
            "  --slot-save-path DIR   folder for POST /slots/{id}?action=save|restore {\"filename\": ...}\n"
            "  --numa-aware           weight rows on the NUMA node whose threads read them\n"
            "                         (as `ellm run --numa distribute`)\n"
            "  --keep-layout          read the weights in the file's layout, shared with the page\n"
            "                         cache (default: Q8_0, Q4_0 matrices interleaved at load on CPUs\n"
            "                         with AVX2 or AVX-512, for faster decode and batched steps)\n"
            ARG_ROPE_HELP
            "beyond one machine (mpirun -np R ellm serve --mpi ...):\n"
            "  --mpi                  every slot's KV cache sharded over the MPI ranks, attention\n"
            "                         merged exactly (greedy text as without); rank 0 serves HTTP\n"
            "                         and schedules, the others run its passes. Not with --spec or\n"
            "                         --slot-save-path. A lost rank makes /health and requests\n"
            "                         answer 503; for rank 0 to outlive a rank that dies, launch\n"
            "                         with `mpirun --mca orte_abort_on_non_zero_status 0`\n"
            "  --mpi-timeout S        seconds to wait for the other ranks in one exchange before\n"
            "                         the server reports a rank lost (default 30)\n"
            "endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,\n"
            "           GET /metrics, POST /tokenize, POST /detokenize, GET / (chat page),\n"
            "           POST /slots/{id}?action=save|restore (with --slot-save-path)\n");
}

int cmd_serve(int argc, char **argv) {
    server_params p;
    server_default_params(&p);
    int bad = 0, use_mpi = 0;
    arg_kv_types kvt = ARG_KV_TYPES_NONE;
    long n;
    double d, mpi_timeout = SERVE_MPI_TIMEOUT_S;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--numa-aware")) p.numa_aware = 1;
        else if (!strcmp(a, "--keep-layout")) p.keep_layout = 1;
        else if (!strcmp(a, "--mpi")) use_mpi = 1;
        else if (arg_rope_parse(argc, argv, &i, &p.rope, &bad)) {
            /* parsed into p.rope, the model's RoPE parameters */
        }
        else if (arg_value(argc, argv, &i, "--mpi-timeout", NULL, &v, &bad)) bad = !v || !arg_double(a, v, 0.001, 1e6, &mpi_timeout);
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) p.model_path = v;
        else if (arg_value(argc, argv, &i, "--host", NULL, &v, &bad)) p.host = v;
        else if (arg_value(argc, argv, &i, "--port", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 0, 65535, &n))) p.port = (int)n;
        } else if (arg_value(argc, argv, &i, "--parallel", "-np", &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 1, 256, &n))) p.n_slots = (int)n;
        } else if (arg_value(argc, argv, &i, "--n-batch", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 1, 256, &n))) p.n_batch = (int)n;
        } else if (arg_value(argc, argv, &i, "--batch-size", "-b", &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 1, 4096, &n))) p.chunk = (int)n;
        } else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 1, 1024, &n))) p.n_threads = (int)n;
        } else if (arg_value(argc, argv, &i, "--ctx-size", "-c", &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 2, 1L << 24, &n))) p.n_ctx = (int)n;
        } else if (arg_value(argc, argv, &i, "--kv-cache-gb", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 1e-6, 1e6, &d))) p.kv_cache_gb = d;
        } else if (arg_kv_types_parse(argc, argv, &i, &kvt, &bad)) {
            /* --kv-type, -ctk, -ctv: resolved into one type after the loop */
        } else if (arg_value(argc, argv, &i, "--sparse-topk", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 0, 1L << 30, &n))) p.sparse_topk = (int)n;
        } else if (arg_value(argc, argv, &i, "--sparse-profile", NULL, &v, &bad)) p.sparse_profile = v;
        else if (arg_value(argc, argv, &i, "--spec", NULL, &v, &bad)) p.spec = v;
        else if (arg_value(argc, argv, &i, "--draft-map", NULL, &v, &bad)) p.draft_map = v;
        else if (arg_value(argc, argv, &i, "--draft-max", "--n-draft", &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 1, 31, &n))) p.draft_max = (int)n;
        } else if (arg_value(argc, argv, &i, "--chat-template", NULL, &v, &bad)) p.chat_template = v;
        else if (arg_value(argc, argv, &i, "--api-key", NULL, &v, &bad)) p.api_key = v;
        else if (arg_value(argc, argv, &i, "--alias", NULL, &v, &bad)) p.alias = v;
        else if (arg_value(argc, argv, &i, "--max-queue", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 0, 1 << 20, &n))) p.max_queue = (int)n;
        } else if (arg_value(argc, argv, &i, "--max-body-mb", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_double(a, v, 0.001, 4096, &d))) p.max_body = (size_t)(d * (1 << 20));
        } else if (arg_value(argc, argv, &i, "--slot-save-path", NULL, &v, &bad)) {
            p.slot_save_path = v;
        } else if (arg_value(argc, argv, &i, "--timeout", NULL, &v, &bad)) {
            if (!(bad = !v || !arg_int(a, v, 1, 86400, &n))) p.timeout_s = (int)n;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see ellm serve --help)\n", a);
            bad = 1;
        }
    }
    int kv_type;
    if (bad || !arg_kv_types_resolve(&kvt, &kv_type)) return 2;
    p.kv_type = (ellm_kv_type)kv_type;
    if (p.sparse_profile && !p.sparse_topk) {
        fprintf(stderr, "error: --sparse-profile needs --sparse-topk\n");
        return 2;
    }
    if (p.api_key && !*p.api_key) {
        fprintf(stderr, "error: --api-key is empty\n");
        return 2;
    }
    if (p.slot_save_path) {
        struct stat st;
        if (stat(p.slot_save_path, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "error: --slot-save-path '%s' is not a folder\n", p.slot_save_path);
            return 2;
        }
    }
    if (use_mpi && (p.spec || p.slot_save_path)) {
        fprintf(stderr, "error: --mpi does not support %s (a slot's KV is spread over the ranks)\n",
                p.spec ? "--spec" : "--slot-save-path");
        return 2;
    }
    if (!p.model_path) p.model_path = cli_default_model();
    if (!use_mpi) return server_run(&p);
    ellm_mpi *mpi = cli_mpi_start(mpi_timeout, 1);
    if (!mpi) return 1;
    if (ellm_mpi_rank(mpi) != 0) {
        int rc = sched_mpi_follow(mpi, &p);
        /* a follower that stops alone leaves MPI as it is: finalizing would
         * wait for the others, and aborting would take rank 0 (which reports
         * the loss on /health) down with it */
        if (rc != 0) {
            fflush(stderr);
            _exit(rc);
        }
        return cli_mpi_end(mpi, rc, 1);
    }
    p.mpi = mpi;
    return cli_mpi_end(mpi, server_run(&p), 0);
}
