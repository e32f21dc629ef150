/* Small-batch matmul throughput: GOP/s of kern_matmul for several activation
 * rows at once (batched decode, speculative verification of K+1 tokens,
 * prefill chunks), against the int8 dot-product peak of this machine.
 * Not a test.
 *
 *   make bench && build/bench/bench_gemm [-m 135m,1b] [-n 1,2,4,8,9,16,128]
 *        [-t 1,2] [-r reps] [-i avx2|avx512] [-H] [-s] [type ...]   (default q8_0 q4_0 int4_g128;
 *        q8_0_r16, q4_0_r16, q5_0_r16, q4_K_r16, ...: the same weights interleaved by 16 rows, kern_r16_pack)
 *
 * peak   a tight loop of independent vpdpbusd (zmm, registers only) on each
 *        thread: 2 x 64 int8 ops per instruction. Also the F32 FMA peak.
 * layer  one transformer layer's matrices (Q, K, V, O, gate, up, down) of the
 *        model shape (135m: hidden 576, kv 192, ffn 1536; 1b: 2048, 512,
 *        8192), as distinct copies laid end to end to >= 96 MB so weights come
 *        from DRAM as in decode; the threads split each launch's rows as the
 *        engine does (Q/K/V and gate/up share a launch, 16-row units). The
 *        activations are prepared once per launch on the calling thread, as
 *        in the engine; that time is reported apart (prep) and included in
 *        the GOP/s. GOP = 2 * weights * rows / 1e9. -H: one copy of the layer
 *        multiplied again and again (from cache for the 135m shape: the
 *        kernels' compute ceiling).
 * -s     each matrix shape alone instead of the layer (cols x rows: d x d,
 *        d x kv, d x ffn, ffn x d and the output matrix d x vocab).
 * Each line gives the median wall time of `reps` passes (GOP/s of the
 * median and of the best pass) and GOP/s over the calling thread's CPU time
 * (time preempted does not count; the whole work only with -t 1). The
 * machine may be shared, so compare builds in one run, not across
 * sessions. */
#include "bench_util.h"
#include "core/cpu.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LIST = 16, TARGET_BYTES = 96 << 20, MAX_COPIES = 64 };

static int g_reps = 5;
static int g_hot = 0; /* -H: one copy of the layer, reused (cache-resident for small shapes) */

/* ---- peak ---- */

enum { PEAK_ITERS = 120000000 };

typedef struct {
    double gops[8];
    int fma;
} peak_job;

/* 12 independent register accumulators hide the instruction's latency at
 * 2 per cycle (written in asm so that no compiler keeps them on the stack). */
#define PEAK_12(op)                                                                                           \
    op " %%zmm12, %%zmm13, %%zmm0\n" op " %%zmm12, %%zmm13, %%zmm1\n" op " %%zmm12, %%zmm13, %%zmm2\n" op     \
       " %%zmm12, %%zmm13, %%zmm3\n" op " %%zmm12, %%zmm13, %%zmm4\n" op " %%zmm12, %%zmm13, %%zmm5\n" op    \
       " %%zmm12, %%zmm13, %%zmm6\n" op " %%zmm12, %%zmm13, %%zmm7\n" op " %%zmm12, %%zmm13, %%zmm8\n" op    \
       " %%zmm12, %%zmm13, %%zmm9\n" op " %%zmm12, %%zmm13, %%zmm10\n" op " %%zmm12, %%zmm13, %%zmm11\n"
#define PEAK_CLOBBER                                                                                          \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
        "xmm13"

static void peak_task(void *arg, int ith, int nth) {
    peak_job *j = arg;
    double t0 = ellm_time_ms();
    if (j->fma) {
        for (long it = 0; it < PEAK_ITERS / 12; it++) __asm__ volatile(PEAK_12("vfmadd231ps")::: PEAK_CLOBBER);
    } else {
        for (long it = 0; it < PEAK_ITERS / 12; it++) __asm__ volatile(PEAK_12("vpdpbusd")::: PEAK_CLOBBER);
    }
    double ms = ellm_time_ms() - t0;
    /* dpbusd: 64 multiplies + 64 adds; FMA: 16 x 2 flops */
    double ops = (double)(PEAK_ITERS / 12) * 12 * (j->fma ? 32.0 : 128.0);
    j->gops[ith] = ops / (ms / 1e3) / 1e9;
    (void)nth;
}

/* The best of 3 runs: on a shared machine a run can lose its core for a
 * while, and the peak is a property of the machine. */
static double peak(threadpool *pool, int fma) {
    double best = 0;
    for (int run = 0; run < 3; run++) {
        peak_job j = {.fma = fma};
        threadpool_run(pool, peak_task, &j);
        double s = 0;
        for (int i = 0; i < threadpool_size(pool); i++) s += j.gops[i];
        if (s > best) best = s;
    }
    return best;
}

/* ---- layer matmuls ---- */

typedef struct {
    const char *name;
    int64_t d, kv, ffn, vocab;
} model_shape;

static const model_shape SHAPES[] = {{"135m", 576, 192, 1536, 49152}, {"1b", 2048, 512, 8192, 128256}};
static int g_each = 0; /* -s: each matrix shape alone, the output matrix too */
static int g_r16 = 0;  /* types TYPE_r16 (kern_r16_type): weights packed 16 rows to a vector (kern_r16_pack) */

/* The type's name as given on the command line (with _r16 when packed). */
static const char *type_label(int type) {
    if (!g_r16) return qtype_get(type)->name;
    static char label[32];
    snprintf(label, sizeof label, "%s_r16", qtype_get(type)->name);
    return label;
}

/* One launch: up to 3 matrices with the same input, rows split as one. */
typedef struct {
    int n;
    int64_t rows[3], cols;
    const uint8_t *w[3];
    float *y[3];
    const void *act;
    int nb, type;
    int r16; /* weights packed by kern_r16_pack */
} launch;

static void launch_task(void *arg, int ith, int nth) {
    const launch *l = arg;
    int64_t total = 0;
    for (int i = 0; i < l->n; i++) total += l->rows[i];
    long b, e;
    threadpool_split((long)total, ith, nth, 16, &b, &e);
    int64_t base = 0;
    for (int i = 0; i < l->n; i++) {
        int64_t r0 = b - base, r1 = e - base;
        if (r0 < 0) r0 = 0;
        if (r1 > l->rows[i]) r1 = l->rows[i];
        if (r0 < r1 && l->r16) kern_matmul_r16(l->type, l->w[i], l->cols, r0, r1, l->act, l->nb, l->y[i], l->rows[i]);
        else if (r0 < r1) kern_matmul(l->type, l->w[i], l->cols, r0, r1, l->act, l->nb, l->y[i], l->rows[i]);
        base += l->rows[i];
    }
}

/* Random weights with small f16 scales (every block's fields set). */
static void fill_weights(int type, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = bench_rand();
        memcpy(w + i, &v, 8);
    }
    const qtype_info *t = qtype_get(type);
    uint16_t d = 0x1400; /* f16 ~ 0.001 */
    for (size_t off = 0; off + (size_t)t->block_bytes <= bytes; off += (size_t)t->block_bytes) {
        memcpy(w + off, &d, 2);
        if (type == QTYPE_INT4_G128) memcpy(w + off + 2, &d, 2);
    }
}

static void bench_layer(int type, const model_shape *s, const int *nbs, int n_nbs, const int *ths, int n_ths,
                        threadpool **pools, const double *peaks) {
    /* one layer: q k v | o | gate up | down */
    const int64_t mr[7] = {s->d, s->kv, s->kv, s->d, s->ffn, s->ffn, s->d};
    const int64_t mc[7] = {s->d, s->d, s->d, s->d, s->d, s->d, s->ffn};
    size_t mb[7], layer_bytes = 0;
    double layer_w = 0;
    for (int i = 0; i < 7; i++) {
        mb[i] = (qtype_row_bytes(type, mc[i]) * (size_t)mr[i] + 63) & ~(size_t)63;
        layer_bytes += mb[i];
        layer_w += (double)mr[i] * (double)mc[i];
    }
    int copies = (int)((TARGET_BYTES + layer_bytes - 1) / layer_bytes);
    if (copies < 1) copies = 1;
    if (copies > MAX_COPIES) copies = MAX_COPIES;
    size_t wbytes = layer_bytes * (size_t)(g_hot ? 1 : copies);
    uint8_t *W = aligned_alloc(64, wbytes);
    if (!W) return;
    fill_weights(type, W, wbytes);
    for (int c = 0; g_r16 && c < (g_hot ? 1 : copies); c++)
        for (int i = 0, off = 0; i < 7; off += (int)mb[i], i++)
            kern_r16_pack(type, W + (size_t)c * layer_bytes + off, W + (size_t)c * layer_bytes + off, mr[i], mc[i]);
    int max_nb = 0;
    for (int k = 0; k < n_nbs; k++)
        if (nbs[k] > max_nb) max_nb = nbs[k];
    float *X = malloc(sizeof(float) * (size_t)(s->ffn * max_nb));
    float *Y = malloc(sizeof(float) * (size_t)(s->ffn * max_nb) * 2 + 64);
    size_t act_max = kern_act_bytes(type, s->ffn, max_nb) + kern_act_bytes(type, s->d, max_nb);
    void *act = aligned_alloc(64, (act_max + 63) & ~(size_t)63);
    for (int64_t i = 0; i < s->ffn * max_nb; i++) X[i] = (float)(bench_rand() % 2001) / 1000.0f - 1.0f;
    for (int ti = 0; ti < n_ths; ti++) {
        threadpool *pool = pools[ti];
        for (int k = 0; k < n_nbs; k++) {
            int nb = nbs[k];
            /* fewer copies for big batches: compute-bound, and keeps a pass short */
            int nc = copies;
            while (nc > 1 && (double)nc * layer_w * 2 * nb > 4e10) nc--;
            double t[64], tp[64], tc[64];
            int reps = g_reps < 64 ? g_reps : 64;
            for (int rep = -1; rep < reps; rep++) {
                if (rep >= reps) break;
                double prep = 0, t0 = ellm_time_ms(), c0 = bench_thread_ms();
                for (int c = 0; c < nc; c++) {
                    const uint8_t *base = W + (size_t)(g_hot ? 0 : c) * layer_bytes;
                    const uint8_t *m[7];
                    size_t off = 0;
                    for (int i = 0; i < 7; i++) m[i] = base + off, off += mb[i];
                    /* q k v, o, gate up, down: as the engine's launches */
                    const int groups[4][4] = {{3, 0, 1, 2}, {1, 3}, {2, 4, 5}, {1, 6}};
                    for (int g = 0; g < 4; g++) {
                        launch l = {.n = groups[g][0], .nb = nb, .type = type, .act = act, .r16 = g_r16};
                        l.cols = mc[groups[g][1]];
                        float *y = Y;
                        for (int i = 0; i < l.n; i++) {
                            int mi = groups[g][1 + i];
                            l.rows[i] = mr[mi];
                            l.w[i] = m[mi];
                            l.y[i] = y;
                            y += mr[mi] * nb;
                            if (y > Y + s->ffn * max_nb * 2) y = Y;
                        }
                        double p0 = ellm_time_ms();
                        kern_act_prepare(type, X, l.cols, nb, act);
                        prep += ellm_time_ms() - p0;
                        threadpool_run(pool, launch_task, &l);
                    }
                }
                if (rep >= 0) t[rep] = ellm_time_ms() - t0, tp[rep] = prep, tc[rep] = bench_thread_ms() - c0;
            }
            double med = bench_median(t, reps), medp = bench_median(tp, reps), best = t[0];
            double gop = 2.0 * layer_w * nc * nb / 1e9;
            double gops = gop / (med / 1e3), gops_best = gop / (best / 1e3);
            double gops_cpu = gop / (bench_median(tc, reps) / 1e3);
            printf("%-9s %-4s %-6s nb=%-4d t=%d  %8.3f ms/layer  prep %5.1f%%  %7.1f GOP/s (best %7.1f)  %5.1f%% of VNNI "
                   "peak  %6.2f GB/s weights  cpu %7.1f GOP/s (thread 0)\n",
                   type_label(type), s->name, ellm_isa_str(ellm_cpu_isa()), nb, ths[ti], med / nc,
                   100.0 * medp / med, gops, gops_best, 100.0 * gops / peaks[ti],
                   (double)layer_bytes * nc / 1e9 / (med / 1e3), gops_cpu);
            fflush(stdout);
        }
    }
    free(act);
    free(X);
    free(Y);
    free(W);
}

/* -s: each distinct matrix shape of the model alone (rows x cols: d x d,
 * kv x d, ffn x d, d x ffn, vocab x d), its rows split over the threads as
 * the engine splits one matrix. Weights: copies laid end to end to >= 96 MB
 * (from DRAM), or one copy with -H. */
static void bench_each(int type, const model_shape *s, const int *nbs, int n_nbs, const int *ths, int n_ths,
                       threadpool **pools, const double *peaks) {
    const int64_t mr[5] = {s->d, s->kv, s->ffn, s->d, s->vocab};
    const int64_t mc[5] = {s->d, s->d, s->d, s->ffn, s->d};
    int max_nb = 0;
    for (int k = 0; k < n_nbs; k++)
        if (nbs[k] > max_nb) max_nb = nbs[k];
    for (int mi = 0; mi < 5; mi++) {
        size_t mb = (qtype_row_bytes(type, mc[mi]) * (size_t)mr[mi] + 63) & ~(size_t)63;
        int copies = (int)((TARGET_BYTES + mb - 1) / mb);
        if (copies < 1 || g_hot) copies = 1;
        if (copies > MAX_COPIES) copies = MAX_COPIES;
        uint8_t *W = aligned_alloc(64, mb * (size_t)copies);
        float *X = malloc(sizeof(float) * (size_t)(mc[mi] * max_nb));
        float *Y = malloc(sizeof(float) * (size_t)(mr[mi] * max_nb));
        void *act = aligned_alloc(64, (kern_act_bytes(type, mc[mi], max_nb) + 63) & ~(size_t)63);
        if (!W || !X || !Y || !act) {
            free(W), free(X), free(Y), free(act);
            return;
        }
        fill_weights(type, W, mb * (size_t)copies);
        for (int c = 0; g_r16 && c < copies; c++) kern_r16_pack(type, W + (size_t)c * mb, W + (size_t)c * mb, mr[mi], mc[mi]);
        for (int64_t i = 0; i < mc[mi] * max_nb; i++) X[i] = (float)(bench_rand() % 2001) / 1000.0f - 1.0f;
        for (int ti = 0; ti < n_ths; ti++)
            for (int k = 0; k < n_nbs; k++) {
                int nb = nbs[k];
                kern_act_prepare(type, X, mc[mi], nb, act);
                int reps = g_reps < 64 ? g_reps : 64;
                double t[64] = {0};
                for (int rep = -1; rep < reps; rep++) {
                    double t0 = ellm_time_ms();
                    for (int c = 0; c < copies; c++) {
                        launch l = {.n = 1, .nb = nb, .type = type, .act = act, .cols = mc[mi], .r16 = g_r16};
                        l.rows[0] = mr[mi];
                        l.w[0] = W + (size_t)c * mb;
                        l.y[0] = Y;
                        threadpool_run(pools[ti], launch_task, &l);
                    }
                    if (rep >= 0) t[rep] = (ellm_time_ms() - t0) / copies;
                }
                double best = t[0];
                for (int r = 1; r < reps; r++)
                    if (t[r] < best) best = t[r];
                double med = bench_median(t, reps), gop = 2.0 * (double)mr[mi] * (double)mc[mi] * nb / 1e9;
                printf("%-9s %-4s %-6s %5lldx%-6lld nb=%-4d t=%d  %8.3f ms  %7.1f GOP/s (best %7.1f)  %5.1f%% of VNNI "
                       "peak\n",
                       type_label(type), s->name, ellm_isa_str(ellm_cpu_isa()), (long long)mc[mi],
                       (long long)mr[mi], nb, ths[ti], med, gop / (med / 1e3), gop / (best / 1e3),
                       100.0 * gop / (med / 1e3) / peaks[ti]);
                fflush(stdout);
            }
        free(W), free(X), free(Y), free(act);
    }
}

static int parse_list(const char *s, int *out, int max, int lo, int hi) {
    int n = 0;
    for (const char *p = s; *p && n < max;) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p || v < lo || v > hi) return -1;
        out[n++] = (int)v;
        p = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return -1;
    }
    return n;
}

int main(int argc, char **argv) {
    int nbs[MAX_LIST] = {1, 2, 4, 8, 9, 16, 128}, n_nbs = 7;
    int ths[4] = {1, 2}, n_ths = 2;
    const char *models = "135m,1b", *types[8];
    int n_types = 0, isa = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) n_nbs = parse_list(argv[++i], nbs, MAX_LIST, 1, 1024);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) n_ths = parse_list(argv[++i], ths, 4, 1, 8);
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) models = argv[++i];
        else if (!strcmp(argv[i], "-H")) g_hot = 1;
        else if (!strcmp(argv[i], "-s")) g_each = 1;
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) g_reps = atoi(argv[++i]) < 1 ? 1 : atoi(argv[i]);
        else if (!strcmp(argv[i], "-i") && i + 1 < argc) {
            const char *v = argv[++i];
            for (int k = ELLM_ISA_SCALAR; k <= ELLM_ISA_AVX512; k++)
                if (!strcmp(v, ellm_isa_str((ellm_isa)k))) isa = k;
        } else if (n_types < 8) types[n_types++] = argv[i];
    }
    if (n_nbs <= 0 || n_ths <= 0) {
        fprintf(stderr, "bad -n or -t list\n");
        return 2;
    }
    if (isa >= 0 && !ellm_cpu_set_isa((ellm_isa)isa)) {
        fprintf(stderr, "this CPU cannot run %s\n", ellm_isa_str((ellm_isa)isa));
        return 2;
    }
    if (n_types == 0) types[0] = "q8_0", types[1] = "q4_0", types[2] = "int4_g128", n_types = 3;
    threadpool *pools[4];
    double peaks[4];
    for (int ti = 0; ti < n_ths; ti++) {
        ellm_error err;
        if (threadpool_init(ths[ti], 1, &pools[ti], &err) != ELLM_OK) {
            fprintf(stderr, "threadpool: %s\n", err.msg);
            return 1;
        }
        if (ellm_cpu()->avx512vnni) {
            peaks[ti] = peak(pools[ti], 0);
            printf("peak      vpdpbusd zmm  t=%d  %7.1f GOP/s    F32 FMA zmm %7.1f GFLOP/s\n", ths[ti], peaks[ti],
                   peak(pools[ti], 1));
        } else {
            peaks[ti] = 1e30;
        }
    }
    for (int i = 0; i < n_types; i++) {
        int type = -1;
        const size_t len = strlen(types[i]);
        g_r16 = len > 4 && !strcmp(types[i] + len - 4, "_r16");
        for (int t = 0; t < QTYPE_COUNT; t++)
            if (qtype_get(t) && strlen(qtype_get(t)->name) == len - (g_r16 ? 4 : 0) &&
                !strncmp(qtype_get(t)->name, types[i], len - (g_r16 ? 4 : 0)))
                type = t;
        if (g_r16 && type >= 0 && !kern_r16_type(type)) type = -1;
        if (type < 0 || kern_act_bytes(type, 2048, 1) == 0) {
            fprintf(stderr, "unknown or unsupported type %s\n", types[i]);
            continue;
        }
        for (size_t m = 0; m < sizeof SHAPES / sizeof SHAPES[0]; m++)
            if (strstr(models, SHAPES[m].name) && kern_act_bytes(type, SHAPES[m].d, 1) &&
                kern_act_bytes(type, SHAPES[m].ffn, 1)) /* int4_g128 needs 128 | d: not the 135m shape */
                (g_each ? bench_each : bench_layer)(type, &SHAPES[m], nbs, n_nbs, ths, n_ths, pools, peaks);
    }
    for (int ti = 0; ti < n_ths; ti++) threadpool_free(pools[ti]);
    return 0;
}
