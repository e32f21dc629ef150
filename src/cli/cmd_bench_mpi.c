/* `ellm bench --mpi`: decode with the KV cache sharded over the MPI ranks --
 * step time against depth, and what the per-layer exchange of the attention
 * merge costs (its latency per layer, bytes per step, its share of the
 * step), plus the bare collectives of the same size for comparison. Rank 0
 * prints. Inputs of bench/dist_projection.py. */
#include "cli/args.h"
#include "cli/cli_mpi.h"
#include "cli/commands.h"
#include "core/median.h"
#include "core/timer.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MPI_MAX_POINTS 16

static void bench_mpi_usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np R ellm bench --mpi [-m MODEL.gguf] [options]\n"
            "  -t, --threads N         compute threads per rank\n"
            "  --depths LIST           context depths to time decode at (default 0,4096,16384)\n"
            "  -n, --n-tokens N        decode steps timed per depth (default 32)\n"
            "  --synthetic-kv          fill the KV cache with synthetic keys/values (each rank\n"
            "                          its own parts) instead of a real prefill\n"
            "  --kv-type f16|f32|q8_0  KV cache element type (default f16; q8_0 without --sparse-topk)\n"
            "  --sparse-topk K         sparse attention with a K-token budget per KV head\n"
            "  --mpi-timeout S         seconds to wait for the other ranks (default 300)\n"
            "  --json                  machine-readable output\n");
}

typedef struct {
    int depth;
    double step_ms;       /* median decode step */
    double exchange_ms;   /* per layer: in the collective (waiting included) */
    double merge_ms;      /* per layer: merging the parts */
    double parts_ms;      /* per layer: this rank's parts of attention */
    double bytes_step;    /* sent + received by this rank per step */
    double bare_us;       /* the bare collectives of one layer's merge */
    double local_tokens;  /* positions rank 0 stores */
} mpi_point;

int cmd_bench_mpi(int argc, char **argv) {
    const char *model_path = NULL;
    long threads = 0, n_tokens = 32, sparse_topk = 0;
    int depths[MPI_MAX_POINTS] = {0, 4096, 16384}, n_depths = 3;
    int synthetic = 0, json = 0, kv_f32 = 0, bad = 0;
    double timeout = CLI_MPI_TIMEOUT_S;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_mpi_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--mpi")) continue;
        else if (!strcmp(a, "--synthetic-kv")) synthetic = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (arg_value(argc, argv, &i, "--model", "-m", &v, &bad)) model_path = v;
        else if (arg_value(argc, argv, &i, "--threads", "-t", &v, &bad))
            bad = !v || !arg_int(a, v, 1, 1024, &threads);
        else if (arg_value(argc, argv, &i, "--n-tokens", "-n", &v, &bad))
            bad = !v || !arg_int(a, v, 2, 100000, &n_tokens);
        else if (arg_value(argc, argv, &i, "--depths", NULL, &v, &bad))
            bad = !v || (n_depths = arg_int_list(a, v, 0, 1L << 30, depths, MPI_MAX_POINTS)) <= 0;
        else if (arg_value(argc, argv, &i, "--kv-type", NULL, &v, &bad))
            bad = !v || !arg_kv_type(a, v, &kv_f32);
        else if (arg_value(argc, argv, &i, "--sparse-topk", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 0, 1L << 30, &sparse_topk);
        else if (arg_value(argc, argv, &i, "--mpi-timeout", NULL, &v, &bad))
            bad = !v || !arg_double(a, v, 0.001, 1e6, &timeout);
        else {
            fprintf(stderr, "error: unknown option '%s' with --mpi (see ellm bench --mpi --help)\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    for (int i = 1; i < n_depths; i++)
        for (int j = i; j > 0 && depths[j] < depths[j - 1]; j--) {
            int t = depths[j];
            depths[j] = depths[j - 1];
            depths[j - 1] = t;
        }
    if (!model_path) model_path = cli_default_model();
    ellm_mpi *mpi = cli_mpi_start(timeout, 0);
    if (!mpi) return 1;

    int rc = 1, agreed = 0;
    ellm_error err = {0};
    ellm_model *model = NULL;
    ellm_context *ctx = NULL;
    int32_t *ids = NULL;
    double *step = malloc((size_t)n_tokens * sizeof *step);
    ellm_model_params mp = {.n_threads = (int)threads, .pin_threads = 0};
    if (!step || ellm_model_load(model_path, &mp, &model, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", step ? err.msg : "out of memory");
        goto done;
    }
    ellm_model_info info;
    ellm_model_get_info(model, &info);
    int n_ctx = depths[n_depths - 1] + (int)n_tokens + 2;
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = (int)threads;
    cp.kv_type = (ellm_kv_type)kv_f32; /* --kv-type q8_0 was run as F32 */
    cp.n_batch = 512;
    cp.mpi = mpi;
    cp.sparse_topk = (int)sparse_topk;
    ellm_status cst = ellm_context_init(model, &cp, &ctx, &err);
    if (cst != ELLM_OK) fprintf(stderr, "error: %s\n", err.msg);
    if (!cli_mpi_setup_ok(mpi, cst == ELLM_OK)) {
        agreed = 1;
        goto done;
    }
    ids = malloc((size_t)n_ctx * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    for (int i = 0; i < n_ctx; i++) ids[i] = (int32_t)(3 + ((uint64_t)i * 7919u) % (uint64_t)(info.n_vocab - 3));

    mpi_point pts[MPI_MAX_POINTS];
    for (int i = 0; i < n_depths; i++) {
        const int d = depths[i];
        mpi_point *p = &pts[i];
        memset(p, 0, sizeof *p);
        p->depth = d;
        ellm_context_truncate(ctx, 0);
        if (d > 0) {
            ellm_status st = synthetic ? ellm_context_fill_synthetic(ctx, d, 1234 + (uint64_t)d, &err)
                                       : ellm_decode(ctx, ids, d, NULL, &err);
            if (st != ELLM_OK) {
                fprintf(stderr, "error: %s\n", err.msg);
                goto done;
            }
        }
        int32_t warm = ids[d % n_ctx];
        if (ellm_decode(ctx, &warm, 1, NULL, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
        ellm_context_stats s0, s1;
        ellm_context_get_stats(ctx, &s0);
        for (int s = 0; s < n_tokens; s++) {
            int32_t tok = ids[(d + 1 + s) % n_ctx];
            double t0 = ellm_time_ms();
            if (ellm_decode(ctx, &tok, 1, NULL, &err) != ELLM_OK) {
                fprintf(stderr, "error: %s\n", err.msg);
                goto done;
            }
            step[s] = ellm_time_ms() - t0;
        }
        ellm_context_get_stats(ctx, &s1);
        p->step_ms = median_sort(step, (int)n_tokens);
        double ex = (double)(s1.mpi_exchanges - s0.mpi_exchanges);
        if (ex > 0) {
            p->exchange_ms = (s1.mpi_exchange_ms - s0.mpi_exchange_ms) / ex;
            p->merge_ms = (s1.mpi_merge_ms - s0.mpi_merge_ms) / ex;
            p->parts_ms = (s1.mpi_parts_ms - s0.mpi_parts_ms) / ex;
            p->bytes_step = (s1.mpi_bytes_sent - s0.mpi_bytes_sent + s1.mpi_bytes_recv - s0.mpi_bytes_recv) /
                            (double)n_tokens;
        }
        p->local_tokens = (double)s1.mpi_local_tokens;
        /* the bare collectives of one layer's merge (a decode step: one row per query head) */
        if (ellm_mpi_time_exchange(mpi, info.n_head, info.head_dim, 64, &p->bare_us, &err) != ELLM_OK) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto done;
        }
    }
    if (json) {
        printf("{\"model\": \"%s\", \"n_layer\": %d, \"n_head\": %d, \"head_dim\": %d, \"ranks\": %d, "
               "\"threads\": %ld, \"kv_type\": \"%s\", \"synthetic_kv\": %s, \"sparse_topk\": %ld, \"points\": [",
               model_path, info.n_layer, info.n_head, info.head_dim, ellm_mpi_size(mpi), threads,
               ellm_kv_type_name((ellm_kv_type)kv_f32), synthetic ? "true" : "false", sparse_topk);
        for (int i = 0; i < n_depths; i++)
            printf("%s{\"depth\": %d, \"step_ms\": %.4f, \"exchange_ms_per_layer\": %.5f, \"merge_ms_per_layer\": "
                   "%.5f, \"parts_ms_per_layer\": %.5f, \"bytes_per_step\": %.0f, \"bare_exchange_us\": %.2f, "
                   "\"rank0_tokens\": %.0f}",
                   i ? ", " : "", pts[i].depth, pts[i].step_ms, pts[i].exchange_ms, pts[i].merge_ms, pts[i].parts_ms,
                   pts[i].bytes_step, pts[i].bare_us, pts[i].local_tokens);
        printf("]}\n");
    } else {
        printf("model: %s (%d layers, %d heads of %d), %d ranks, %s KV, %s\n", model_path, info.n_layer, info.n_head,
               info.head_dim, ellm_mpi_size(mpi), synthetic ? "synthetic" : "prefilled",
               sparse_topk > 0 ? "sparse" : "dense");
        if (sparse_topk > 0) printf("sparse budget %ld tokens per KV head\n", sparse_topk);
        printf("%8s %9s %10s %12s %11s %11s %12s %12s %10s\n", "depth", "ms/step", "rank0 KV", "exch ms/lay",
               "merge ms/l", "parts ms/l", "KB/step", "bare ex us", "exch share");
        for (int i = 0; i < n_depths; i++) {
            const mpi_point *p = &pts[i];
            printf("%8d %9.3f %10.0f %12.4f %11.4f %11.4f %12.1f %12.1f %9.1f%%\n", p->depth, p->step_ms,
                   p->local_tokens, p->exchange_ms, p->merge_ms, p->parts_ms, p->bytes_step / 1e3, p->bare_us,
                   p->step_ms > 0 ? 100 * (p->exchange_ms + p->merge_ms) * info.n_layer / p->step_ms : 0);
        }
    }
    rc = 0;
done:
    free(ids);
    free(step);
    ellm_context_free(ctx);
    ellm_model_free(model);
    return cli_mpi_end(mpi, rc, agreed);
}
