/* Micro-benchmark of kern_matmul: GB/s of weights streamed from DRAM,
 * single-threaded, for each weight type at AVX2 and at the best ISA this CPU
 * runs (or the one -i names, scalar included). Not a test.
 *
 * Sections (-s, comma-separated; default all):
 *   big    one ~140 MB matrix with 4096 columns (long rows).
 *   shape  one model-sized matrix at a time (SmolLM2-135M shapes: 576 x 576,
 *          192 x 576, 1536 x 576, 576 x 1536, 49152 x 576), as distinct
 *          copies laid end to end to ~140 MB and multiplied one after the
 *          other, so every copy comes from DRAM as in decode.
 *   model  one decode step of a SmolLM2-135M-shaped model: per layer Q, K, V,
 *          O, gate, up, down (30 layers) and the 49152 x 576 output matrix,
 *          contiguous like a mapped GGUF file (~143 MB at Q8_0).
 *   hot    one matrix under 1 MB (1536 x 576, 216 x 4096 for long rows and
 *          432 x 2048 for rows as long as Llama-3.2-1B's)
 *          multiplied again and again from L2: the compute ceiling of the
 *          kernel, with no DRAM in the way.
 * K-quants need columns that are multiples of 256, so for them the same
 * layouts use d = 768, kv = 256, ffn = 2048, vocab = 32000.
 *
 *   make bench && build/bench/bench_kernels [-s big,shape,model,hot] [-n 1,8] [-i avx512] [-r reps] [type ...]
 *      (types by name: q8_0 q4_0 q4_K q6_K f16 bf16 f32; default q8_0 q4_0 q4_K q6_K f16)
 * Each line gives GB/s over the median wall time, the median thread CPU time
 * and the best CPU time of `reps` runs (the machine may be shared: compare
 * builds in alternating runs, not across sessions). */
#include "bench_util.h"
#include "core/cpu.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TARGET_BYTES = 140 << 20, MAX_MATS = 8192, MAX_NB = 256 };

static int g_reps = 7;

/* Random bytes with every block's f16 scale fields set to a small value. */
static void fill_weights(int type, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = bench_rand();
        memcpy(w + i, &v, 8);
    }
    const qtype_info *t = qtype_get(type);
    if (t->block_elems == 1) { /* floats: keep them finite, about +-1 */
        if (type == QTYPE_F32)
            for (size_t i = 0; i < bytes / 4; i++) ((float *)w)[i] = (float)(bench_rand() % 2001) / 1000.0f - 1.0f;
        else
            for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)w)[i] &= type == QTYPE_F16 ? 0xBBFF : 0xBF7F;
        return;
    }
    uint16_t d = 0x1400; /* f16 ~ 0.001 */
    for (size_t off = 0; off + (size_t)t->block_bytes <= bytes; off += (size_t)t->block_bytes) {
        if (type == QTYPE_Q6_K) memcpy(w + off + 208, &d, 2);
        else memcpy(w + off, &d, 2);
        if (type == QTYPE_Q4_K) memcpy(w + off + 2, &d, 2);
    }
}

/* A list of matrices multiplied in order, all inside one weight buffer. */
typedef struct {
    int n;
    int64_t rows[MAX_MATS], cols[MAX_MATS];
    size_t off[MAX_MATS];
    size_t bytes;
} mat_list;

static void list_add(mat_list *l, int type, int64_t rows, int64_t cols) {
    if (l->n == MAX_MATS) return;
    l->rows[l->n] = rows;
    l->cols[l->n] = cols;
    l->off[l->n] = l->bytes;
    l->bytes += (qtype_row_bytes(type, cols) * (size_t)rows + 31) & ~(size_t)31; /* GGUF alignment */
    l->n++;
}

typedef struct {
    int64_t d, kv, ffn, vocab;
} model_shape;

static model_shape shape_for(int type) {
    if (qtype_get(type)->block_elems == 256) return (model_shape){768, 256, 2048, 32000};
    return (model_shape){576, 192, 1536, 49152}; /* SmolLM2-135M */
}

/* Multiplies every matrix of `l` at nb and prints GB/s of weights. */
static void run_list(const char *label, int type, const mat_list *l, int nb) {
    uint8_t *W = malloc(l->bytes);
    if (!W) return;
    fill_weights(type, W, l->bytes);
    int64_t max_rows = 0, max_cols = 0;
    for (int i = 0; i < l->n; i++) {
        if (l->rows[i] > max_rows) max_rows = l->rows[i];
        if (l->cols[i] > max_cols) max_cols = l->cols[i];
    }
    /* prepared activations for each distinct column count */
    int64_t act_cols[4];
    void *act[4];
    int n_act = 0;
    for (int i = 0; i < l->n; i++) {
        int j;
        for (j = 0; j < n_act; j++)
            if (act_cols[j] == l->cols[i]) break;
        if (j < n_act || n_act == 4) continue;
        act_cols[n_act] = l->cols[i];
        float *X = malloc(sizeof(float) * (size_t)(l->cols[i] * nb));
        for (int64_t c = 0; c < l->cols[i] * nb; c++) X[c] = (float)(bench_rand() % 2001) / 1000.0f - 1.0f;
        act[n_act] = aligned_alloc(64, (kern_act_bytes(type, l->cols[i], nb) + 63) & ~(size_t)63); /* as the engine's */
        kern_act_prepare(type, X, l->cols[i], nb, act[n_act]);
        free(X);
        n_act++;
    }
    float *Y = malloc(sizeof(float) * (size_t)(max_rows * nb));
    double t[64] = {0}, c[64] = {0};
    int reps = g_reps < 64 ? g_reps : 64;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = ellm_time_ms(), c0 = bench_thread_ms();
        for (int i = 0; i < l->n; i++) {
            int j = 0;
            while (act_cols[j] != l->cols[i]) j++;
            kern_matmul(type, W + l->off[i], l->cols[i], 0, l->rows[i], act[j], nb, Y, l->rows[i]);
        }
        t[rep] = ellm_time_ms() - t0;
        c[rep] = bench_thread_ms() - c0;
    }
    double best_cpu = c[0];
    for (int rep = 1; rep < reps; rep++)
        if (c[rep] < best_cpu) best_cpu = c[rep];
    double med = bench_median(t, reps), med_cpu = bench_median(c, reps);
    double gb = 0;
    for (int i = 0; i < l->n; i++) gb += (double)qtype_row_bytes(type, l->cols[i]) * (double)l->rows[i];
    gb /= 1e9;
    printf("%-5s %-6s %-18s nb=%-3d %8.2f ms  GB/s: %6.2f wall  %6.2f cpu  %6.2f best cpu\n",
           qtype_get(type)->name, ellm_isa_str(ellm_cpu_isa()), label, nb, med, gb / (med / 1e3),
           gb / (med_cpu / 1e3), gb / (best_cpu / 1e3));
    fflush(stdout);
    for (int j = 0; j < n_act; j++) free(act[j]);
    free(Y);
    free(W);
}

/* Copies of one rows x cols matrix end to end, ~TARGET_BYTES in all. */
static void list_copies(mat_list *l, int type, int64_t rows, int64_t cols) {
    size_t one = qtype_row_bytes(type, cols) * (size_t)rows;
    int n = (int)(TARGET_BYTES / one);
    if (n < 1) n = 1;
    if (n > MAX_MATS) n = MAX_MATS;
    for (int i = 0; i < n; i++) list_add(l, type, rows, cols);
}

static void bench_type(int type, const char *sections, const int *nbs, int n_nbs, int isa_lo, int isa_hi) {
    model_shape s = shape_for(type);
    for (int isa = isa_lo; isa <= isa_hi; isa++) {
        if (!ellm_cpu_set_isa((ellm_isa)isa)) continue;
        for (int k = 0; k < n_nbs; k++) {
            int nb = nbs[k];
            static mat_list l;
            char label[64];
            if (strstr(sections, "big")) {
                memset(&l, 0, sizeof l);
                int64_t cols = 4096;
                list_add(&l, type, TARGET_BYTES / (int64_t)qtype_row_bytes(type, cols), cols);
                run_list("big x4096", type, &l, nb);
            }
            if (strstr(sections, "shape")) {
                int64_t shp[5][2] = {{s.d, s.d}, {s.kv, s.d}, {s.ffn, s.d}, {s.d, s.ffn}, {s.vocab, s.d}};
                for (int i = 0; i < 5; i++) {
                    memset(&l, 0, sizeof l);
                    list_copies(&l, type, shp[i][0], shp[i][1]);
                    snprintf(label, sizeof label, "%lldx%lld", (long long)shp[i][0], (long long)shp[i][1]);
                    run_list(label, type, &l, nb);
                }
            }
            if (strstr(sections, "hot")) {
                /* the third: rows of 2048 columns, as Llama-3.2-1B's output matrix */
                int64_t shp[3][2] = {{s.ffn, s.d}, {1536 * 576 / 4096, 4096}, {1536 * 576 / 2048, 2048}};
                for (int i = 0; i < 3; i++) {
                    memset(&l, 0, sizeof l);
                    list_add(&l, type, shp[i][0], shp[i][1]);
                    size_t one = l.bytes;
                    while (l.n < MAX_MATS && (size_t)l.n * one < TARGET_BYTES) {
                        l.rows[l.n] = shp[i][0], l.cols[l.n] = shp[i][1], l.off[l.n] = 0;
                        l.n++;
                    }
                    snprintf(label, sizeof label, "hot %lldx%lld", (long long)shp[i][0], (long long)shp[i][1]);
                    run_list(label, type, &l, nb);
                }
            }
            if (strstr(sections, "model")) {
                memset(&l, 0, sizeof l);
                for (int layer = 0; layer < 30; layer++) {
                    list_add(&l, type, s.d, s.d);    /* q */
                    list_add(&l, type, s.kv, s.d);   /* k */
                    list_add(&l, type, s.kv, s.d);   /* v */
                    list_add(&l, type, s.d, s.d);    /* o */
                    list_add(&l, type, s.ffn, s.d);  /* gate */
                    list_add(&l, type, s.ffn, s.d);  /* up */
                    list_add(&l, type, s.d, s.ffn);  /* down */
                }
                list_add(&l, type, s.vocab, s.d); /* output */
                snprintf(label, sizeof label, "model d=%lld", (long long)s.d);
                run_list(label, type, &l, nb);
            }
        }
    }
}

/* XOR of the buffer in 64-byte vectors (the read loop of core/membw.c). */
__attribute__((target("avx512f"))) static uint64_t read_avx512(const char *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}

/* Plain read bandwidth for reference, over 4 KB pages like the weights (the
 * engine maps the model file without huge pages). */
static void bench_read(void) {
    size_t bytes = TARGET_BYTES;
    char *buf = aligned_alloc(64, bytes);
    if (!buf) return;
    memset(buf, 1, bytes);
    double t[64];
    int reps = g_reps < 64 ? g_reps : 64;
    uint64_t s = 0;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = ellm_time_ms();
        s += ellm_cpu()->avx512f ? read_avx512(buf, bytes) : (uint64_t)buf[rep];
        t[rep] = ellm_time_ms() - t0;
    }
    double med = bench_median(t, reps);
    printf("read  avx512 xor                          %8.2f ms  %6.2f GB/s median  (checksum %llu)\n", med,
           bytes / 1e9 / (med / 1e3), (unsigned long long)(s & 0xff));
    free(buf);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *sections = "big,shape,model,hot";
    int nbs[16] = {1, 8}, n_nbs = 2;
    int isa_lo = ELLM_ISA_AVX2, isa_hi = (int)ellm_cpu()->best;
    const char *types[16];
    int n_types = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            sections = argv[++i];
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            n_nbs = 0;
            for (char *p = argv[++i]; *p && n_nbs < 16;) {
                int v = (int)strtol(p, &p, 10);
                if (v >= 1 && v <= MAX_NB) nbs[n_nbs++] = v;
                if (*p == ',') p++;
                else break;
            }
        } else if (!strcmp(argv[i], "-i") && i + 1 < argc) {
            const char *s = argv[++i];
            for (int isa = ELLM_ISA_SCALAR; isa <= ELLM_ISA_AVX512; isa++)
                if (!strcmp(s, ellm_isa_str((ellm_isa)isa))) isa_lo = isa_hi = isa;
        } else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            g_reps = atoi(argv[++i]);
            if (g_reps < 1) g_reps = 1;
        } else if (n_types < 16) {
            types[n_types++] = argv[i];
        }
    }
    if (n_types == 0) {
        const char *def[] = {"q8_0", "q4_0", "q4_K", "q6_K", "f16"};
        for (int i = 0; i < 5; i++) types[n_types++] = def[i];
    }
    bench_read();
    for (int i = 0; i < n_types; i++) {
        int type = -1;
        for (int t = 0; t < QTYPE_COUNT; t++)
            if (qtype_get(t) && !strcmp(qtype_get(t)->name, types[i])) type = t;
        if (type < 0 || !qtype_get(type)->supported) {
            fprintf(stderr, "unknown or unsupported type %s\n", types[i]);
            continue;
        }
        bench_type(type, sections, nbs, n_nbs, isa_lo, isa_hi);
    }
    return 0;
}
