/* Weight pass of a SmolLM2-135M-shaped Q8_0 model (30 layers: Q/K/V, O, gate/up and down launches, then the
 * 49152-row output matrix) on a T-thread pool, rows split in 16-row units as the engine did (one contiguous range
 * per thread), against a stream read of the same bytes, alternating in one process. Not built by make:
 *   gcc -O2 -Iinclude -Isrc bench/results/gemv-20261204/weight_pass.c build/libellm.a -o weight_pass \
 *       -lm -lpthread -lmicrohttpd -lpcre2-8 -lcjson -lutf8proc -lhwloc -lnuma
 *   weight_pass THREADS REPS [VARIANTS]
 * VARIANTS > 1 loops kern_gemv_variant (a weak symbol here) over 0..VARIANTS-1; the prefetch variants of
 * bench/KV.md were a temporary global of that name in an experimental build of kernels_avx512.c. GEMV_FILE=path
 * takes the weights from a mapped file (GEMV_COPY=1: copied into anonymous huge pages). */
#include "core/membw.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdint.h>
__attribute__((weak)) int kern_gemv_variant;
typedef struct { const char *w[3]; int64_t rows[3]; int n; int64_t cols; const void *act; float *y; } job_t;
static void task(void *arg, int ith, int nth) {
    job_t *j = arg;
    int64_t total = 0;
    for (int i = 0; i < j->n; i++) total += j->rows[i];
    long b, e;
    threadpool_split((total + 15) / 16, ith, nth, 1, &b, &e);
    b *= 16; e *= 16; if (e > total) e = total;
    int64_t base = 0;
    for (int i = 0; i < j->n; i++) {
        int64_t r0 = b - base, r1 = e - base;
        if (r0 < 0) r0 = 0;
        if (r1 > j->rows[i]) r1 = j->rows[i];
        if (r0 < r1) kern_matmul(QTYPE_Q8_0, j->w[i], j->cols, r0, r1, j->act, 1, j->y + base, 1 << 20);
        base += j->rows[i];
    }
}
int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 10;
    int nvar = argc > 3 ? atoi(argv[3]) : 1;
    const int L = 30; const int64_t d = 576, kv = 192, ff = 1536, vocab = 49152;
    int64_t shapes[7][2] = {{d, d}, {kv, d}, {kv, d}, {d, d}, {ff, d}, {ff, d}, {d, ff}};
    size_t total = 0;
    for (int s = 0; s < 7; s++) total += qtype_row_bytes(QTYPE_Q8_0, shapes[s][1]) * shapes[s][0];
    total = total * L + qtype_row_bytes(QTYPE_Q8_0, d) * vocab;
    char *buf = NULL;
    posix_memalign((void **)&buf, 1 << 21, total + 4096);
    madvise(buf, total, MADV_HUGEPAGE);
    /* random int8 with small f16 scales (0x2000 ~ 0.0078) */
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < total; i += 8) { r ^= r << 13; r ^= r >> 7; r ^= r << 17; memcpy(buf + i, &r, 8); }
    for (size_t i = 0; i + 34 <= total; i += 34) { buf[i] = 0; buf[i + 1] = 0x20; }
    char *anon = buf;
    if (getenv("GEMV_FILE")) {
        int fd = open(getenv("GEMV_FILE"), O_RDONLY);
        size_t fsz = lseek(fd, 0, SEEK_END);
        char *m = mmap(NULL, fsz + (2 << 20), PROT_READ, MAP_PRIVATE, fd, 0);
        size_t off = (2 << 20) - ((uintptr_t)m & ((2 << 20) - 1));
        munmap(m, fsz + (2 << 20));
        (void)off;
        m = mmap(NULL, fsz, PROT_READ, MAP_PRIVATE, fd, 0);
        madvise(m, fsz, MADV_HUGEPAGE);
        if (fsz < total) return 2;
        buf = m + (fsz - total) / 34 * 34 * 0; /* from the file start */
        if (getenv("GEMV_COPY")) { memcpy(anon, m, total); buf = anon; }
        fprintf(stderr, "weights from %s%s\n", getenv("GEMV_FILE"), getenv("GEMV_COPY") ? " (copied)" : "");
    }
    char *w[L][7]; char *p = buf;
    for (int l = 0; l < L; l++) for (int s = 0; s < 7; s++) { w[l][s] = p; p += qtype_row_bytes(QTYPE_Q8_0, shapes[s][1]) * shapes[s][0]; }
    char *head = p;
    float *x = malloc(ff * 4), *y = malloc(vocab * 4 * 2);
    for (int i = 0; i < ff; i++) x[i] = (float)(i % 13) - 6;
    void *act_d = malloc(kern_act_bytes(QTYPE_Q8_0, ff, 1) * 2), *act_f = malloc(kern_act_bytes(QTYPE_Q8_0, ff, 1) * 2);
    threadpool *pool; ellm_error err;
    if (threadpool_init(nt, 1, &pool, &err)) return 1;
    char *rd = NULL; posix_memalign((void **)&rd, 1 << 21, total); madvise(rd, total, MADV_HUGEPAGE); memset(rd, 1, total);
    printf("weights %.1f MB, %d threads\n", total / 1e6, nt);
    for (int rep = 0; rep < reps; rep++) {
        double bw = membw_read_buffer_gbps(pool, rd, total & ~4095ul, 1);
        printf("rep %d stream %.2f GB/s", rep, bw);
        for (int v = 0; v < nvar; v++) {
            kern_gemv_variant = v;
            uint64_t t0 = ellm_time_ns();
            for (int l = 0; l < L; l++) {
                kern_act_prepare(QTYPE_Q8_0, x, d, 1, act_d);
                job_t q = {{w[l][0], w[l][1], w[l][2]}, {d, kv, kv}, 3, d, act_d, y};
                threadpool_run(pool, task, &q);
                kern_act_prepare(QTYPE_Q8_0, x, d, 1, act_d);
                job_t o = {{w[l][3]}, {d}, 1, d, act_d, y};
                threadpool_run(pool, task, &o);
                kern_act_prepare(QTYPE_Q8_0, x, d, 1, act_d);
                job_t gu = {{w[l][4], w[l][5]}, {ff, ff}, 2, d, act_d, y};
                threadpool_run(pool, task, &gu);
                kern_act_prepare(QTYPE_Q8_0, x, ff, 1, act_f);
                job_t dn = {{w[l][6]}, {d}, 1, ff, act_f, y};
                threadpool_run(pool, task, &dn);
            }
            kern_act_prepare(QTYPE_Q8_0, x, d, 1, act_d);
            job_t h = {{head}, {vocab}, 1, d, act_d, y};
            threadpool_run(pool, task, &h);
            double ms = (ellm_time_ns() - t0) / 1e6;
            printf("  v%d %.3f ms %.2f GB/s (%.0f%%)", v, ms, total / ms / 1e6, 100 * total / ms / 1e6 / bw);
        }
        printf("\n");
    }
    return 0;
}
