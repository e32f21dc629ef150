/* Sparse-attention read efficiency (not a test).
 *
 * Shape of SmolLM2-135M (30 layers, 9 query heads, 3 KV heads, head_dim 64)
 * or, with --shape 1b, of Llama-3.2-1B (16 layers, 32 query heads, 8 KV
 * heads, head_dim 64); an F16 cache (--kv q8_0: Q8_0) in blocks of 16
 * tokens. One "step" runs decode attention for every layer. Three kinds of step are timed, interleaved, with the caches
 * flushed (a 256 MB read) before each so the KV comes from DRAM:
 *   contiguous  dense attention at depth BUDGET (the same bytes, sequential);
 *   sparse      attention over BUDGET / 16 blocks per (layer, head) scattered
 *               over a DEPTH-token cache (sink, recent window, random rest:
 *               what the sparse index hands the kernel);
 *   dense       dense attention at DEPTH, for scale;
 *   in-job      the sparse blocks through attention_forward_select (lists
 *               handed out by the selection callback, as the engine does).
 * The sparse/contiguous ratio is the cost of reading scattered blocks.
 *
 *   bench_sparse_attention [threads] [depth] [budget] [reps] [--shape 135m|1b] [--kv f16|q8_0] [--run N]
 * --run N chooses the random blocks in runs of N adjacent ones (default 1).
 * NOFLUSH=1 in the environment skips the flush (blocks served from cache
 * where they fit). */
#include "bench_util.h"
#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "core/cpu.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kernels/quant.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_DIM 64
#define MAX_LAYER 32
#define MAX_KV 8
#define BLOCK 16
#define FLUSH_BYTES ((size_t)256 << 20)

static volatile uint64_t sink;

static void flush_caches(const uint64_t *buf) {
    uint64_t s = 0;
    for (size_t i = 0; i < FLUSH_BYTES / 8; i += 8) s += buf[i];
    sink += s;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* attention_select_fn handing out the precomputed lists of one layer. */
typedef struct {
    const int32_t *lists;
    const int *n;
    int max_blocks;
} given_lists;

static void give_list(void *arg, int h, int thread, int32_t *blocks, int *n_blocks) {
    const given_lists *g = arg;
    (void)thread;
    memcpy(blocks, g->lists + (size_t)h * g->max_blocks, (size_t)g->n[h] * sizeof *blocks);
    *n_blocks = g->n[h];
}

/* Sink block 0, the last `window` blocks, then distinct random blocks up to
 * `want`, in runs of `run` adjacent blocks where they fit, ascending (as
 * sparse_index_select returns them). */
static int choose(int32_t *out, int n_blocks, int want, int window, int run) {
    char *taken = calloc((size_t)n_blocks, 1);
    int n = 0;
    taken[0] = 1;
    out[n++] = 0;
    for (int b = n_blocks - window; b < n_blocks; b++)
        if (b > 0 && !taken[b]) taken[b] = 1, out[n++] = b;
    while (n < want) {
        int b0 = (int)(bench_rand() % (uint64_t)n_blocks) / run * run;
        for (int b = b0; b < b0 + run && b < n_blocks && n < want; b++)
            if (!taken[b]) taken[b] = 1, out[n++] = b;
    }
    free(taken);
    qsort(out, (size_t)n, sizeof *out, cmp_i32);
    return n;
}

int main(int argc, char **argv) {
    int pos_args[4] = {2, 32768, 2048, 21}, n_pos = 0, N_LAYER = 30, N_HEAD = 9, N_KV = 3, run = 1, bad = 0;
    int kvt = QTYPE_F16;
    for (int i = 1; i < argc && !bad; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "1b")) N_LAYER = 16, N_HEAD = 32, N_KV = 8;
            else bad = strcmp(v, "135m") != 0;
        } else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "q8_0")) kvt = QTYPE_Q8_0;
            else bad = strcmp(v, "f16") != 0;
        } else if (!strcmp(argv[i], "--run") && i + 1 < argc) {
            run = atoi(argv[++i]);
            bad = run < 1 || run > 64;
        } else if (n_pos < 4 && argv[i][0] != '-') {
            pos_args[n_pos++] = atoi(argv[i]);
        } else {
            bad = 1;
        }
    }
    int nt = pos_args[0], depth = pos_args[1], budget = pos_args[2], reps = pos_args[3];
    if (bad || nt < 1 || depth < BLOCK || budget < BLOCK || budget > depth || reps < 1) {
        fprintf(stderr, "usage: bench_sparse_attention [threads] [depth] [budget <= depth] [reps] "
                        "[--shape 135m|1b] [--kv f16|q8_0] [--run BLOCKS]\n");
        return 2;
    }
    kv_cache_params kp = {N_LAYER, N_KV, HEAD_DIM, depth + 1, BLOCK, kvt, 0};
    kv_cache *kv;
    ellm_error err;
    if (kv_cache_init(&kp, &kv, &err) != ELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int chunk = 512;
    size_t row = (size_t)N_KV * HEAD_DIM;
    float *k = malloc(chunk * row * sizeof(float)), *v = malloc(chunk * row * sizeof(float));
    for (size_t i = 0; i < chunk * row; i++) {
        k[i] = (float)(bench_rand() % 65536) / 32768.0f - 1.0f;
        v[i] = -k[i] * 0.5f;
    }
    for (int l = 0; l < N_LAYER; l++)
        for (int pos = 0; pos < depth + 1; pos += chunk) {
            int n = depth + 1 - pos < chunk ? depth + 1 - pos : chunk;
            kv_cache_store(kv, l, pos, n, k, v);
        }
    kv_cache_set_len(kv, depth + 1);

    const int n_blocks = (depth + 1 + BLOCK - 1) / BLOCK, want = budget / BLOCK;
    int32_t *blocks = malloc((size_t)N_LAYER * N_KV * n_blocks * sizeof *blocks);
    int n_sel[MAX_LAYER][MAX_KV];
    for (int l = 0; l < N_LAYER; l++)
        for (int h = 0; h < N_KV; h++)
            n_sel[l][h] = choose(blocks + ((size_t)l * N_KV + h) * n_blocks, n_blocks, want, 4, run);

    float *q = malloc(N_HEAD * HEAD_DIM * sizeof(float)), *out = malloc(N_HEAD * HEAD_DIM * sizeof(float));
    for (int i = 0; i < N_HEAD * HEAD_DIM; i++) q[i] = (float)(i % 7) * 0.1f - 0.3f;
    uint64_t *flush = malloc(FLUSH_BYTES);
    memset(flush, 1, FLUSH_BYTES);

    threadpool *pool;
    attention_workspace *ws;
    if (threadpool_init(nt, 1, &pool, &err) != ELLM_OK ||
        attention_workspace_init(nt, 1, N_HEAD, HEAD_DIM, depth + 1, BLOCK, &ws, &err) != ELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int32_t *scratch = malloc((size_t)N_KV * n_blocks * sizeof *scratch);
    int scratch_n[N_KV];
    double *ms[4];
    for (int m = 0; m < 4; m++) ms[m] = malloc((size_t)reps * sizeof(double));
    for (int r = 0; r < reps; r++)
        for (int m = 0; m < 4; m++) {
            if (!getenv("NOFLUSH")) flush_caches(flush);
            double t0 = ellm_time_ms();
            for (int l = 0; l < N_LAYER; l++) {
                attention_args a = {kv, l, 1, m == 0 ? budget : depth, N_HEAD, q, out, 0.125f};
                if (m == 1)
                    attention_forward_blocks(&a, blocks + (size_t)l * N_KV * n_blocks, n_sel[l], n_blocks,
                                             ws, pool);
                else if (m == 3) {
                    given_lists g = {blocks + (size_t)l * N_KV * n_blocks, n_sel[l], n_blocks};
                    attention_forward_select(&a, give_list, &g, scratch, scratch_n, n_blocks, ws, pool);
                } else
                    attention_forward(&a, ws, pool);
            }
            ms[m][r] = ellm_time_ms() - t0;
        }
    const char *names[4] = {"contiguous", "sparse", "dense", "in-job"};
    double med[4];
    printf("sparse attention read: %s, %d threads, %d layers x %d KV heads (%d query heads), %s cache, depth %d, "
           "budget %d tokens (%d blocks of %d, random ones in runs of %d)\n",
           ellm_isa_str(ellm_cpu_isa()), nt, N_LAYER, N_KV, N_HEAD, kvt == QTYPE_Q8_0 ? "q8_0" : "f16", depth, budget,
           want, BLOCK, run);
    for (int m = 0; m < 4; m++) {
        med[m] = median_sort(ms[m], reps);
        double tokens = m == 2 ? depth + 1 : budget;
        double bytes = tokens * (double)kv_cache_bytes_per_token(kv);
        printf("  %-10s %8.3f ms/step (median of %d)  %6.1f GB/s  (%.0f MB)\n", names[m], med[m], reps,
               bytes / (med[m] * 1e6), bytes / 1e6);
    }
    printf("  sparse / contiguous: %.2f   in-job / contiguous: %.2f\n", med[1] / med[0], med[3] / med[0]);
    return 0;
}
