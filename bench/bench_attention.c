/* Decode attention throughput against context depth (not a test).
 *
 * Shape of SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads, head_dim 64,
 * cache in blocks of 16 tokens (the engine's). One "step" runs attention for
 * every layer, so the KV read per step (depth x bytes_per_token) is far larger
 * than the L3 and comes from DRAM, as in a real decode step. Reports the
 * median ms per step and GB/s of KV read, next to a plain streaming-read
 * bandwidth measured in the same run, for F16 and Q8_0 caches at each depth.
 *
 *   make bench && build/bench/bench_attention [n_q] [--no-pin] [-t N] [--kv f16|q8_0|both]
 *                                             [--depths LIST] [--ab-pairs] [--steps N]
 *                                             [--prefetch nta|l2]
 *     n_q: query tokens per step (default 1); -t: threads (default 1 and 2);
 *     --steps: timed steps per point (default 15 up to depth 4096, else 7; at
 *     most 1000: long runs for a profiler);
 *     --prefetch: how the decode kernels ask for the blocks ahead
 *     (attention_prefetch_nta; default: by CPU vendor);
 *     --ab-pairs: each point also without pair steps (attention_pairs_enable),
 *     alternating the two per step;
 *     --depths: comma list (default 4096,16384,32768); a depth whose cache fits in
 *     L3 (e.g. 1024: 24 MB) shows the kernel's rate with little DRAM traffic;
 *     --page-blocks N: KV blocks per cache page (default: what the engine gives
 *     a context of the deepest depth + n_q tokens with a pool of its own,
 *     kv_cache_own_page_blocks);
 *     --read-pass: each step is followed by three passes that read the same
 *     blocks of the first cache with no arithmetic (every 64-byte line
 *     loaded once), the rates these access patterns allow:
 *       order   one launch per layer, its parts (KV head, ATTN_PART_BLOCKS
 *               blocks) in the driver's page order (part c of every head
 *               before part c + 1), split in contiguous ranges over the
 *               threads, no software prefetch;
 *       ahead   the same, each block asking for the one
 *               attention_dense_look_ahead blocks ahead in its part, a line
 *               at a time, with the decode kernel's hint for the cache type
 *               (towards L2 for F16 and F32, non-temporal for Q8_0);
 *       stream  one launch for the whole step, each thread reading whole
 *               pages (every layer's blocks of them, adjacent in memory):
 *               the same bytes as one stream per thread, as if a step had
 *               no layers. */
#include "attention/attention.h"
#include "attention/attention_kernel.h"
#include "attention/kv_cache.h"
#include "bench_kv.h"
#include "core/cpu.h"
#include "ellm.h"
#include "core/threadpool.h"
#include "core/median.h"
#include "core/timer.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_LAYER 30
#define N_HEAD 9
#define N_KV 3
#define HEAD_DIM 64
#define BLOCK 16
#define MAX_STEPS 1000
#define MAX_DEPTHS 8

/* The read passes (--read-pass): see the top of the file. */
enum { READ_ORDER, READ_AHEAD, READ_STREAM, N_READ };
static const char *const read_names[N_READ] = {"order", "ahead", "stream"};

typedef struct {
    const kv_cache *kv;
    int layer, n_blocks, pattern;
    double sink[64];
} read_pass_job;

static uint64_t read_lines(const char *p, size_t n, uint64_t acc) {
    for (size_t o = 0; o < n; o += 64) {
        uint64_t x;
        memcpy(&x, p + o, sizeof x);
        acc += x;
    }
    return acc;
}

static void read_pass_task(void *arg, int ith, int nth) {
    read_pass_job *j = arg;
    const size_t block_bytes = kv_cache_block_bytes(j->kv);
    const int pb = kv_cache_page_tokens(j->kv) / BLOCK;
    uint64_t acc = 0;
    long b, e;
    if (j->pattern == READ_STREAM) {
        const int pages = (j->n_blocks + pb - 1) / pb;
        threadpool_split(pages, ith, nth, 1, &b, &e);
        for (long p = b; p < e; p++) {
            const int used = j->n_blocks - (int)p * pb < pb ? j->n_blocks - (int)p * pb : pb;
            for (int l = 0; l < N_LAYER; l++) /* (layer, head) runs of a page are adjacent */
                for (int h = 0; h < N_KV; h++)
                    acc = read_lines(kv_cache_block_k(j->kv, l, h, (int)p * pb), (size_t)used * block_bytes, acc);
        }
    } else {
        const int parts = (j->n_blocks + ATTN_PART_BLOCKS - 1) / ATTN_PART_BLOCKS;
        const int ahead = attention_dense_look_ahead(block_bytes);
        const int nta = kv_cache_get_params(j->kv)->type == QTYPE_Q8_0;
        threadpool_split((long)N_KV * parts, ith, nth, 1, &b, &e);
        for (long u = b; u < e; u++) {
            const int h = (int)(u % N_KV), k0 = (int)(u / N_KV) * ATTN_PART_BLOCKS;
            const int k1 = k0 + ATTN_PART_BLOCKS < j->n_blocks ? k0 + ATTN_PART_BLOCKS : j->n_blocks;
            for (int k = k0; k < k1; k++) {
                const char *blk = kv_cache_block_k(j->kv, j->layer, h, k);
                if (j->pattern == READ_AHEAD && k + ahead < k1) {
                    const char *pf = kv_cache_block_k(j->kv, j->layer, h, k + ahead);
                    if (nta)
                        for (size_t o = 0; o < block_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_NTA);
                    else
                        for (size_t o = 0; o < block_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T1);
                }
                acc = read_lines(blk, block_bytes, acc);
            }
        }
    }
    j->sink[ith % 64] += (double)acc;
}

int main(int argc, char **argv) {
    int n_q = 1, pin = 1, t_lo = 1, t_hi = 2, kv_f16 = 1, kv_q8 = 1, ab = 0, read_pass = 0, page_blocks = 0;
    int depths[MAX_DEPTHS] = {4096, 16384, 32768}, n_depths = 3, steps_arg = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-pin")) pin = 0;
        else if (!strcmp(argv[i], "--ab-pairs")) ab = 1;
        else if (!strcmp(argv[i], "--read-pass")) read_pass = 1;
        else if (!strcmp(argv[i], "--prefetch") && i + 1 < argc) {
            i++;
            if (strcmp(argv[i], "nta") && strcmp(argv[i], "l2")) {
                fprintf(stderr, "--prefetch: expected nta or l2\n");
                return 2;
            }
            attention_prefetch_nta(!strcmp(argv[i], "nta"));
        }
        else if (!strcmp(argv[i], "--page-blocks") && i + 1 < argc) {
            page_blocks = atoi(argv[++i]);
            if (page_blocks < 1 || page_blocks > 1024 || (page_blocks & (page_blocks - 1))) {
                fprintf(stderr, "--page-blocks: expected a power of two in 1..1024\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps_arg = atoi(argv[++i]);
            if (steps_arg < 1 || steps_arg > MAX_STEPS) {
                fprintf(stderr, "--steps: expected 1..%d\n", MAX_STEPS);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) t_lo = t_hi = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            i++;
            kv_f16 = !strcmp(argv[i], "f16") || !strcmp(argv[i], "both");
            kv_q8 = !strcmp(argv[i], "q8_0") || !strcmp(argv[i], "both");
        } else if (!strcmp(argv[i], "--depths") && i + 1 < argc) {
            n_depths = 0;
            for (char *t = strtok(argv[++i], ","); t && n_depths < MAX_DEPTHS; t = strtok(NULL, ","))
                if (atoi(t) > 0 && atoi(t) <= (1 << 20)) depths[n_depths++] = atoi(t);
            if (!n_depths) {
                fprintf(stderr, "--depths: expected a comma list of depths in 1..1048576\n");
                return 2;
            }
        } else n_q = atoi(argv[i]);
    }
    if (n_q < 1 || n_q > 512) n_q = 1;
    if (t_lo < 1 || t_lo > 64) t_lo = t_hi = 1;
    int max_depth = 0;
    for (int i = 0; i < n_depths; i++)
        if (depths[i] > max_depth) max_depth = depths[i];
    max_depth += n_q;
    if (!page_blocks) page_blocks = kv_cache_own_page_blocks(max_depth, BLOCK);
    kv_cache *kvs[2] = {kv_f16 ? bench_kv_filled(QTYPE_F16, N_LAYER, N_KV, HEAD_DIM, BLOCK, max_depth, page_blocks) : NULL,
                        kv_q8 ? bench_kv_filled(QTYPE_Q8_0, N_LAYER, N_KV, HEAD_DIM, BLOCK, max_depth, page_blocks) : NULL};
    const char *names[2] = {"F16 ", "Q8_0"};
    if ((kv_f16 && !kvs[0]) || (kv_q8 && !kvs[1])) return 1;

    float *q = malloc((size_t)n_q * N_HEAD * HEAD_DIM * sizeof(float));
    float *out = malloc((size_t)n_q * N_HEAD * HEAD_DIM * sizeof(float));
    for (int i = 0; i < n_q * N_HEAD * HEAD_DIM; i++) q[i] = (float)(i % 7) * 0.1f - 0.3f;
    printf("attention decode bench: %s, SmolLM2-135M shape (%d layers, %d/%d heads, hd %d), "
           "blocks of %d tokens in pages of %d, n_q=%d, blocks ahead prefetched %s\n",
           ellm_isa_str(ellm_cpu_isa()), N_LAYER, N_HEAD, N_KV, HEAD_DIM, BLOCK, page_blocks, n_q,
           attention_prefetch_nta_active() ? "non-temporally" : "towards L2");

    ellm_error err;
    for (int nt = t_lo; nt <= t_hi; nt++) {
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
        for (int di = 0; di < n_depths; di++) {
            int depth = depths[di];
            double ms_f16 = 0;
            for (int c = 0; c < 2; c++) {
                if (!kvs[c]) continue;
                attention_args a = {kvs[c], 0, n_q, depth, N_HEAD, q, out, 0.125f};
                static double ms[2][MAX_STEPS], ms_read[N_READ][MAX_STEPS];
                const int rp = read_pass && c == (kvs[0] ? 0 : 1);
                int steps = steps_arg ? steps_arg : depth <= 4096 ? 15 : 7;
                for (int s = -1; s < steps; s++) {
                    for (int v = 0; v <= ab; v++) { /* v = 1: pair steps off */
                        attention_pairs_enable(v == 0);
                        double t0 = ellm_time_ms();
                        for (int l = 0; l < N_LAYER; l++) {
                            a.layer = l;
                            attention_forward(&a, ws, pool);
                        }
                        if (s >= 0) ms[v][s] = ellm_time_ms() - t0; /* step -1 warms up */
                    }
                    for (int r = 0; rp && r < N_READ; r++) {
                        read_pass_job j = {.kv = kvs[c], .n_blocks = (depth + n_q + BLOCK - 1) / BLOCK, .pattern = r};
                        double t0 = ellm_time_ms();
                        if (r == READ_STREAM) threadpool_run(pool, read_pass_task, &j);
                        else
                            for (int l = 0; l < N_LAYER; l++) {
                                j.layer = l;
                                threadpool_run(pool, read_pass_task, &j);
                            }
                        if (s >= 0) ms_read[r][s] = ellm_time_ms() - t0;
                    }
                }
                attention_pairs_enable(1);
                double med = median_sort(ms[0], steps);
                double bytes = (double)(depth + n_q) * (double)kv_cache_bytes_per_token(kvs[c]);
                printf("  %s depth %5d: %7.3f ms/step (median of %d)  %6.1f GB/s KV read  (%.0f MB)", names[c],
                       depth, med, steps, bytes / (med * 1e6), bytes / 1e6);
                if (ab) {
                    double off = median_sort(ms[1], steps);
                    printf("  no pairs %7.3f ms (%.1f GB/s), pairs %.3fx", off, bytes / (off * 1e6), off / med);
                }
                for (int r = 0; rp && r < N_READ; r++) {
                    double rd = median_sort(ms_read[r], steps);
                    printf("  read %s %.3f ms (%.1f GB/s)", read_names[r], rd, bytes / (rd * 1e6));
                }
                if (c == 0) ms_f16 = med;
                if (c == 1 && ms_f16 > 0) printf("  %.2fx F16", ms_f16 / med);
                printf("\n");
            }
        }
        attention_workspace_free(ws);
        threadpool_free(pool);
    }
    free(q);
    free(out);
    for (int c = 0; c < 2; c++) kv_cache_free(kvs[c]);
    return 0;
}
