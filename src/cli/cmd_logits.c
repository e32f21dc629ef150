/* `ellm logits`: logits after every token of an id file, as float32 rows. */
#include "cli/args.h"
#include "cli/cli_mpi.h"
#include "cli/commands.h"
#include "ellm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void logits_usage(FILE *f) {
    fprintf(f,
            "usage: ellm logits -m MODEL.gguf --ids IDS_FILE -o OUT.f32 [options]\n"
            "Feeds the whitespace-separated token ids of IDS_FILE in one batched pass and\n"
            "writes the logits after every token: n_ids rows of n_vocab little-endian float32.\n"
            "  -t, --threads N      compute threads\n"
            "  --kv-type f16|f32|q8_0 KV cache element type (default f16)\n"
            "  -b, --batch-size N   tokens per pass (default: all ids in one pass)\n"
            "  --decode-from N      feed ids from index N on one per pass, as decode steps\n"
            "  --sparse-topk N      sparse attention: N KV tokens per head (default 0: dense)\n"
            "  --rope-scaling T, --rope-scale N, --rope-freq-base N, --yarn-orig-ctx N\n"
            "                       RoPE scaling instead of the file's (see ellm run)\n"
            "  --mpi                under mpirun: KV cache sharded over the ranks (rank 0 writes)\n"
            "  --mpi-timeout S      seconds to wait for the other ranks in one exchange (default 300)\n");
}

/* Parses whitespace-separated non-negative integers; NULL + message on error. */
static int32_t *parse_ids(const char *text, int *n_out) {
    int cap = 256, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = text;
    while (ids) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r')) {
            fprintf(stderr, "error: ids file: '%.20s' at byte %ld is not a token id\n", p, (long)(p - text));
            free(ids);
            return NULL;
        }
        if (n == cap) {
            int32_t *nb = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!nb) {
                free(ids);
                return NULL;
            }
            ids = nb;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    *n_out = n;
    return ids;
}

int cmd_logits(int argc, char **argv) {
    const char *model_path = NULL, *ids_path = NULL, *out_path = NULL;
    long threads = 0, batch = 0, decode_from = -1, sparse_topk = 0;
    int kv_f32 = 0, bad = 0, use_mpi = 0;
    ellm_rope_params rope = {0};
    double mpi_timeout = CLI_MPI_TIMEOUT_S;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            logits_usage(stdout);
            return 0;
        } else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) model_path = v;
        else if (arg_value(argc, argv, &i, "--ids", NULL, &v, &bad)) ids_path = v;
        else if (arg_value(argc, argv, &i, "--output", "-o", &v, &bad)) out_path = v;
        else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1024, &threads);
        else if (arg_value(argc, argv, &i, "--batch-size", "-b", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1 << 20, &batch);
        else if (!strcmp(a, "--mpi")) use_mpi = 1;
        else if (arg_rope_parse(argc, argv, &i, &rope, &bad)) {
            /* parsed into rope, the model's RoPE parameters */
        }
        else if (arg_value(argc, argv, &i, "--decode-from", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &decode_from);
        else if (arg_value(argc, argv, &i, "--sparse-topk", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &sparse_topk);
        else if (arg_value(argc, argv, &i, "--mpi-timeout", NULL, &v, &bad))
            bad = !v || !arg_double(a, v, 0.001, 1e6, &mpi_timeout);
        else if (arg_value(argc, argv, &i, "--kv-type", NULL, &v, &bad))
            bad = !v || !arg_kv_type(a, v, &kv_f32);
        else {
            fprintf(stderr, "error: unknown option '%s' (see ellm logits --help)\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    if (!ids_path || !out_path) {
        logits_usage(stderr);
        return 2;
    }
    if (!model_path) model_path = cli_default_model();
    char *text = cli_read_file(ids_path, NULL);
    if (!text) return 1;
    int n = 0;
    int32_t *ids = parse_ids(text, &n);
    free(text);
    if (!ids) return 1;
    if (n == 0) {
        fprintf(stderr, "error: ids file '%s' holds no token ids\n", ids_path);
        free(ids);
        return 1;
    }
    int rc = 1;
    ellm_mpi *mpi = NULL;
    int mpi_agreed = 0; /* every rank knows of the failure */
    if (use_mpi && !(mpi = cli_mpi_start(mpi_timeout, 0))) {
        free(ids);
        return 1;
    }
    ellm_error err = {0};
    ellm_model *model = NULL;
    ellm_context *ctx = NULL;
    float *logits = NULL;
    FILE *out = NULL;
    /* ranks sharing a machine would pin their threads to the same cores */
    ellm_model_params mp = {.n_threads = (int)threads, .pin_threads = ellm_mpi_local_size(mpi) <= 1, .rope = rope};
    if (ellm_model_load(model_path, &mp, &model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    ellm_model_info info;
    ellm_model_get_info(model, &info);
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n;
    cp.n_batch = batch ? (int)batch : n;
    cp.kv_type = (ellm_kv_type)kv_f32;
    cp.n_threads = (int)threads;
    cp.mpi = mpi;
    cp.sparse_topk = (int)sparse_topk;
    ellm_status cst = ellm_context_init(model, &cp, &ctx, &err);
    if (cst != ELLM_OK) fprintf(stderr, "error: %s\n", err.msg);
    if (mpi && !cli_mpi_setup_ok(mpi, cst == ELLM_OK)) {
        mpi_agreed = 1;
        goto done;
    }
    if (cst != ELLM_OK) goto done;
    logits = malloc((size_t)n * (size_t)info.n_vocab * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "error: out of memory for %d x %d logits\n", n, info.n_vocab);
        goto done;
    }
    int n_batched = decode_from >= 0 && decode_from < n ? (int)decode_from : n;
    if (n_batched > 0 && ellm_decode(ctx, ids, n_batched, logits, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    for (int i = n_batched; i < n; i++)
        if (ellm_decode(ctx, ids + i, 1, logits + (size_t)i * info.n_vocab, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
    if (mpi) {
        ellm_context_stats cs;
        ellm_context_get_stats(ctx, &cs);
        fprintf(stderr, "mpi: %d ranks, rank 0 stores %lld of %d positions, %lld exchanges, %.0f bytes sent\n",
                cs.mpi_ranks, (long long)cs.mpi_local_tokens, n, (long long)cs.mpi_exchanges, cs.mpi_bytes_sent);
    }
    if (sparse_topk > 0) {
        ellm_context_stats cs;
        ellm_context_get_stats(ctx, &cs);
        fprintf(stderr, "sparse: %lld selections, %.1f tokens attended per head, blocks digest %016llx\n",
                (long long)cs.sparse_selections, cs.attended_tokens, (unsigned long long)cs.sparse_digest);
    }
    if (ellm_mpi_rank(mpi) != 0) { /* every rank has the logits; rank 0 writes them */
        rc = 0;
        goto done;
    }
    out = fopen(out_path, "wb");
    if (!out || fwrite(logits, sizeof *logits, (size_t)n * info.n_vocab, out) != (size_t)n * info.n_vocab ||
        fclose(out) != 0) {
        fprintf(stderr, "error: cannot write '%s': %s\n", out_path, strerror(errno));
        out = NULL;
        goto done;
    }
    out = NULL;
    rc = 0;
done:
    if (out) fclose(out);
    free(logits);
    free(ids);
    ellm_context_free(ctx);
    ellm_model_free(model);
    return cli_mpi_end(mpi, rc, mpi_agreed);
}
