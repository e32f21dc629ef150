/* Cost of the rows of a dense attention call against their number (not a
 * test): what a speculative verify pass of n_q tokens pays in attention.
 *
 * Shape of SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64, blocks of 16
 * tokens). Two regimes:
 *   cache-resident: one layer of `--small` tokens (default 1024), called many
 *     times, so the KV stays in L2/L3 and the time is the arithmetic; reported
 *     as ns per (query row x KV block), a row being one query head of one token,
 *     and that rate scaled to the DRAM points' size (30 layers at each depth),
 *     the time the same passes would take if reading cost nothing (the "ms a
 *     step" of this regime is 200 calls of one small layer, not that size);
 *   DRAM: 30 layers at each of --depths (default 16384,32768), one call per
 *     layer per step (the KV read comes from memory, as in a real pass);
 *     reported as ms per step and the extra ms per token over n_q = 1.
 * With --kernel old|rows|both the multi-row kernel (attention_rows) is turned
 * off, on, or both measured alternately in one run.
 *
 *   make bench && build/bench/bench_attention_rows [-t N] [--kv f16|q8_0] [--nq 1,2,4,9]
 *       [--small TOKENS] [--depths 16384,32768] [--kernel both] */
#include "attention/attention.h"
#include "attention/attention_rows.h"
#include "attention/kv_cache.h"
#include "bench_kv.h"
#include "core/cpu.h"
#include "core/median.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "ellm.h"
#include "kernels/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_HEAD 9
#define N_KV 3
#define HEAD_DIM 64
#define BLOCK 16


static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

/* Median ms of `steps` steps, each one call per layer at depth - n_q. */
static double time_steps(kv_cache *kv, int n_layer, int depth, int n_q, int calls, int steps, const float *q,
                         float *out, attention_workspace *ws, threadpool *pool) {
    double ms[64];
    attention_args a = {kv, 0, n_q, depth - n_q, N_HEAD, q, out, 0.125f};
    for (int s = -1; s < steps; s++) {
        double t0 = ellm_time_ms();
        for (int c = 0; c < calls; c++)
            for (int l = 0; l < n_layer; l++) {
                a.layer = l;
                attention_forward(&a, ws, pool);
            }
        if (s >= 0) ms[s] = ellm_time_ms() - t0;
    }
    return median_sort(ms, steps);
}

int main(int argc, char **argv) {
    int nt = 2, type = QTYPE_F16, small = 1024, mode = 2;
    int nqs[16] = {1, 2, 3, 4, 6, 9}, n_nq = 6;
    int depths[8] = {16384, 32768}, n_depths = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) nt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) type = !strcmp(argv[++i], "q8_0") ? QTYPE_Q8_0 : QTYPE_F16;
        else if (!strcmp(argv[i], "--nq") && i + 1 < argc) n_nq = parse_list(argv[++i], nqs, 16);
        else if (!strcmp(argv[i], "--small") && i + 1 < argc) small = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depths") && i + 1 < argc) n_depths = parse_list(argv[++i], depths, 8);
        else if (!strcmp(argv[i], "--kernel") && i + 1 < argc) {
            i++;
            mode = !strcmp(argv[i], "old") ? 0 : !strcmp(argv[i], "rows") ? 1 : 2;
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (nt < 1 || nt > 64 || n_nq < 1) return 2;
    int max_nq = 1, max_depth = small;
    for (int i = 0; i < n_nq; i++)
        if (nqs[i] > max_nq) max_nq = nqs[i];
    for (int i = 0; i < n_depths; i++)
        if (depths[i] > max_depth) max_depth = depths[i];
    ellm_error err;
    threadpool *pool;
    attention_workspace *ws;
    if (threadpool_init(nt, 1, &pool, &err) != ELLM_OK ||
        attention_workspace_init(nt, max_nq, N_HEAD, HEAD_DIM, max_depth, BLOCK, &ws, &err) != ELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float *q = malloc((size_t)max_nq * N_HEAD * HEAD_DIM * sizeof(float));
    float *out = malloc((size_t)max_nq * N_HEAD * HEAD_DIM * sizeof(float));
    for (int i = 0; i < max_nq * N_HEAD * HEAD_DIM; i++) q[i] = (float)(i % 7) * 0.1f - 0.3f;
    printf("attention rows bench: %s, %s KV, %d threads, %d/%d heads, hd %d, blocks of %d\n",
           ellm_isa_str(ellm_cpu_isa()), type == QTYPE_F16 ? "F16" : "Q8_0", nt, N_HEAD, N_KV, HEAD_DIM, BLOCK);
    const int k0 = mode == 1 ? 1 : 0, k1 = mode == 0 ? 0 : 1;
    static const char *kname[] = {"old ", "rows"};

    kv_cache *kv = bench_kv_filled(type, 1, N_KV, HEAD_DIM, BLOCK, small, 0);
    if (!kv) return 1;
    const int calls = 200;
    printf("cache-resident, 1 layer, depth %d (%d calls a step):\n", small, calls);
    for (int i = 0; i < n_nq; i++)
        for (int k = k0; k <= k1; k++) {
            attention_rows_enable(k);
            double ms = time_steps(kv, 1, small, nqs[i], calls, 9, q, out, ws, pool);
            double row_blocks = (double)calls * nqs[i] * N_HEAD * ((small + BLOCK - 1) / BLOCK);
            const double ns_rb = ms * 1e6 / row_blocks;
            printf("  %s n_q %2d: %8.3f ms a step, %6.2f ns per row-block (x threads: %.2f)", kname[k], nqs[i], ms,
                   ns_rb, ns_rb * nt);
            /* the same arithmetic at the DRAM points' size, to set beside them */
            for (int di = 0; di < n_depths; di++)
                printf("%s %.2f ms at 30 x %d", di ? "," : "; that is", ns_rb * 1e-6 * nqs[i] * N_HEAD * 30.0 *
                                                     ((depths[di] + BLOCK - 1) / BLOCK), depths[di]);
            printf("\n");
        }
    kv_cache_free(kv);

    for (int di = 0; di < n_depths; di++) {
        kv = bench_kv_filled(type, 30, N_KV, HEAD_DIM, BLOCK, depths[di], 0);
        if (!kv) return 1;
        printf("DRAM, 30 layers, depth %d:\n", depths[di]);
        double base[2] = {0, 0};
        for (int i = 0; i < n_nq; i++)
            for (int k = k0; k <= k1; k++) {
                attention_rows_enable(k);
                double ms = time_steps(kv, 30, depths[di], nqs[i], 1, 7, q, out, ws, pool);
                if (i == 0) base[k] = ms;
                printf("  %s n_q %2d: %8.3f ms a step", kname[k], nqs[i], ms);
                if (i > 0 && nqs[0] == 1) printf(", +%.3f ms per token over n_q 1", (ms - base[k]) / (nqs[i] - 1));
                printf("\n");
            }
        kv_cache_free(kv);
    }
    attention_rows_enable(1);
    attention_workspace_free(ws);
    threadpool_free(pool);
    free(q);
    free(out);
    return 0;
}
