/* The server's batched engine step without HTTP: N independent sequences, each
 * with a short prompt already in its KV cache (pages from one shared pool, as
 * `ellm serve` holds them), decoding one token each per ellm_decode_batch
 * pass. Prints the milliseconds per pass (min, median, p90, max; on a shared
 * machine the min is the pass least disturbed by others) and the same
 * model's single forward of N tokens of one sequence (a prefill chunk: one
 * KV cache, only the last row's logits) for comparison. Then, at the largest
 * level, the step in which a prompt arrives: N - 1 sequences decoding and one
 * feeding its P-token prompt, once with a context never used before (as a
 * server slot's first request) and once with a reused one, alternating
 * (-f rounds of each; 0 skips it). Not a test.
 *
 *   make bench && build/bench/bench_batch -m MODEL [-n 1,4,16] [-p 32]
 *        [-s steps] [-t threads] [-f rounds] [--no-pin]
 *
 * The machine may be shared: compare builds in one run, side by side. */
#include "core/timer.h"
#include "ellm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Minor page faults of this process so far (a first touch of memory). */
static long minor_faults(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? 0 : ru.ru_minflt;
}

static int fail(const char *what, const ellm_error *err) {
    fprintf(stderr, "bench_batch: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL, *levels = "1,4,16";
    int prompt = 32, steps = 64, threads = 2, pin = 1, fresh = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) levels = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) fresh = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-pin")) pin = 0;
        else {
            fprintf(stderr, "usage: bench_batch -m MODEL [-n 1,4,16] [-p prompt] [-s steps] [-t threads] [-f rounds] [--no-pin]\n");
            return 2;
        }
    }
    if (!path || prompt < 1 || steps < 1 || threads < 1 || fresh < 0 || fresh > 64) {
        fprintf(stderr, "bench_batch: -m MODEL is required; -p, -s, -t must be >= 1, -f 0..64\n");
        return 2;
    }
    ellm_error err = {0};
    ellm_model *model = NULL;
    ellm_model_params mp = {.n_threads = threads, .pin_threads = pin};
    if (ellm_model_load(path, &mp, &model, &err)) return fail(path, &err);
    ellm_model_info info;
    ellm_model_get_info(model, &info);
    int max_n = 0;
    for (const char *p = levels; *p;) {
        int v = atoi(p);
        if (v > max_n) max_n = v;
        const char *c = strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    if (max_n < 1 || max_n > 256) {
        fprintf(stderr, "bench_batch: -n levels must be 1..256\n");
        return 2;
    }
    /* room for the decode steps of every level and of the prompt rounds */
    const int n_ctx = prompt + steps + 2 * fresh + 8;
    ellm_kv_pool *pool = NULL;
    double gb = (double)ellm_kv_pool_page_bytes(model, ELLM_KV_F16) *
                ((n_ctx + ellm_kv_pool_page_tokens() - 1) / ellm_kv_pool_page_tokens() + 1) * (max_n + 1 + fresh) /
                1e9;
    if (ellm_kv_pool_init(model, ELLM_KV_F16, gb, &pool, &err)) return fail("kv pool", &err);
    const int max_rows = max_n + prompt; /* a prompt step: max_n - 1 decoding rows and a prompt */
    ellm_batch *batch = NULL;
    if (ellm_batch_init(model, threads, max_rows, &batch, &err)) return fail("batch", &err);
    /* ctx[0..max_n]: the levels' sequences and the N-token forward's;
     * ctx[max_n + 1 ..]: contexts first used in the prompt rounds */
    ellm_context **ctx = calloc((size_t)max_n + 1 + (size_t)fresh, sizeof *ctx);
    ellm_context_params cp = ellm_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = max_rows;
    cp.kv_pool = pool;
    cp.sparse_topk = -1;
    for (int i = 0; i <= max_n + fresh; i++)
        if (ellm_batch_context_init(batch, &cp, &ctx[i], &err)) return fail("context", &err);
    const int n_toks = prompt + steps + max_n + 2 * fresh;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_toks);
    unsigned seed = 12345;
    for (int i = 0; i < n_toks; i++) {
        seed = seed * 1103515245u + 12345u;
        toks[i] = 1 + (int32_t)((seed >> 8) % 1999u);
    }
    double *ms = malloc(sizeof(double) * (size_t)steps);
    printf("model %s, %d threads%s, prompt %d tokens, %d steps\n", path, threads, pin ? " pinned" : "", prompt, steps);
    printf("%6s %12s %12s %12s %12s %12s %14s\n", "seqs", "min ms", "median ms", "p90 ms", "max ms", "tok/s",
           "N-token fwd ms");
    for (const char *p = levels; *p;) {
        const int n = atoi(p);
        /* prompts: one sequence at a time (as a prefill chunk would) */
        for (int i = 0; i < n; i++) {
            ellm_context_truncate(ctx[i], 0);
            const int32_t *tp = toks + i;
            int np = prompt;
            if (ellm_decode_batch(batch, &ctx[i], &tp, &np, 1, &err)) return fail("prefill", &err);
        }
        const int32_t *tk[256];
        int ones[256];
        for (int s = 0; s < steps; s++) {
            for (int i = 0; i < n; i++) {
                tk[i] = toks + prompt + s + i;
                ones[i] = 1;
            }
            uint64_t t0 = ellm_time_ns();
            if (ellm_decode_batch(batch, ctx, tk, ones, n, &err)) return fail("decode", &err);
            ms[s] = (double)(ellm_time_ns() - t0) / 1e6;
        }
        qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
        /* one sequence's forward of n tokens at the same depth (median of 9) */
        double fw[9];
        for (int r = 0; r < 9; r++) {
            ellm_context_truncate(ctx[max_n], prompt);
            if (r == 0) {
                ellm_context_truncate(ctx[max_n], 0);
                const int32_t *tp = toks;
                int np = prompt;
                if (ellm_decode_batch(batch, &ctx[max_n], &tp, &np, 1, &err)) return fail("prefill", &err);
            }
            const int32_t *tp = toks + prompt;
            int nn = n;
            uint64_t t0 = ellm_time_ns();
            if (ellm_decode_batch(batch, &ctx[max_n], &tp, &nn, 1, &err)) return fail("forward", &err);
            fw[r] = (double)(ellm_time_ns() - t0) / 1e6;
        }
        qsort(fw, 9, sizeof *fw, cmp_d);
        const double med = ms[steps / 2];
        printf("%6d %12.2f %12.2f %12.2f %12.2f %12.1f %14.2f\n", n, ms[0], med, ms[steps * 9 / 10], ms[steps - 1],
               n * 1000.0 / med, fw[4]);
        fflush(stdout);
        const char *c = strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    int last = 0; /* the largest level run, whose sequences are still decoding */
    for (const char *p = levels; *p;) {
        last = atoi(p);
        const char *c = strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    if (fresh > 0 && last > 1) {
        /* one prompt among last - 1 decoding sequences: a context's first
         * step (its scratch and workspace touched for the first time) against
         * a reused context's */
        double first[64], again[64];
        long faults[2] = {0, 0}; /* minor faults of the new / reused contexts' steps */
        ellm_context *sq[256];
        const int32_t *tk[256];
        int nt[256];
        for (int r = 0; r < fresh; r++) {
            for (int k = 0; k < 2; k++) {
                ellm_context *pc = k == 0 ? ctx[max_n + 1 + r] : ctx[max_n];
                ellm_context_truncate(ctx[max_n], 0);
                for (int i = 0; i < last - 1; i++) {
                    sq[i] = ctx[i];
                    tk[i] = toks + prompt + steps + 2 * r + k + i;
                    nt[i] = 1;
                }
                sq[last - 1] = pc;
                tk[last - 1] = toks + r;
                nt[last - 1] = prompt;
                const long f0 = minor_faults();
                uint64_t t0 = ellm_time_ns();
                if (ellm_decode_batch(batch, sq, tk, nt, last, &err)) return fail("prompt step", &err);
                (k == 0 ? first : again)[r] = (double)(ellm_time_ns() - t0) / 1e6;
                faults[k] += minor_faults() - f0;
            }
        }
        qsort(first, (size_t)fresh, sizeof *first, cmp_d);
        qsort(again, (size_t)fresh, sizeof *again, cmp_d);
        printf("prompt step (%d decoding + a %d-token prompt), %d rounds: new context median %.2f ms (max %.2f), "
               "reused context median %.2f ms (max %.2f); minor page faults per step %.1f new, %.1f reused\n",
               last - 1, prompt, fresh, first[fresh / 2], first[fresh - 1], again[fresh / 2], again[fresh - 1],
               (double)faults[0] / fresh, (double)faults[1] / fresh);
    }
    for (int i = 0; i <= max_n + fresh; i++) ellm_context_free(ctx[i]);
    ellm_batch_free(batch);
    ellm_kv_pool_free(pool);
    ellm_model_free(model);
    free(ctx);
    free(toks);
    free(ms);
    return 0;
}
