/* Sparse KV index: selection time per decode step and summary bytes read, at
 * 32K and 128K tokens of synthetic keys (not a test).
 *
 * Shape of SmolLM2-135M: 30 layers, 3 KV heads of 3 query heads, head_dim 64,
 * blocks of 16 tokens (as the engine), super-blocks of 16 blocks; budget 2048 tokens, one sink
 * block, a 64-token window. One step selects for every (layer, KV head) with a
 * fresh random query, on one core. Keys are i.i.d. random, the hard case for
 * the bounds: every super-block looks alike, so no search stops early and each
 * selection expands the full cap. "cold" evicts the caches before each step
 * (as streaming the KV cache does in a real step), "hot" does not. Also times
 * the append of one token to all layers (the index's share of a decode step).
 *
 *   make bench && build/bench/bench_sparse [steps] [expand]      (default 20 steps, expand 2; ELLM_ISA=avx2|scalar to force) */
#include "bench_util.h"
#include "attention/sparse_index.h"
#include "core/cpu.h"
#include "core/timer.h"
#include "kernels/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_LAYER 30
#define N_KV 3
#define GROUP 3
#define HEAD_DIM 64
#define BLOCK 16
#define BUDGET 2048
#define POOL_FLOATS (1 << 22) /* random keys are windows of this pool */
#define EVICT_BYTES (96u << 20)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static volatile unsigned char g_sink;

/* Reads a buffer larger than the L3 so the index is not cached (reads only,
 * as streaming the KV cache does, so no write-backs overlap the timing). */
static void evict(const unsigned char *buf) {
    unsigned char acc = 0;
    for (size_t i = 0; i < EVICT_BYTES; i += 64) acc ^= buf[i];
    g_sink = acc;
}

static void run(int n_ctx, int steps, float expand, const float *pool, const unsigned char *ebuf) {
    sparse_index_params p = {N_LAYER, N_KV, HEAD_DIM, n_ctx + 64, BLOCK, 16, QTYPE_F16, expand};
    sparse_index *idx = NULL;
    ellm_error err;
    if (sparse_index_init(&p, &idx, &err) != ELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    /* Fill: chunks of 512 tokens, keys taken from random offsets of the pool. */
    const int chunk = 512, row = N_KV * HEAD_DIM;
    double t0 = ellm_time_ms();
    for (int l = 0; l < N_LAYER; l++)
        for (int pos = 0; pos < n_ctx; pos += chunk) {
            size_t off = (size_t)((unsigned)(frand() * 1e9f) % (POOL_FLOATS - chunk * row));
            sparse_index_append(idx, l, pos, chunk, pool + off);
        }
    double fill_ms = ellm_time_ms() - t0;

    static float q[N_LAYER][GROUP * N_KV * HEAD_DIM];
    int32_t blocks[BUDGET / BLOCK + 1];
    double t_step[2][256];
    sparse_select_stats st = {0};
    for (int mode = 0; mode < 2; mode++)
        for (int s = 0; s < steps; s++) {
            for (int l = 0; l < N_LAYER; l++)
                for (int i = 0; i < GROUP * N_KV * HEAD_DIM; i++) q[l][i] = frand();
            if (mode) evict(ebuf);
            double a = bench_thread_ms();
            for (int l = 0; l < N_LAYER; l++) {
                for (int h = 0; h < N_KV; h++) {
                    int n;
                    sparse_index_select(idx, l, h, q[l], 1, GROUP, n_ctx, BUDGET, 1, 64, blocks, &n,
                                        mode ? NULL : &st);
                }
            }
            t_step[mode][s] = bench_thread_ms() - a;
        }
    /* Medians: the machine may be shared, and a median ignores the steps
     * another process interrupted. */
    double hot = bench_median(t_step[0], steps) * steps, cold = bench_median(t_step[1], steps) * steps;
    /* Appending one decode token to every layer (positions n_ctx, n_ctx + 1, ...). */
    const int n_app = steps < 64 ? steps : 64;
    double a = bench_thread_ms();
    for (int s = 0; s < n_app; s++)
        for (int l = 0; l < N_LAYER; l++)
            sparse_index_append(idx, l, n_ctx + s, 1, pool + (size_t)row * (s * N_LAYER + l));
    double app = (bench_thread_ms() - a) / n_app;
    const double per_sel = (double)st.bytes_read / (double)st.calls;
    printf("depth %6d: select %.3f ms/step hot, %.3f ms/step cold (medians; %d selections, %.2f us each cold)\n",
           n_ctx, hot / steps, cold / steps, N_LAYER * N_KV, 1e3 * cold / steps / (N_LAYER * N_KV));
    printf("              summary bytes read %.1f KB/selection = %.1f%% of a flat scan (%.1f KB); "
           "%.1f super-blocks expanded; %.2f MB/step\n",
           per_sel / 1024, 100.0 * (double)st.bytes_read / (double)st.flat_bytes,
           (double)st.flat_bytes / st.calls / 1024, (double)st.superblocks_expanded / st.calls,
           per_sel * N_LAYER * N_KV / 1e6);
    printf("              append 1 token x %d layers %.1f us; fill %.0f ms; index %.1f MB\n", N_LAYER,
           app * 1e3, fill_ms, (double)sparse_index_bytes(idx) / 1e6);
    sparse_index_free(idx);
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    float expand = argc > 2 ? (float)atof(argv[2]) : 2.0f;
    if (steps < 1) steps = 1;
    if (steps > 256) steps = 256;
    float *pool = malloc((size_t)POOL_FLOATS * sizeof(float));
    unsigned char *ebuf = malloc(EVICT_BYTES);
    if (!pool || !ebuf) return 1;
    for (size_t i = 0; i < POOL_FLOATS; i++) pool[i] = frand() * 2.0f;
    memset(ebuf, 1, EVICT_BYTES);
    printf("ISA %s, %d layers x %d KV heads (group %d), head_dim %d, blocks of %d, budget %d, expand %g\n",
           ellm_isa_str(ellm_cpu_isa()), N_LAYER, N_KV, GROUP, HEAD_DIM, BLOCK, BUDGET,
           (double)expand);
    run(32768, steps, expand, pool, ebuf);
    run(131072, steps, expand, pool, ebuf);
    free(pool);
    free(ebuf);
    return 0;
}
