#include "kernels/kernels.h"
#include "kernels/kernels_impl.h"
#include "kernels/quant.h"
#include "core/cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
void kern_matmul_q8_r16_avx512(const void *W, int64_t cols, int64_t r0, int64_t r1, const void *act, int nb, float *Y, int64_t ldy);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void repack(const block_q8_0 *src, int64_t rows, int64_t cols, char *dst) {
    int64_t nblk = cols / 32;
    for (int64_t g = 0; g < rows / 16; g++) {
        for (int m = 0; m < 16; m++)
            for (int64_t k = m; k < nblk; k += 16) {
                uint16_t *d = (uint16_t *)dst;
                uint8_t *q = (uint8_t *)dst + 32;
                for (int i = 0; i < 16; i++) {
                    const block_q8_0 *b = src + (g * 16 + i) * nblk + k;
                    memcpy(&d[i], &b->d, 2);
                    for (int j = 0; j < 8; j++)
                        for (int t = 0; t < 4; t++) q[64 * j + 4 * i + t] = (uint8_t)(b->qs[4 * j + t] ^ 0x80);
                }
                dst += 544;
            }
    }
}
int main(int argc, char **argv) {
    int64_t rows = atoi(argv[1]), cols = atoi(argv[2]); int copies = atoi(argv[3]); int reps = getenv("REPS") ? atoi(getenv("REPS")) : 20; int only = getenv("NB") ? atoi(getenv("NB")) : 0;
    size_t wb = rows * cols / 32 * 34;
    float *x = malloc(sizeof(float) * rows * cols);
    char *W = malloc(wb * copies), *R = malloc(wb * copies);
    srand(1);
    for (int c = 0; c < copies; c++) {
        for (int64_t i = 0; i < rows * cols; i++) x[i] = (rand() / (float)RAND_MAX - 0.5f) * (1 + (i % 7));
        kern_quantize(QTYPE_Q8_0, x, W + c * wb, rows * cols);
        repack((block_q8_0 *)(W + c * wb), rows, cols, R + c * wb);
    }
    int nbs[] = {1, 2, 3, 4, 8, 9, 16};
    for (int ni = 0; ni < 7; ni++) {
        int nb = nbs[ni]; if (only && nb != only) continue;
        float *X = malloc(sizeof(float) * nb * cols);
        for (int64_t i = 0; i < nb * cols; i++) X[i] = (rand() / (float)RAND_MAX - 0.5f);
        void *act = malloc(kern_act_bytes(QTYPE_Q8_0, cols, nb));
        kern_act_prepare(QTYPE_Q8_0, X, cols, nb, act);
        float *Y1 = calloc(nb * rows, 4), *Y2 = calloc(nb * rows, 4);
        kern_matmul(QTYPE_Q8_0, W, cols, 0, rows, act, nb, Y1, rows);
        kern_matmul_q8_r16_avx512(R, cols, 0, rows, act, nb, Y2, rows);
        int bad = memcmp(Y1, Y2, 4 * nb * rows) != 0;
        static double ta[100000], tb[100000];
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            for (int c = 0; c < copies; c++) kern_matmul(QTYPE_Q8_0, W + c * wb, cols, 0, rows, act, nb, Y1, rows);
            double t1 = now();
            for (int c = 0; c < copies; c++) kern_matmul_q8_r16_avx512(R + c * wb, cols, 0, rows, act, nb, Y2, rows);
            double t2 = now();
            ta[r] = (t1 - t0) / copies; tb[r] = (t2 - t1) / copies;
        }
        int cmp(const void *a, const void *b) { double d = *(double *)a - *(double *)b; return d < 0 ? -1 : d > 0; }
        qsort(ta, reps, 8, cmp); qsort(tb, reps, 8, cmp);
        printf("%5lldx%-5lld nb %2d  old %8.1f us  r16 %8.1f us  x%.2f  %s\n", (long long)rows, (long long)cols, nb,
               ta[reps / 2] * 1e6, tb[reps / 2] * 1e6, ta[reps / 2] / tb[reps / 2], bad ? "MISMATCH" : "same bits");
    }
    return 0;
}
