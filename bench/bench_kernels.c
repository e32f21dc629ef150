/* Micro-benchmark of kern_matmul: weight GB/s streamed over a ~140 MB matrix
 * (larger than any cache) at nb = 1 and nb = 8, for each weight type and each
 * ISA this CPU runs, single-threaded. Not a test.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/bench_kernels.c build/libellm.a -lm -lpthread
 *   ./a.out [type ...]      (types by name: q8_0 q4_0 q4_K q6_K f16 bf16 f32) */
#include "core/cpu.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { COLS = 4096, TARGET_BYTES = 140 << 20, REPS = 5 };

/* CPU time of this thread in ms: on a shared machine it tracks the kernel's
 * own work better than wall time does. */
static double thread_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random bytes with every block's f16 scale fields set to a small value. */
static void fill_weights(int type, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = next();
        memcpy(w + i, &v, 8);
    }
    const qtype_info *t = qtype_get(type);
    if (t->block_elems == 1) { /* floats: keep them finite, about +-1 */
        if (type == QTYPE_F32)
            for (size_t i = 0; i < bytes / 4; i++) ((float *)w)[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
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

static void bench_type(int type) {
    size_t rb = qtype_row_bytes(type, COLS);
    int64_t rows = TARGET_BYTES / (int64_t)rb;
    size_t bytes = rb * (size_t)rows;
    uint8_t *W = malloc(bytes);
    if (!W) return;
    fill_weights(type, W, bytes);
    int nbs[] = {1, 8};
    for (int isa = ELLM_ISA_SCALAR; isa <= (int)ellm_cpu()->best; isa++) {
        ellm_cpu_set_isa((ellm_isa)isa);
        for (int n = 0; n < 2; n++) {
            int nb = nbs[n];
            if (isa == ELLM_ISA_SCALAR && nb > 1) continue; /* too slow to be worth the wait */
            float *X = malloc(sizeof(float) * COLS * (size_t)nb);
            float *Y = malloc(sizeof(float) * (size_t)rows * (size_t)nb);
            void *act = malloc(kern_act_bytes(type, COLS, nb));
            for (int i = 0; i < COLS * nb; i++) X[i] = (float)(next() % 2001) / 1000.0f - 1.0f;
            kern_act_prepare(type, X, COLS, nb, act);
            int64_t r1 = isa == ELLM_ISA_SCALAR ? rows / 8 : rows; /* scalar: a slice */
            double best = 1e30, best_cpu = 1e30;
            for (int rep = 0; rep < REPS; rep++) {
                double t0 = ellm_time_ms(), c0 = thread_ms();
                kern_matmul(type, W, COLS, 0, r1, act, nb, Y, rows);
                double t = ellm_time_ms() - t0, c = thread_ms() - c0;
                if (t < best) best = t;
                if (c < best_cpu) best_cpu = c;
            }
            double gb = (double)rb * (double)r1 / 1e9;
            printf("%-5s %-7s nb=%-2d %8.2f ms  %6.2f GB/s of weights (%6.2f by thread cpu time)\n",
                   qtype_get(type)->name, ellm_isa_str((ellm_isa)isa), nb, best, gb / (best / 1e3),
                   gb / (best_cpu / 1e3));
            fflush(stdout);
            free(X);
            free(Y);
            free(act);
        }
    }
    free(W);
}

/* Plain read bandwidth for reference: sums the buffer as 64-bit words. */
static void bench_read(void) {
    size_t bytes = TARGET_BYTES;
    uint64_t *buf = malloc(bytes);
    if (!buf) return;
    memset(buf, 1, bytes);
    double best = 1e30;
    uint64_t s = 0;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = ellm_time_ms();
        for (size_t i = 0; i < bytes / 8; i += 4) s += buf[i] + buf[i + 1] + buf[i + 2] + buf[i + 3];
        double t = ellm_time_ms() - t0;
        if (t < best) best = t;
    }
    printf("read  scalar  sum    %8.2f ms  %6.2f GB/s (checksum %llu)\n", best, bytes / 1e9 / (best / 1e3),
           (unsigned long long)(s & 0xff));
    free(buf);
}

int main(int argc, char **argv) {
    const char *all[] = {"q8_0", "q4_0", "q4_K", "q6_K", "f16", "bf16", "f32"};
    int n = argc > 1 ? argc - 1 : (int)(sizeof all / sizeof all[0]);
    bench_read();
    for (int i = 0; i < n; i++) {
        const char *name = argc > 1 ? argv[i + 1] : all[i];
        int type = -1;
        for (int t = 0; t < QTYPE_COUNT; t++)
            if (qtype_get(t) && !strcmp(qtype_get(t)->name, name)) type = t;
        if (type < 0 || !qtype_get(type)->supported) {
            fprintf(stderr, "unknown or unsupported type %s\n", name);
            continue;
        }
        bench_type(type);
    }
    return 0;
}
