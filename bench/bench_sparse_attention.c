/* Sparse-attention read efficiency (not a test).
 *
 * Shape of SmolLM2-135M (30 layers, 9 query heads, 3 KV heads, head_dim 64,
 * F16 cache in blocks of 16 tokens). One "step" runs decode attention for
 * every layer. Three kinds of step are timed, interleaved, with the caches
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
 *   bench_sparse_attention [threads] [depth] [budget] [reps] */
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

#define N_LAYER 30
#define N_HEAD 9
#define N_KV 3
#define HEAD_DIM 64
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
 * `want`, ascending (as sparse_index_select returns them). */
static int choose(int32_t *out, int n_blocks, int want, int window) {
    char *taken = calloc((size_t)n_blocks, 1);
    int n = 0;
    taken[0] = 1;
    out[n++] = 0;
    for (int b = n_blocks - window; b < n_blocks; b++)
        if (b > 0 && !taken[b]) taken[b] = 1, out[n++] = b;
    while (n < want) {
        int b = (int)(bench_rand() % (uint64_t)n_blocks);
        if (!taken[b]) taken[b] = 1, out[n++] = b;
    }
    free(taken);
    qsort(out, (size_t)n, sizeof *out, cmp_i32);
    return n;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 2;
    int depth = argc > 2 ? atoi(argv[2]) : 32768;
    int budget = argc > 3 ? atoi(argv[3]) : 2048;
    int reps = argc > 4 ? atoi(argv[4]) : 21;
    if (nt < 1 || depth < BLOCK || budget < BLOCK || budget > depth || reps < 1) {
        fprintf(stderr, "usage: bench_sparse_attention [threads] [depth] [budget <= depth] [reps]\n");
        return 2;
    }
    kv_cache_params kp = {N_LAYER, N_KV, HEAD_DIM, depth + 1, BLOCK, QTYPE_F16, 0};
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
    int n_sel[N_LAYER][N_KV];
    for (int l = 0; l < N_LAYER; l++)
        for (int h = 0; h < N_KV; h++)
            n_sel[l][h] = choose(blocks + ((size_t)l * N_KV + h) * n_blocks, n_blocks, want, 4);

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
    printf("sparse attention read: %s, %d threads, depth %d, budget %d tokens (%d blocks of %d)\n",
           ellm_isa_str(ellm_cpu_isa()), nt, depth, budget, want, BLOCK);
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
