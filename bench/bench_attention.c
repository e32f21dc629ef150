/* Decode attention throughput against context depth (not a test).
 *
 * Shape of SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads, head_dim 64,
 * F16 cache in blocks of 32 tokens. One "step" runs attention for every layer,
 * so the KV read per step (depth x bytes_per_token) is far larger than the L3
 * and comes from DRAM, as in a real decode step. Reports ms per step and GB/s
 * of KV read, next to a plain streaming-read bandwidth for comparison.
 *
 *   make bench && build/bench/bench_attention [n_q] [--no-pin]
 *     n_q: query tokens per step (default 1) */
#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "core/cpu.h"
#include "ellm.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kernels/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_LAYER 30
#define N_HEAD 9
#define N_KV 3
#define HEAD_DIM 64
#define BLOCK 32

int main(int argc, char **argv) {
    int n_q = 1, pin = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-pin")) pin = 0;
        else n_q = atoi(argv[i]);
    }
    if (n_q < 1 || n_q > 512) n_q = 1;
    const int depths[] = {4096, 16384, 32768};
    const int max_depth = depths[2] + n_q;
    kv_cache_params kp = {N_LAYER, N_KV, HEAD_DIM, max_depth, BLOCK, QTYPE_F16};
    kv_cache *kv;
    ellm_error err;
    if (kv_cache_init(&kp, &kv, &err) != ELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    /* Random K/V for every layer, written in chunks like a prefill would. */
    const int chunk = 512;
    size_t row = (size_t)N_KV * HEAD_DIM;
    float *k = malloc(chunk * row * sizeof(float)), *v = malloc(chunk * row * sizeof(float));
    unsigned seed = 1;
    for (size_t i = 0; i < chunk * row; i++) {
        seed = seed * 1103515245u + 12345u;
        k[i] = (float)((seed >> 9) & 0xffff) / 32768.0f - 1.0f;
        v[i] = -k[i] * 0.5f;
    }
    for (int l = 0; l < N_LAYER; l++)
        for (int pos = 0; pos < max_depth; pos += chunk) {
            int n = max_depth - pos < chunk ? max_depth - pos : chunk;
            kv_cache_store(kv, l, pos, n, k, v);
        }
    kv_cache_set_len(kv, max_depth);

    float *q = malloc((size_t)n_q * N_HEAD * HEAD_DIM * sizeof(float));
    float *out = malloc((size_t)n_q * N_HEAD * HEAD_DIM * sizeof(float));
    for (int i = 0; i < n_q * N_HEAD * HEAD_DIM; i++) q[i] = (float)(i % 7) * 0.1f - 0.3f;
    printf("attention decode bench: %s, SmolLM2-135M shape (%d layers, %d/%d heads, hd %d), "
           "F16 KV, n_q=%d, %.1f KB KV per token\n",
           ellm_isa_str(ellm_cpu_isa()), N_LAYER, N_HEAD, N_KV, HEAD_DIM, n_q,
           (double)kv_cache_bytes_per_token(kv) / 1024);

    for (int nt = 1; nt <= 2; nt++) {
        threadpool *pool;
        if (threadpool_init(nt, pin, &pool, &err) != ELLM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        attention_workspace *ws;
        if (attention_workspace_init(nt, n_q, N_HEAD, HEAD_DIM, max_depth, BLOCK, &ws, &err) !=
            ELLM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("threads %d: streaming read %.1f GB/s\n", nt,
               ellm_measure_read_gbps(nt, (size_t)1 << 30, 3));
        for (int di = 0; di < 3; di++) {
            int depth = depths[di];
            attention_args a = {kv, 0, n_q, depth, N_HEAD, q, out, 0.125f};
            double best = 1e30;
            int steps = depth <= 4096 ? 20 : 6;
            for (int s = 0; s < steps; s++) {
                double t0 = ellm_time_ms();
                for (int l = 0; l < N_LAYER; l++) {
                    a.layer = l;
                    attention_forward(&a, ws, pool);
                }
                double ms = ellm_time_ms() - t0;
                if (ms < best) best = ms;
            }
            double bytes = (double)(depth + n_q) * (double)kv_cache_bytes_per_token(kv);
            printf("  depth %5d: %7.3f ms/step  %6.1f GB/s KV read  (%.0f MB)\n", depth, best,
                   bytes / (best * 1e6), bytes / 1e6);
        }
        attention_workspace_free(ws);
        threadpool_free(pool);
    }
    free(q);
    free(out);
    free(k);
    free(v);
    kv_cache_free(kv);
    return 0;
}
